"""MLPerf Training submission rules, as the installed `mlperf_logging` has them.

One place for what a submission may say: the divisions and statuses
(`mlperf_logging.mllog.constants`), the rulesets (those this engine writes
events for that the installed compliance checker also has) and the benchmarks
of each ruleset (`mlperf_logging.benchmark_meta`, kept to those the checker
has rule files for). Nothing here is a hand-kept copy of the package's lists,
so upgrading `mlperf_logging` updates every check at once.

`validate_submission` checks a config's submission fields against these rules
before a run starts: the official checker crashes on an unknown division or
benchmark instead of reporting it.
"""

import functools
import os
from typing import Any

from mlperf_logging import benchmark_meta
from mlperf_logging.mllog import constants as mllog_constants

# Rulesets whose event sequence and disclosure keys `maxtext.mllog.logger`
# writes. This is a fact about our logger, not about the package: a ruleset is
# usable only if it is also installed (see `rulesets`).
SUPPORTED_RULESETS = ("6.0.0", "6.1.0")

DIVISIONS = (mllog_constants.CLOSED, mllog_constants.OPEN)
STATUSES = (mllog_constants.ONPREM, mllog_constants.CLOUD,
            mllog_constants.RESEARCH)

# `benchmark_meta` groups benchmarks by usage; MLPerf Training is one usage.
_USAGE = "training"


def checker_dir() -> str:
  """The installed compliance checker's directory of rule files."""
  return os.path.join(
      os.path.dirname(os.path.dirname(mllog_constants.__file__)),
      "compliance_checker")


def ruleset_dir(ruleset: str) -> str:
  """The checker's directory of one training ruleset's YAML rules."""
  return os.path.join(checker_dir(), f"{_USAGE}_{ruleset}")


def _known_to_benchmark_meta(ruleset: str) -> bool:
  try:
    benchmark_meta.get_allowed_benchmarks(_USAGE, ruleset)
  except ValueError:
    return False
  return True


@functools.cache
def rulesets() -> tuple[str, ...]:
  """`SUPPORTED_RULESETS` that the installed package has, in that order."""
  return tuple(r for r in SUPPORTED_RULESETS
               if os.path.isdir(ruleset_dir(r)) and _known_to_benchmark_meta(r))


@functools.cache
def benchmarks(ruleset: str) -> tuple[str, ...]:
  """Benchmarks that `ruleset` allows and the checker has rules for.

  Args:
    ruleset: one of `rulesets()`.

  Returns:
    The names from `benchmark_meta`, in its order, that have a rule file for
    every division (the checker loads `<division>_<benchmark>.yaml`).

  Raises:
    ValueError: `ruleset` is not one of `rulesets()`.
  """
  if ruleset not in rulesets():
    raise ValueError(f"mllog ruleset must be one of {list(rulesets())}, got "
                     f"{ruleset!r}")
  directory = ruleset_dir(ruleset)
  return tuple(
      name for name in benchmark_meta.get_allowed_benchmarks(_USAGE, ruleset)
      if all(os.path.isfile(os.path.join(directory, f"{d}_{name}.yaml"))
             for d in DIVISIONS))


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"config.{key}={value!r}: must be one of {list(allowed)}")


def validate_submission(config: Any) -> None:
  """Checks the fields an MLPerf log takes its submission info from.

  Args:
    config: a ConfigDict or dict with `mllog_ruleset`, `submission_org`,
      `submission_platform`, `submission_division`, `submission_status` and
      `submission_benchmark`; other fields are not read.

  Raises:
    TypeError: the org or platform is not a str.
    ValueError: a value the official compliance checker would reject (or
      crash on); the message names the field and the value.
  """
  ruleset = config["mllog_ruleset"]
  _one_of("mllog_ruleset", ruleset, rulesets())
  for key in ("submission_org", "submission_platform"):
    value = config[key]
    if not isinstance(value, str):
      raise TypeError(f"config.{key}={value!r}: expected str, got "
                      f"{type(value).__name__}")
    if not value.strip():
      raise ValueError(f"config.{key}={value!r}: must not be empty (the "
                       f"checker requires it)")
  _one_of("submission_division", config["submission_division"], DIVISIONS)
  _one_of("submission_status", config["submission_status"], STATUSES)
  _one_of("submission_benchmark", config["submission_benchmark"],
          benchmarks(ruleset))
