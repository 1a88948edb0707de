"""Builds an MLPerf Training submission from compliant run logs, and checks it.

`build_package(out_dir, runs)` refuses runs that cannot make one submission
(mixed divisions or other submission fields, the wrong number of runs for the
benchmark, runs built from other source than the packaged implementation as
`tools.mlperf.provenance` rules, a log the compliance checker fails), then
writes the tree that `tools.mlperf.layout` describes, with the
implementation's `build_info.json`, and runs the official package checker,
the RCP checker (closed division) and the result summarizer on it.

The required number of runs comes from `mlperf_logging.benchmark_meta`, so it
follows the installed package.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any, Callable, Optional, Sequence

from mlperf_logging import benchmark_meta

from maxtext.mllog import rules
from maxtext.storage import build_info as build_info_lib
from tools.mlperf import checkers
from tools.mlperf import layout
from tools.mlperf import provenance
from tools.mlperf import run_logs
from tools.mlperf import system_desc


class PackageError(ValueError):
  """Runs that cannot be packaged; the message says why."""


def required_runs(benchmark: str) -> int:
  """How many result files the benchmark's submission needs.

  Raises:
    PackageError: `mlperf_logging` knows no such training benchmark.
  """
  counts = benchmark_meta.get_result_file_counts(checkers.USAGE)
  if benchmark not in counts:
    raise PackageError(
        f"benchmark {benchmark!r} is not an MLPerf training "
        f"benchmark; known: {sorted(counts)}"
    )
  return counts[benchmark]


def check_run_count(benchmark: str, count: int) -> None:
  """Raises PackageError unless `count` is the benchmark's required count."""
  needed = required_runs(benchmark)
  if count != needed:
    raise PackageError(
        f"wrong number of runs for {benchmark}: got {count}, the benchmark "
        f"needs exactly {needed} (mlperf_logging benchmark_meta)"
    )


# RunLog fields that every run of one submission shares, and their log keys.
_SHARED = (
    ("org", "submission_org"),
    ("system", "submission_platform"),
    ("benchmark", "submission_benchmark"),
    ("status", "submission_status"),
    ("ruleset", "mllog_ruleset"),
)


def check_consistent(runs: Sequence[run_logs.RunLog]) -> None:
  """Refuses runs that cannot be one benchmark's results of one system.

  Raises:
    PackageError: no runs, a run given twice, mixed divisions, differing
      org/system/benchmark/status/ruleset, an unknown ruleset or benchmark,
      or the wrong number of runs.
  """
  if not runs:
    raise PackageError("no runs to package")
  seen = set()
  for run in runs:
    if run.run_dir in seen:
      raise PackageError(f"run directory {run.run_dir!r} given twice")
    seen.add(run.run_dir)
  divisions = sorted({run.division for run in runs})
  if len(divisions) > 1:
    by_division = {
        d: [r.run_dir for r in runs if r.division == d] for d in divisions
    }
    raise PackageError(
        f"mixed divisions {divisions}: a submission's results "
        f"are all open or all closed; runs by division: "
        f"{by_division}"
    )
  for field, key in _SHARED:
    values = sorted({getattr(run, field) for run in runs})
    if len(values) > 1:
      raise PackageError(f"the runs differ in {key}: {values}")
  first = runs[0]
  if first.division not in rules.DIVISIONS:
    raise PackageError(
        f"submission_division={first.division!r}: must be one "
        f"of {list(rules.DIVISIONS)}"
    )
  for field in ("org", "system"):
    layout.check_name(field, getattr(first, field))
  if first.ruleset not in rules.rulesets():
    raise PackageError(
        f"mllog_ruleset={first.ruleset!r}: must be one of "
        f"{list(rules.rulesets())}"
    )
  check_run_count(first.benchmark, len(runs))


def check_compliance(
    runs: Sequence[run_logs.RunLog], log_dir: Optional[str] = None
) -> str:
  """Runs the compliance checker on every log; refuses if any fails.

  The checker runs in a temporary directory: a refusal writes nothing
  anywhere (the message holds the checker's complaints).

  Args:
    runs: the runs whose logs to check.
    log_dir: when every log passes, the checker's output is written to
      `<log_dir>/compliance_checker.log`; None writes nothing.

  Returns:
    The checker's output for every log.

  Raises:
    PackageError: naming each failing log and the checker's complaints.
  """
  failures, outputs = [], []
  with tempfile.TemporaryDirectory(prefix="compliance_checker_") as work_dir:
    for run in runs:
      result = checkers.compliance(run.log_path, run.ruleset, work_dir)
      outputs.append(f"== {run.log_path}\n{result.output}")
      if not result.ok:
        failures.append(f"{run.log_path}:\n{result.problems()}")
  if failures:
    raise PackageError(
        f"{len(failures)} of {len(runs)} logs fail the MLPerf compliance "
        f"checker:\n" + "\n".join(failures)
    )
  output = "\n".join(outputs)
  if log_dir is not None:
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, "compliance_checker.log")
    with open(path, "w", encoding="utf-8") as f:
      f.write(output)
  return output


@dataclasses.dataclass(frozen=True)
class PackageResult:
  """What `build_package` wrote and what the official tools said of it.

  Attributes:
    org_dir: the `<out>/<org>` directory (the package).
    system_json: the system description's path.
    result_files: the `result_<i>.txt` paths, in run order.
    implementation_dir: the copied sources.
    checker: the package checker's verdict.
    rcp: the RCP checker's verdict (closed division), else None.
    summary: the result summarizer's output.
    runs: the number of runs packaged.
    build_info_json: the implementation's build_info.json.
    provenance_warnings: the open division's provenance warnings, one line
      per run (see `tools.mlperf.provenance.check_runs`).
  """

  org_dir: str
  system_json: str
  result_files: tuple[str, ...]
  implementation_dir: str
  checker: checkers.ToolResult
  rcp: Optional[checkers.ToolResult]
  summary: checkers.Summary
  runs: int
  build_info_json: str = ""
  provenance_warnings: tuple[str, ...] = ()

  def last_line(self) -> str:
    """`mlperf_package: checker=<ok|failed> runs=<N> score=<minutes|n/a>`."""
    score = self.summary.score_minutes
    return (
        f"mlperf_package: checker={'ok' if self.checker.ok else 'failed'}"
        f" runs={self.runs} "
        f"score={'n/a' if score is None else f'{score:.4f}'}"
    )


def build_package(
    out_dir: str,
    runs: Sequence[run_logs.RunLog],
    *,
    implementation: str = layout.DEFAULT_IMPLEMENTATION,
    source_root: Optional[str] = None,
    emit: Callable[[str], None] = print,
    compliance_checked: bool = False,
    build: Optional[build_info_lib.BuildInfo] = None,
) -> PackageResult:
  """Writes the submission tree of `runs` under `out_dir` and checks it.

  Args:
    out_dir: the output directory; the package is `<out_dir>/<org>`, the
      tools' logs go to `<out_dir>/checker_logs`.
    runs: the runs, in result order.
    implementation: the implementation directory's name.
    source_root: where to copy the sources from (default
      `layout.source_root()`).
    emit: where progress lines go.
    compliance_checked: the logs already passed the compliance checker
      (the packager's --runs mode checks each right after its run).
    build: the build info of the sources copied from `source_root` (default
      `build_info.loaded()`, this packager's own), compared with each run's
      recorded revision and written to the implementation's build_info.json.

  Returns:
    The PackageResult; a failed package check is reported there, not raised.

  Raises:
    PackageError: the runs are refused (see `check_consistent`,
      `check_compliance`).
    provenance.ProvenanceError: the runs' recorded revisions are refused
      (see `provenance.check_runs`).
    FileExistsError: `out_dir` already holds this package (checked first:
      a refused packaging writes nothing into it).
  """
  build, warnings, compliance_output = _check_before_writing(
      out_dir, runs, implementation, build, compliance_checked, emit
  )
  written = _write_package(
      out_dir,
      runs,
      implementation,
      source_root,
      build,
      warnings,
      compliance_output,
      emit,
  )
  checker, rcp, summary = _check_package(out_dir, runs[0], emit)
  return PackageResult(
      **written,
      checker=checker,
      rcp=rcp,
      summary=summary,
      runs=len(runs),
      provenance_warnings=tuple(warnings),
  )


def checker_logs(out_dir: str) -> str:
  """The directory of the official tools' logs: `<out_dir>/checker_logs`
  (the package's checks, and each run's compliance check)."""
  return os.path.join(out_dir, "checker_logs")


def _check_before_writing(
    out_dir: str,
    runs: Sequence[run_logs.RunLog],
    implementation: str,
    build: Optional[build_info_lib.BuildInfo],
    compliance_checked: bool,
    emit: Callable[[str], None],
) -> tuple[build_info_lib.BuildInfo, list[str], Optional[str]]:
  """Everything `build_package` refuses, checked before anything is written.

  Returns:
    (the build info, this packager's own when `build` is None; the
    provenance warnings; the compliance checker's output, or None when
    `compliance_checked`).

  Raises:
    PackageError, provenance.ProvenanceError, FileExistsError: as
      `build_package`.
  """
  check_consistent(runs)
  layout.check_name("implementation", implementation)
  first = runs[0]
  # Refused before anything is written: an existing package stays as it is.
  layout.check_no_results(out_dir, first.org, first.system, first.benchmark)
  if build is None:
    build = build_info_lib.loaded()
  warnings, compliance_output = _check_runs(
      runs, build, compliance_checked, emit
  )
  return build, warnings, compliance_output


def _write_package(
    out_dir: str,
    runs: Sequence[run_logs.RunLog],
    implementation: str,
    source_root: Optional[str],
    build: build_info_lib.BuildInfo,
    warnings: Sequence[str],
    compliance_output: Optional[str],
    emit: Callable[[str], None],
) -> dict[str, Any]:
  """Writes the submission tree of `runs` (see `build_package`).

  Returns:
    PackageResult's fields of what was written: org_dir, system_json,
    result_files, implementation_dir, build_info_json.
  """
  first = runs[0]
  org, system, benchmark = first.org, first.system, first.benchmark
  results = layout.write_results(
      out_dir, org, system, benchmark, [run.log_path for run in runs]
  )
  if compliance_output is not None:
    _write_log(
        checker_logs(out_dir), "compliance_checker.log", compliance_output
    )
  system_json, desc = _write_system_json(out_dir, first)
  impl_dir = layout.implementation_dir(out_dir, org, benchmark, implementation)
  copied, build_info_json = _write_implementation(
      impl_dir, source_root, build, runs, warnings, emit
  )
  org_dir = layout.org_dir(out_dir, org)
  emit(
      f"mlperf_package: wrote {org_dir} "
      f"({len(results)} results; sources: {', '.join(copied)})"
  )
  _report_manual_fields(system_json, desc, emit)
  return dict(
      org_dir=org_dir,
      system_json=system_json,
      result_files=tuple(results),
      implementation_dir=impl_dir,
      build_info_json=build_info_json,
  )


def _check_runs(
    runs: Sequence[run_logs.RunLog],
    build: build_info_lib.BuildInfo,
    compliance_checked: bool,
    emit: Callable[[str], None],
) -> tuple[list[str], Optional[str]]:
  """The runs' provenance and compliance checks, before anything is written.

  Returns:
    (provenance warnings, each also emitted; the compliance checker's
    output, or None when `compliance_checked`).

  Raises:
    provenance.ProvenanceError, PackageError: as `build_package`.
  """
  warnings = provenance.check_runs(runs, build)
  for warning in warnings:
    emit(f"mlperf_package: WARNING: {warning}")
  if compliance_checked:
    return warnings, None
  emit(f"mlperf_package: compliance checker on {len(runs)} logs")
  return warnings, check_compliance(runs)


def _write_implementation(
    impl_dir: str,
    source_root: Optional[str],
    build: build_info_lib.BuildInfo,
    runs: Sequence[run_logs.RunLog],
    warnings: Sequence[str],
    emit: Callable[[str], None],
) -> tuple[Sequence[str], str]:
  """Copies the sources into `impl_dir` with their build_info.json.

  Returns:
    (what was copied, the build_info.json's path).
  """
  copied = layout.copy_implementation(impl_dir, source_root)
  build_info_json = provenance.write_build_info(impl_dir, build, runs, warnings)
  emit(
      f"mlperf_package: implementation revision {build.git_revision} "
      f"({build.source}; {build_info_json})"
  )
  return copied, build_info_json


def _write_log(work_dir: str, name: str, text: str) -> None:
  """Writes a checker's output to `<work_dir>/<name>`."""
  os.makedirs(work_dir, exist_ok=True)
  with open(os.path.join(work_dir, name), "w", encoding="utf-8") as f:
    f.write(text)


def _report_manual_fields(
    system_json: str, desc: dict[str, Any], emit: Callable[[str], None]
) -> None:
  """Names the system description's fields left for a person to fill in."""
  empty = [f for f in system_desc.MANUAL_FIELDS if not desc[f]]
  if empty:
    emit(
        f"mlperf_package: fill in by hand in {system_json}: "
        f"{', '.join(empty)}"
    )


def _write_system_json(
    out_dir: str, first: run_logs.RunLog
) -> tuple[str, dict[str, Any]]:
  """Writes the system description of `first`'s system and host.

  Returns:
    (the system JSON's path, its contents).
  """
  desc = system_desc.describe(
      org=first.org,
      system=first.system,
      division=first.division,
      log_status=first.status,
      provenance=first.provenance,
      host=system_desc.detect_host(),
      accelerator_memory_bytes=system_desc.live_accelerator_memory(
          first.provenance.get("devices")
      ),
  )
  system_json = layout.system_json(out_dir, first.org, first.system)
  layout.write_system_json(system_json, desc)
  return system_json, desc


def _check_package(
    out_dir: str,
    first: run_logs.RunLog,
    emit: Callable[[str], None],
) -> tuple[
    checkers.ToolResult, Optional[checkers.ToolResult], checkers.Summary
]:
  """Runs MLPerf's checkers on the written package and reports each.

  The package checker, the RCP checker (closed division only) and the
  result summarizer, their logs in `<out_dir>/checker_logs`.

  Returns:
    (package checker, RCP checker or None, summary); a failure is reported
    through `emit`, not raised.
  """
  org, benchmark = first.org, first.benchmark
  work_dir = checker_logs(out_dir)
  org_dir = layout.org_dir(out_dir, org)
  checker = checkers.package_checker(org_dir, first.ruleset, work_dir)
  emit(
      f"mlperf_package: package checker "
      f"{'found no errors' if checker.ok else 'FAILED'}"
      f" (log: {os.path.join(work_dir, 'package_checker.log')})"
  )
  if not checker.ok:
    emit(checker.problems())
  rcp = None
  if first.division == "closed":
    rcp = checkers.rcp_checker(
        layout.results_dir(out_dir, org, first.system, benchmark),
        first.ruleset,
        work_dir,
    )
    emit(f"mlperf_package: RCP checker {'passed' if rcp.ok else 'FAILED'}")
    if not rcp.ok:
      emit(rcp.problems())
  summary = checkers.summarize(org_dir, first.ruleset, benchmark, work_dir)
  if summary.score_minutes is not None:
    emit(
        f"mlperf_package: result summarizer score for {benchmark}: "
        f"{summary.score_minutes:.4f} minutes"
    )
  else:
    emit(
        f"mlperf_package: the result summarizer gave no score for "
        f"{benchmark}:\n{summary.tool.problems()}"
    )
  return checker, rcp, summary
