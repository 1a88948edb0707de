"""Which source a submission's implementation and its runs were built from.

A submission's implementation directory holds the packager's own sources
(`tools.mlperf.layout`), and each result is the log of a run that recorded
the revision of the binary that trained it (config.json's provenance,
`maxtext.storage.build_info`; the MLPerf log names it too, in the metadata of
its `submission_platform` event). The two must be the same source:

- Runs recorded under different revisions are refused in both divisions:
  one submission's results come from one implementation.
- A run whose revision is not the packager's, or is "unknown", or names a
  modified tree ("+dirty": the commit does not name the code), or whose MLPerf
  log names another revision than its config.json: a refusal in the closed
  division, a warning in the open one. Each is one line naming the run
  directory and both revisions.

`write_build_info` records the packager's build info in the implementation
directory as `build_info.json` (`BUILD_INFO_FILE`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

from maxtext.storage import build_info
from tools.mlperf import run_logs

BUILD_INFO_FILE = "build_info.json"
_DIRTY = "+dirty"
# The division whose rules ask that a result be reproducible from the
# submitted implementation; the open division only warns.
_STRICT_DIVISION = "closed"


class ProvenanceError(ValueError):
  """Runs whose recorded source cannot be packaged; the message says why."""


def split_revision(revision: str) -> tuple[str, Optional[bool]]:
  """A revision as (commit, modified).

  Args:
    revision: "<40 hex>", "<40 hex>+dirty" or "unknown".

  Returns:
    ("<40 hex>", False), ("<40 hex>", True) or ("unknown", None).
  """
  if revision == build_info.UNKNOWN:
    return build_info.UNKNOWN, None
  if revision.endswith(_DIRTY):
    return revision[: -len(_DIRTY)], True
  return revision, False


def _problem(run: run_logs.RunLog, implementation: str) -> Optional[str]:
  """Why `run` does not name the implementation's source, or None."""
  recorded = run.git_revision
  both = (
      f"{run.run_dir}: the run recorded git_revision {recorded!r}, the "
      f"packaged implementation is {implementation!r}"
  )
  if run.log_revision is not None and run.log_revision != recorded:
    return (
        f"{run.run_dir}: its MLPerf log names git_revision "
        f"{run.log_revision!r} but its config.json records {recorded!r} "
        f"(the packaged implementation is {implementation!r})"
    )
  if build_info.UNKNOWN in (recorded, implementation):
    return f"{both}: the revision is unknown"
  if recorded != implementation:
    return f"{both}: a different revision"
  if recorded.endswith(_DIRTY):
    return (
        f"{both}: built from a modified tree (+dirty), which the commit "
        f"does not name"
    )
  return None


def check_runs(
    runs: Sequence[run_logs.RunLog], build: build_info.BuildInfo
) -> list[str]:
  """Compares the runs' recorded revisions with the packager's own.

  Args:
    runs: the runs to package, all of one division (`submission.
      check_consistent` refuses mixed ones first).
    build: the packager's build info: the source it copies into the
      implementation directory.

  Returns:
    The warnings for the open division, one line per run (empty when every
    run names the implementation's clean revision).

  Raises:
    ProvenanceError: the runs recorded different revisions (any division);
      in the closed division, any run with a problem (one line per run
      naming its directory and both revisions).
    TypeError: `build` is not a BuildInfo.
  """
  if not isinstance(build, build_info.BuildInfo):
    raise TypeError(
        f"build must be a build_info.BuildInfo, got {type(build).__name__}"
    )
  by_revision: dict[str, list[str]] = {}
  for run in runs:
    by_revision.setdefault(run.git_revision, []).append(run.run_dir)
  if len(by_revision) > 1:
    raise ProvenanceError(
        f"the runs were built from {len(by_revision)} different revisions; "
        f"a submission's results come from one implementation:\n  "
        + "\n  ".join(
            f"{revision}: {', '.join(dirs)}"
            for revision, dirs in sorted(by_revision.items())
        )
    )
  problems = [
      p for p in (_problem(run, build.git_revision) for run in runs) if p
  ]
  if problems and runs and runs[0].division == _STRICT_DIVISION:
    raise ProvenanceError(
        f"closed division: {len(problems)} of {len(runs)} runs do not name "
        f"the packaged implementation's clean revision (the open division "
        f"only warns):\n  " + "\n  ".join(problems)
    )
  return problems


def build_info_document(
    build: build_info.BuildInfo,
    runs: Sequence[run_logs.RunLog],
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
  """What `write_build_info` writes (see the module docstring)."""
  commit, modified = split_revision(build.git_revision)
  revisions = sorted({run.git_revision for run in runs})
  return {
      "git_revision": build.git_revision,
      "commit": commit,
      "modified": modified,
      "git_revision_source": build.source,
      "build_time_utc": build.build_time_utc,
      "runs_git_revision": revisions[0] if len(revisions) == 1 else None,
      "warnings": list(warnings),
  }


def write_build_info(
    implementation_dir: str,
    build: build_info.BuildInfo,
    runs: Sequence[run_logs.RunLog],
    warnings: Sequence[str] = (),
) -> str:
  """Writes `<implementation_dir>/build_info.json`.

  Its keys: git_revision ("<40 hex>[+dirty]" or "unknown"), commit ("<40
  hex>" or "unknown"), modified (true, false, or null when unknown),
  git_revision_source ("stamped", "git" or "unknown"), build_time_utc (the
  stamped build's time, else null), runs_git_revision (the revision the runs
  recorded), warnings.

  Args:
    implementation_dir: the submission's implementation directory (exists).
    build: the packager's build info (the copied sources' revision).
    runs: the packaged runs (their shared recorded revision is written).
    warnings: `check_runs`' warnings, kept beside the sources they concern.

  Returns:
    The file's path.
  """
  path = os.path.join(implementation_dir, BUILD_INFO_FILE)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(build_info_document(build, runs, warnings), f, indent=2)
    f.write("\n")
  return path
