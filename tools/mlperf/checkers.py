"""The official `mlperf_logging` tools, each run as it is in a subprocess.

The compliance checker, package checker, RCP checker and result summarizer
configure the root logger and keep module-level state, so each runs in a fresh
interpreter (`python -m mlperf_logging.<tool>`, this process's interpreter
and import path), with its working directory and log files under `work_dir`.
Their verdicts are read the way the tools state them: the package checker
succeeds only on its "FOUND NO ERRORS" line (it exits 0 either way), the
compliance checker on "SUCCESS", and the score is the summarizer's own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Optional, Sequence

USAGE = "training"
PACKAGE_OK_LINE = "PACKAGE CHECKER FOUND NO ERRORS"
_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class ToolResult:
  """One tool's verdict.

  Attributes:
    ok: the tool's own success criterion held.
    returncode: its exit status.
    output: its stdout, stderr and log file, in that order.
  """

  ok: bool
  returncode: int
  output: str

  def problems(self, limit: int = 20) -> str:
    """The output's WARNING/ERROR lines (at most `limit`), for a message."""
    lines = [
        line.strip()
        for line in self.output.splitlines()
        if line.startswith(("WARNING", "ERROR", "CRITICAL"))
        or "failed" in line.lower()
    ]
    return "\n".join(lines[:limit]) or self.output.strip()[-2000:]


def _run(
    module: str, args: Sequence[str], work_dir: str, log_name: Optional[str]
) -> tuple[int, str]:
  """Runs `python -m <module> <args>` in `work_dir`; returns (status, text)."""
  os.makedirs(work_dir, exist_ok=True)
  log_args = []
  log_path = None
  if log_name:
    log_path = os.path.join(work_dir, log_name)
    if os.path.exists(log_path):
      os.remove(log_path)  # The tools append to an existing log.
    log_args = ["--log_output", log_path]
  proc = subprocess.run(
      [sys.executable, "-m", module, *args, *log_args],
      cwd=work_dir,
      capture_output=True,
      text=True,
      timeout=_TIMEOUT_S,
      check=False,
  )
  text = proc.stdout + proc.stderr
  if log_path and os.path.exists(log_path):
    with open(log_path, encoding="utf-8", errors="replace") as f:
      text += f.read()
  return proc.returncode, text


def compliance(log_path: str, ruleset: str, work_dir: str) -> ToolResult:
  """The compliance checker's verdict on one MLPerf log.

  Args:
    log_path: the `:::MLLOG` file.
    ruleset: e.g. "6.1.0".
    work_dir: where the checker runs and writes its log.
  """
  status, text = _run(
      "mlperf_logging.compliance_checker",
      ["--usage", USAGE, "--ruleset", ruleset, os.path.abspath(log_path)],
      work_dir,
      "compliance_checker.log",
  )
  return ToolResult(
      ok=status == 0 and "SUCCESS" in text, returncode=status, output=text
  )


def package_checker(org_dir: str, ruleset: str, work_dir: str) -> ToolResult:
  """The package checker's verdict on an organization's submission tree.

  Args:
    org_dir: the `<org>` directory holding systems/, results/, benchmarks/.
    ruleset: e.g. "6.1.0".
    work_dir: where the checker runs and writes its log.
  """
  status, text = _run(
      "mlperf_logging.package_checker",
      [os.path.abspath(org_dir), USAGE, ruleset],
      work_dir,
      "package_checker.log",
  )
  # The checker exits 0 whether or not it found errors: its line decides.
  return ToolResult(ok=PACKAGE_OK_LINE in text, returncode=status, output=text)


def rcp_checker(benchmark_dir: str, ruleset: str, work_dir: str) -> ToolResult:
  """The reference convergence point checker on one benchmark's results.

  Args:
    benchmark_dir: `<org>/results/<system>/<benchmark>`.
    ruleset: e.g. "6.1.0".
    work_dir: where the checker runs and writes its log.
  """
  status, text = _run(
      "mlperf_logging.rcp_checker",
      [
          os.path.abspath(benchmark_dir),
          "--rcp_usage",
          USAGE,
          "--rcp_version",
          ruleset,
      ],
      work_dir,
      "rcp_checker.log",
  )
  return ToolResult(
      ok=status == 0 and "RCP test PASSED" in text,
      returncode=status,
      output=text,
  )


@dataclasses.dataclass(frozen=True)
class Summary:
  """The result summarizer's output for one benchmark of one system.

  Attributes:
    tool: the summarizer's run (ok when it wrote its summary).
    score_minutes: the benchmark's time to train in minutes, or None when
      the summarizer gave no score (too few converged runs, no row).
    rows: the summarizer's strong-scaling rows (summary.json).
  """

  tool: ToolResult
  score_minutes: Optional[float]
  rows: list


def summarize(
    org_dir: str, ruleset: str, benchmark: str, work_dir: str
) -> Summary:
  """Runs the result summarizer on an organization's tree; reads its score.

  The summarizer writes its table as `<csv stem>.json` beside the --csv path;
  the score is the `benchmark` column of the first row that has one.

  Args:
    org_dir: the `<org>` directory.
    ruleset: e.g. "6.1.0".
    benchmark: the benchmark whose score to read.
    work_dir: where the summarizer runs and writes summary.csv/.json.
  """
  csv_path = os.path.join(os.path.abspath(work_dir), "summary.csv")
  json_path = os.path.join(os.path.abspath(work_dir), "summary.json")
  if os.path.exists(json_path):
    os.remove(json_path)
  status, text = _run(
      "mlperf_logging.result_summarizer",
      [os.path.abspath(org_dir), USAGE, ruleset, "--csv", csv_path],
      work_dir,
      None,
  )
  rows = []
  if os.path.exists(json_path):
    with open(json_path, encoding="utf-8") as f:
      rows = json.load(f)
  score = None
  for row in rows:
    value = row.get(benchmark)
    if isinstance(value, (int, float)):
      score = float(value)
      break
  ok = status == 0 and os.path.exists(json_path)
  return Summary(
      tool=ToolResult(ok=ok, returncode=status, output=text),
      score_minutes=score,
      rows=rows,
  )
