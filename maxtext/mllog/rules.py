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

`check_reference_hyperparameters` is the closed division's pre-flight against
the benchmark's reference convergence points (RCPs), read from the installed
RCP checker's data: the global batch size must lie within the reference batch
sizes (the RCP checker interpolates convergence between them), and at a
reference batch size the learning rate and warm-up must be the reference's.
"""

import dataclasses
import functools
import json
import math
import os
from typing import Any, Mapping

from absl import logging
from mlperf_logging import benchmark_meta
from mlperf_logging import rcp_checker
from mlperf_logging.mllog import constants as mllog_constants

from maxtext.mllog import mlperf_config

# Rulesets whose event sequence and disclosure keys `maxtext.mllog.logger`
# writes. This is a fact about our logger, not about the package: a ruleset is
# usable only if it is also installed (see `rulesets`).
SUPPORTED_RULESETS = ("6.0.0", "6.1.0")

DIVISIONS = (mllog_constants.CLOSED, mllog_constants.OPEN)
STATUSES = (
    mllog_constants.ONPREM,
    mllog_constants.CLOUD,
    mllog_constants.RESEARCH,
)

# `benchmark_meta` groups benchmarks by usage; MLPerf Training is one usage.
_USAGE = "training"


def checker_dir() -> str:
  """The installed compliance checker's directory of rule files."""
  return os.path.join(
      os.path.dirname(os.path.dirname(mllog_constants.__file__)),
      "compliance_checker",
  )


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
  return tuple(
      r
      for r in SUPPORTED_RULESETS
      if os.path.isdir(ruleset_dir(r)) and _known_to_benchmark_meta(r)
  )


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
    raise ValueError(
        f"mllog ruleset must be one of {list(rulesets())}, got {ruleset!r}"
    )
  directory = ruleset_dir(ruleset)
  return tuple(
      name
      for name in benchmark_meta.get_allowed_benchmarks(_USAGE, ruleset)
      if all(
          os.path.isfile(os.path.join(directory, f"{d}_{name}.yaml"))
          for d in DIVISIONS
      )
  )


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"config.{key}={value!r}: must be one of {list(allowed)}")


def validate_submission(mlperf: mlperf_config.MlperfConfig) -> None:
  """Checks the fields an MLPerf log takes its submission info from.

  Args:
    mlperf: the log's settings; read: `mllog_ruleset`, `submission_org`,
      `submission_platform`, `submission_division`, `submission_status` and
      `submission_benchmark`.

  Raises:
    TypeError: the org or platform is not a str.
    ValueError: a value the official compliance checker would reject (or
      crash on); the message names the field and the value.
  """
  ruleset = mlperf.mllog_ruleset
  _one_of("mllog_ruleset", ruleset, rulesets())
  for key, value in (
      ("submission_org", mlperf.submission_org),
      ("submission_platform", mlperf.submission_platform),
  ):
    if not isinstance(value, str):
      raise TypeError(
          f"config.{key}={value!r}: expected str, got "
          f"{type(value).__name__}"
      )
    if not value.strip():
      raise ValueError(
          f"config.{key}={value!r}: must not be empty (the "
          f"checker requires it)"
      )
  _one_of("submission_division", mlperf.submission_division, DIVISIONS)
  _one_of("submission_status", mlperf.submission_status, STATUSES)
  _one_of(
      "submission_benchmark",
      mlperf.submission_benchmark,
      benchmarks(ruleset),
  )


# --- Reference convergence points (the closed division's pre-flight) --------


@dataclasses.dataclass(frozen=True)
class ReferencePoint:
  """One reference convergence point of a benchmark, as the RCP data has it.

  Attributes:
    name: the record's name in the RCP file, e.g. "llama31_8b_ref_32".
    batch_size: its global batch size ("BS").
    hyperparameters: its "Hyperparams", keyed by MLPerf log key.
  """

  name: str
  batch_size: int
  hyperparameters: Mapping[str, Any]


def rcp_file(ruleset: str, benchmark: str) -> str:
  """The installed RCP checker's data file for a training benchmark."""
  return os.path.join(
      os.path.dirname(rcp_checker.__file__),
      f"{_USAGE}_{ruleset}",
      f"rcps_{benchmark}.json",
  )


@functools.cache
def reference_points(
    ruleset: str, benchmark: str
) -> tuple[ReferencePoint, ...]:
  """The benchmark's reference points, smallest batch first.

  Args:
    ruleset: a training ruleset, e.g. "6.1.0".
    benchmark: a benchmark of that ruleset, e.g. "llama31_8b".

  Raises:
    FileNotFoundError: the installed package has no RCP data for them.
  """
  with open(rcp_file(ruleset, benchmark), encoding="utf-8") as f:
    records = json.load(f)
  points = [
      ReferencePoint(
          name, int(record["BS"]), dict(record.get("Hyperparams", {}))
      )
      for name, record in records.items()
  ]
  return tuple(sorted(points, key=lambda p: p.batch_size))


def _reference_mismatches(
    mlperf: mlperf_config.MlperfConfig, point: ReferencePoint, where: str
) -> list[str]:
  """The learning rate and warm-up of `mlperf` that differ from `point`'s."""
  batch = mlperf.global_batch_size
  learning_rate = mlperf.optimizer.learning_rate
  stated = point.hyperparameters
  problems = []
  if "opt_base_learning_rate" in stated:
    reference = float(stated["opt_base_learning_rate"])
    if not math.isclose(learning_rate, reference, rel_tol=1e-6):
      problems.append(
          f"config.learning_rate={learning_rate!r} differs from the "
          f"reference opt_base_learning_rate={reference!r} at "
          f"global_batch_size={batch} ({where})"
      )
  warmup = mlperf.optimizer.warmup_steps
  if "opt_learning_rate_warmup_samples" in stated:
    reference = int(stated["opt_learning_rate_warmup_samples"])
    # Warm-up is whole steps: a reference that is not a multiple of the batch
    # is met by the whole number of steps either side of it.
    if abs(warmup * batch - reference) >= batch:
      problems.append(
          f"config.warmup_steps={warmup} is {warmup * batch} warm-up samples "
          f"at global_batch_size={batch}; the reference "
          f"opt_learning_rate_warmup_samples is {reference} "
          f"(warmup_steps={reference / batch:g}) ({where})"
      )
  if "opt_learning_rate_warmup_steps" in stated:
    reference = int(stated["opt_learning_rate_warmup_steps"])
    if warmup != reference:
      problems.append(
          f"config.warmup_steps={warmup} differs from the reference "
          f"opt_learning_rate_warmup_steps={reference} at "
          f"global_batch_size={batch} ({where})"
      )
  return problems


def reference_mismatches(mlperf: mlperf_config.MlperfConfig) -> list[str]:
  """How a config departs from its benchmark's reference convergence points.

  Gradient accumulation is not compared: the closed rules only require it to
  be positive. Between two reference batch sizes the RCP data states no
  hyperparameters (the RCP checker interpolates only the convergence), so only
  the batch range is checked there.

  Args:
    mlperf: the log's settings; read: `mllog_ruleset`,
      `submission_benchmark`, `global_batch_size`, and the optimizer's
      `learning_rate` and `warmup_steps`.

  Returns:
    One message per mismatch, each naming the config field, its value, the
    reference value and the RCP file; empty when the config agrees.
  """
  ruleset = mlperf.mllog_ruleset
  benchmark = mlperf.submission_benchmark
  path = rcp_file(ruleset, benchmark)
  try:
    points = reference_points(ruleset, benchmark)
  except FileNotFoundError:
    return [
        f"the installed mlperf_logging has no reference convergence "
        f"points for {benchmark} in ruleset {ruleset} ({path} is "
        f"missing), so the RCP checker cannot judge the run"
    ]
  batch = mlperf.global_batch_size
  low, high = points[0].batch_size, points[-1].batch_size
  if not low <= batch <= high:
    return [
        f"config.global_batch_size={batch} is outside the {benchmark} "
        f"reference convergence points' batch sizes [{low}, {high}] "
        f"({[p.batch_size for p in points]} in {path})"
    ]
  for point in points:
    if point.batch_size == batch:
      return _reference_mismatches(mlperf, point, f"{point.name} in {path}")
  return []


def check_reference_hyperparameters(
    mlperf: mlperf_config.MlperfConfig,
) -> None:
  """The closed-division pre-flight: refuses a config off the reference.

  See `reference_mismatches` for what is compared. In the closed division a
  mismatch is an error; in the open division each one is a warning.

  Args:
    mlperf: as for `reference_mismatches`, plus `submission_division`.

  Raises:
    ValueError: closed division and the config departs from the reference;
      the message names each field, value, reference and the RCP file.
  """
  problems = reference_mismatches(mlperf)
  if not problems:
    return
  if mlperf.submission_division == mllog_constants.CLOSED:
    raise ValueError(
        "closed-division pre-flight against the reference convergence "
        "points: "
        + "; ".join(problems)
        + " (submission_division='open' runs it anyway, with warnings)"
    )
  for problem in problems:
    logging.warning("MLPerf open division: %s", problem)
