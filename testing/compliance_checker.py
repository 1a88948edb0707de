"""Runs the official MLPerf compliance checker on a log file, in a subprocess.

The checker (`python -m mlperf_logging.compliance_checker`) keeps module-level
state between files and configures the root logger, so each check runs in a
fresh interpreter (`sys.executable`, the one running the test) with its
working directory and `--log_output` in a temporary directory.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile

# The checker separates its messages with a line of 30 dashes.
_SEPARATOR = "-" * 30
# Each line the checker's logging writes to --log_output starts "LEVEL - ".
_RECORD_START = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) - ", re.M)
_QUOTED_KEY = re.compile(r"'([A-Za-z0-9_]+)'")


@dataclasses.dataclass(frozen=True)
class CheckResult:
  """The checker's verdict on one log.

  Attributes:
    returncode: the checker's exit status (0 when the log passes).
    passed: True when the checker reported SUCCESS and exited 0.
    messages: each failure or warning message the checker printed, in order.
    output: the checker's whole output (stdout, then stderr).
  """

  returncode: int
  passed: bool
  messages: tuple[str, ...]
  output: str

  def failed_keys(self) -> set[str]:
    """Log keys named on the first line of each message.

    The first line names the key the message concerns, e.g. "CHECK for
    'run_stop' failed in line 12:" or "Required EXACTLY_ONE occurrence of
    'run_stop' but found 0".
    """
    keys = set()
    for message in self.messages:
      first_line = message.strip().splitlines()[0] if message.strip() else ""
      keys.update(_QUOTED_KEY.findall(first_line))
    return keys


def _parse_messages(log_text: str) -> tuple[str, ...]:
  """Splits the checker's WARNING records into single messages."""
  starts = list(_RECORD_START.finditer(log_text))
  messages = []
  for i, match in enumerate(starts):
    end = starts[i + 1].start() if i + 1 < len(starts) else len(log_text)
    if match.group(1) != "WARNING":
      continue
    body = log_text[match.end() : end]
    for chunk in body.split(_SEPARATOR):
      if chunk.strip():
        messages.append(chunk.strip())
  return tuple(messages)


def run_checker(
    log_path: str,
    *,
    ruleset: str = "6.1.0",
    usage: str = "training",
    timeout_s: float = 120.0,
) -> CheckResult:
  """Runs the official compliance checker on `log_path`.

  Args:
    log_path: the `:::MLLOG` log file to check.
    ruleset: the ruleset version, e.g. "6.1.0" or "6.0.0".
    usage: the checker's `--usage` (MLPerf working group).
    timeout_s: the most seconds the checker may run.

  Returns:
    The checker's `CheckResult`.

  Raises:
    FileNotFoundError: `log_path` does not exist.
    subprocess.TimeoutExpired: the checker ran past `timeout_s`.
  """
  if not os.path.isfile(log_path):
    raise FileNotFoundError(f"log_path {log_path!r} is not a file")
  with tempfile.TemporaryDirectory(prefix="compliance_checker_") as tmp:
    checker_log = os.path.join(tmp, "checker.log")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlperf_logging.compliance_checker",
            "--usage",
            usage,
            "--ruleset",
            ruleset,
            "--log_output",
            checker_log,
            os.path.abspath(log_path),
        ],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    log_text = ""
    if os.path.exists(checker_log):
      with open(checker_log, encoding="utf-8", errors="replace") as f:
        log_text = f.read()
  output = proc.stdout + proc.stderr
  passed = proc.returncode == 0 and "SUCCESS" in log_text
  return CheckResult(
      returncode=proc.returncode,
      passed=passed,
      messages=_parse_messages(log_text),
      output=output,
  )
