"""Proves a config's MLPerf log header with the official compliance checker.

A closed-division submission is judged after the run by `mlperf_logging`'s
compliance checker, whose rules hold more than the reference convergence
points (`rules.check_reference_hyperparameters`): formulas over the logged
values (deepseekv3_671b: the learning rate as a function of the batch, the
decay steps as a function of the warm-up) and a check of the first
evaluation's sample count. This module lets the checker judge a config
before the run, so that no rule is ever repeated here:

  `write_log(mlperf, path, hyperparameters)` writes the log a run starts
  with (its settings: `mlperf_config.MlperfConfig`), as the trainer's
  logger writes it (`cache_clear`, `init_start`, the `submission_*` keys,
  the hyperparameters, `init_stop`),
  then run events marked `"synthetic": true` in their metadata: blocks and
  evaluations at the completed steps where the run's eval schedule
  (`maxtext.config.eval_schedule`) puts its first two evaluations, the last at
  the run's target (`target_eval_loss`, or the workload's:
  `workload_header.WorkloadHeader`, e.g. a GRPO run's pass rate), then
  `run_stop`.

  `check_log(path, ruleset)` runs the installed checker on a log in this
  process (its rule files, its parser, its `ComplianceChecker`) and returns
  every message as a `Failure` naming its log key.

  `prove(mlperf, hyperparameters)` does both in a temporary directory; its
  `Verdict.config_failures()` are the failures that concern the config (the
  header keys and `eval_accuracy`: the first evaluation's point and the
  target), not the synthetic events' own sequence.

  `check_config(mlperf)` is the pre-flight of a run with a log: it proves
  the header of a fresh run (`fresh_run_header`) and refuses a closed
  config whose log would fail (an open one: a warning per failure).

The hyperparameters are the caller's: `hyperparameters.run_hyperparameters`
builds them, for the pre-flight and for the trainer's MLPerf listener alike.
A proof takes a few milliseconds; its verdict is cached by the log's
contents, which depend only on the config.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import tempfile
import threading
from typing import Any, Mapping, Optional

from absl import logging as absl_logging
from mlperf_logging.compliance_checker import mlp_compliance
from mlperf_logging.compliance_checker import mlp_parser
import yaml

from maxtext.config import config_lib
from maxtext.config import eval_schedule
from maxtext.mllog import hyperparameters as hyperparameters_lib
from maxtext.mllog import logger as mllog_logger
from maxtext.mllog import mlperf_config
from maxtext.mllog import rules
from maxtext.mllog import workload_header
from maxtext.storage import build_info as build_info_lib

# Keys of the run phase (the synthetic part of a proof's log); every other
# key a rule names is a header key. `eval_accuracy` is a run event whose
# rules concern the config: where the first evaluation falls, and whether
# the target is a result the rules accept.
RUN_KEYS = frozenset(
    {
        "cache_clear",
        "init_start",
        "init_stop",
        "run_start",
        "run_stop",
        "block_start",
        "block_stop",
        "epoch_start",
        "epoch_stop",
        "eval_start",
        "eval_stop",
        "eval_accuracy",
        "tracked_stats",
    }
)
EVAL_ACCURACY = "eval_accuracy"
SYNTHETIC = {"synthetic": True}

# The checker's usage (working group) for MLPerf Training.
_USAGE = "training"
# A fixed clock: the log's text, and so its verdict, depends on the config
# only. The checker's timing rule (init_stop soon after init_start) holds.
_CLOCK_S = 1.7e9
# A proof's log claims no source revision (the checker reads none); asking
# git would cost a subprocess at every validation.
_NO_BUILD = build_info_lib.BuildInfo(
    git_revision=build_info_lib.UNKNOWN, source=build_info_lib.SOURCE_UNKNOWN
)
# The config file a proof's header names: the pre-flight does not know the
# file. The trainer's default for the same unknown (trainer.run).
PROOF_CONFIG_FILENAME = "unknown"
# Before the evaluation that reaches the target, a run's loss is above it.
_MISS_MARGIN = 1.0
# ... and a GRPO run's pass rate below it.
_MISSED_PASS_RATE = 0.0

# The checker keeps the rule files it still has to read in a module-level
# list; one check at a time.
_CHECKER_LOCK = threading.Lock()
_QUOTED_KEY = re.compile(r"'([A-Za-z0-9_]+)'")
_AT_LEAST_ONE = re.compile(r"^Failed checks for ([A-Za-z0-9_]+) : (.*)$", re.S)
_FAILED_TEST = re.compile(r"^failed test: (.*)$", re.M)


@dataclasses.dataclass(frozen=True)
class Failure:
  """One message of the checker.

  Attributes:
    key: the log key the message concerns ("" when it names none, e.g. a
      parse error).
    message: the checker's message, as it would print it.
  """

  key: str
  message: str

  @property
  def failed_test(self) -> str:
    """The rule's expression that failed, or "" when the message has none."""
    match = _FAILED_TEST.search(self.message)
    if match:
      return match.group(1).strip()
    match = _AT_LEAST_ONE.match(self.message)
    return match.group(2).strip() if match else ""

  @property
  def logged(self) -> Optional[dict[str, Any]]:
    """The `:::MLLOG` record a CHECK failure quotes, or None."""
    for line in self.message.splitlines():
      if line.startswith(mllog_logger.LINE_PREFIX):
        return json.loads(line[len(mllog_logger.LINE_PREFIX) :])
    return None

  @property
  def concerns_config(self) -> bool:
    """Whether the message is about a header key or `eval_accuracy`."""
    return bool(self.key) and (
        self.key not in RUN_KEYS or self.key == EVAL_ACCURACY
    )


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The checker's verdict on one log.

  Attributes:
    ruleset: the ruleset it was checked with, e.g. "6.1.0".
    failures: every message, header and run events alike, in the order the
      checker reports them.
  """

  ruleset: str
  failures: tuple[Failure, ...]

  @property
  def passed(self) -> bool:
    return not self.failures

  def config_failures(self) -> tuple[Failure, ...]:
    """The failures that concern the config (`Failure.concerns_config`)."""
    return tuple(f for f in self.failures if f.concerns_config)

  def run_failures(self) -> tuple[Failure, ...]:
    """The other failures: the synthetic run events' own sequence."""
    return tuple(f for f in self.failures if not f.concerns_config)

  def failed_keys(self) -> set[str]:
    return {f.key for f in self.failures if f.key}


def rule_keys(ruleset: str, division: str, benchmark: str) -> frozenset[str]:
  """Every log key the checker's rule files name for a benchmark.

  The files the checker reads for it: `common.yaml`, then the division's
  `<division>_common.yaml` and `<division>_<benchmark>.yaml`.

  Args:
    ruleset: a training ruleset of the installed checker, e.g. "6.1.0".
    division: "closed" or "open".
    benchmark: a benchmark of the ruleset, e.g. "deepseekv3_671b".
  """
  root = rules.ruleset_dir(ruleset)
  keys = set()
  for name in (
      "common.yaml",
      f"{division}_common.yaml",
      f"{division}_{benchmark}.yaml",
  ):
    path = os.path.join(root, name)
    if not os.path.isfile(path):
      continue
    with open(path, encoding="utf-8") as f:
      for rule in yaml.safe_load(f) or []:
        if isinstance(rule, dict) and "KEY" in rule:
          keys.add(rule["KEY"]["NAME"])
  return frozenset(keys)


def samples_after(
    mlperf: mlperf_config.MlperfConfig,
    step: int,
    header: Optional[workload_header.WorkloadHeader] = None,
) -> int:
  """The samples_count after `step` completed updates (a batch counts once,
  however many updates it feeds: `WorkloadHeader.updates_per_batch`)."""
  per_batch = workload_header.of_run(mlperf, header).updates_per_batch
  return step // per_batch * mlperf.global_batch_size


def eval_points(
    mlperf: mlperf_config.MlperfConfig,
    header: Optional[workload_header.WorkloadHeader] = None,
) -> tuple[int, ...]:
  """Completed steps of the synthetic run's evaluations: at most two.

  The first evaluation the run's schedule makes (`eval_schedule`, which
  reads `eval_interval`, `first_eval_samples`, `global_batch_size` and
  `steps`), and the next one if the budget (`steps`) goes on after it.

  Args:
    mlperf: the run's MLPerf log settings.
    header: the workload's part of the log; None = pretraining's.

  Returns:
    One or two step counts, increasing, each due by `eval_schedule.eval_due`.
  """
  per_batch = workload_header.of_run(mlperf, header).updates_per_batch
  schedule = eval_schedule.EvalSchedule(
      steps=mlperf.steps,
      eval_interval=mlperf.eval_interval,
      first_eval_samples=mlperf.first_eval_samples,
      global_batch_size=mlperf.global_batch_size,
  )
  first = min(eval_schedule.first_eval_step(schedule, per_batch), mlperf.steps)
  points = [first]
  if first < mlperf.steps:
    points.append(min(first + mlperf.eval_interval, mlperf.steps))
  for step in points:
    # eval_due decides; the arithmetic above only finds the candidates.
    if not eval_schedule.eval_due(schedule, step, per_batch):
      raise AssertionError(
          f"eval_schedule does not evaluate after {step} steps, although "
          "first_eval_step is "
          f"{eval_schedule.first_eval_step(schedule, per_batch)}"
      )
  return tuple(points)


def write_log(
    mlperf: mlperf_config.MlperfConfig,
    path: str,
    hyperparameters: Mapping[str, Any],
    *,
    header: Optional[workload_header.WorkloadHeader] = None,
    build: Optional[build_info_lib.BuildInfo] = None,
) -> str:
  """Writes a run's header from its settings, then synthetic run events.

  Args:
    mlperf: the run's MLPerf log settings, `enable_mllog` on.
    path: the log to write (an existing file makes it the next attempt's
      name, as for a run; see `logger.next_attempt_path`).
    hyperparameters: the run's hyperparameter events, in order
      (`hyperparameters.run_hyperparameters`).
    header: the workload's part of the log (its target, the updates a
      batch feeds); None = pretraining's.
    build: the revision the submission_platform event names; default
      "unknown".

  Returns:
    The path written.

  Raises:
    ValueError: `enable_mllog` is off (a run without a log has no header),
      or the logger refuses the settings or the hyperparameters.
  """
  if not mlperf.enable_mllog:
    raise ValueError(
        f"config.enable_mllog={mlperf.enable_mllog!r}: a run without an "
        "MLPerf log has no header to prove"
    )
  logger = mllog_logger.create_mllogger(
      mlperf,
      path,
      process_index=0,
      time_fn=lambda: _CLOCK_S,
      build=build or _NO_BUILD,
  )
  with logger:
    # The trainer's order: listener.start, then the listener's on_run_start.
    logger.cache_clear(True)
    logger.init_start()
    logger.submission_info()
    logger.hyperparameters(hyperparameters)
    logger.init_stop()
    _write_run(logger, mlperf, workload_header.of_run(mlperf, header))
    return logger.path


def _write_run(
    logger: mllog_logger.MLLogger,
    mlperf: mlperf_config.MlperfConfig,
    header: workload_header.WorkloadHeader,
) -> None:
  """The synthetic run events: a block and an evaluation at each of
  `eval_points`, the last at the target, then `run_stop`."""
  goal = header.target
  # Before the evaluation that reaches the target, a run's metric misses it.
  miss = _MISSED_PASS_RATE if header.higher_is_better else goal + _MISS_MARGIN

  def synthetic(key, value, samples, event_type=mllog_logger.POINT_IN_TIME):
    logger.event(
        key, value, {"samples_count": samples, **SYNTHETIC}, event_type
    )

  logger.event("run_start", None, SYNTHETIC, mllog_logger.INTERVAL_START)
  points = eval_points(mlperf, header)
  start = 0
  for i, step in enumerate(points):
    samples = samples_after(mlperf, step, header)
    last = i == len(points) - 1
    # Only the last evaluation reaches the target (without one, 0, every
    # evaluation reports 0): the checker's rule on the reported accuracy
    # then judges the config's target.
    value = goal if last or not goal else miss
    synthetic("block_start", None, start, mllog_logger.INTERVAL_START)
    synthetic("block_stop", None, samples, mllog_logger.INTERVAL_END)
    synthetic("eval_start", None, samples, mllog_logger.INTERVAL_START)
    synthetic(EVAL_ACCURACY, value, samples)
    synthetic("eval_stop", None, samples, mllog_logger.INTERVAL_END)
    start = samples
  logger.event(
      "run_stop",
      None,
      {
          "status": (mllog_logger.SUCCESS if goal else mllog_logger.ABORTED),
          "samples_count": start,
          **SYNTHETIC,
      },
      mllog_logger.INTERVAL_END,
  )


class _CheckerProgress(logging.Filter):
  """Drops the checker's progress lines ("Compliance checks: <rule file>"),
  which it logs at INFO on the root logger: a pre-flight on every run start
  should not announce rule files. Its warnings and errors pass."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or (
        os.path.basename(record.pathname) != "mlp_compliance.py"
    )


_CHECKER_PROGRESS = _CheckerProgress()


def _failures(checker: Any) -> list[Failure]:
  """The checker's messages (not its warnings), each with its key."""
  failures = [Failure(k, m) for k, m in checker.overwritable.items()]
  for message in checker.not_overwritable:
    match = _AT_LEAST_ONE.match(message)
    quoted = _QUOTED_KEY.findall(message.splitlines()[0] if message else "")
    key = match.group(1) if match else (quoted[0] if quoted else "")
    failures.append(Failure(key, message))
  return failures


def check_log(path: str, ruleset: str) -> Verdict:
  """Runs the installed compliance checker on a log, in this process.

  What `python -m mlperf_logging.compliance_checker --usage training
  --ruleset <ruleset> <path>` does, without its logging setup: the same
  parser, rule files and `ComplianceChecker`.

  Args:
    path: an `:::MLLOG` log file.
    ruleset: a training ruleset of the installed checker, e.g. "6.1.0".

  Returns:
    The checker's verdict; a line it cannot parse is a failure with key "".

  Raises:
    FileNotFoundError: `path` is not a file.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"MLPerf log {path!r} is not a file")
  loglines, errors = mlp_parser.parse_file(path, ruleset=ruleset)
  failures = [Failure("", f"cannot parse {line!r}: {e}") for line, e in errors]
  checker = mlp_compliance.make_checker(
      _USAGE, ruleset, quiet=False, werror=False
  )
  root = logging.getLogger()
  with _CHECKER_LOCK:
    # Rule files a crashed check left queued would be read for this log.
    mlp_compliance.enqueued_configs.clear()
    root.addFilter(_CHECKER_PROGRESS)
    try:
      checker.check_loglines(loglines, f"{_USAGE}_{ruleset}/common.yaml")
    finally:
      root.removeFilter(_CHECKER_PROGRESS)
      mlp_compliance.enqueued_configs.clear()
  return Verdict(ruleset, tuple(failures + _failures(checker)))


@functools.lru_cache(maxsize=64)
def _check_text(text: str, ruleset: str) -> Verdict:
  with tempfile.TemporaryDirectory(prefix="header_proof_") as tmp:
    path = os.path.join(tmp, "mllog.log")
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    return check_log(path, ruleset)


def prove(
    mlperf: mlperf_config.MlperfConfig,
    hyperparameters: Mapping[str, Any],
    header: Optional[workload_header.WorkloadHeader] = None,
) -> Verdict:
  """Checks the log a run would write, with its ruleset.

  The log (`write_log`) is written in a temporary directory, removed after.
  The checker applies the rules of the run's own division and benchmark
  (the header names them), as it will after the run.

  Args:
    mlperf: the run's MLPerf log settings, `enable_mllog` on.
    hyperparameters: the run's hyperparameter events
      (`hyperparameters.run_hyperparameters`).
    header: the workload's part of the log; None = pretraining's.

  Returns:
    The verdict of the run's `mllog_ruleset`.
  """
  with tempfile.TemporaryDirectory(prefix="header_proof_") as tmp:
    path = write_log(
        mlperf, os.path.join(tmp, "mllog.log"), hyperparameters, header=header
    )
    with open(path, encoding="utf-8") as f:
      text = f.read()
  return _check_text(text, mlperf.mllog_ruleset)


def describe(
    failure: Failure,
    mlperf: mlperf_config.MlperfConfig,
    source: str = "",
    header: Optional[workload_header.WorkloadHeader] = None,
) -> str:
  """One line on a config failure: the key, the logged value, the rule.

  Args:
    failure: one of `Verdict.config_failures()`.
    mlperf: the settings the proof's log came from.
    source: what in the config sets the key's value, e.g.
      "config.learning_rate"; named after the value when given.
    header: the workload's part of the log; None = pretraining's.

  Returns:
    E.g. "opt_base_learning_rate=2.4e-05 fails `abs(v['value'] - ...)`",
    or for the first evaluation "eval_accuracy: the first evaluation, after
    44 steps (first_eval_samples=..., ...) at samples_count=... fails `...`".
  """
  header = workload_header.of_run(mlperf, header)
  test = failure.failed_test
  record = failure.logged
  if failure.key == EVAL_ACCURACY:
    first = eval_points(mlperf, header)[0]
    samples = (record or {}).get("metadata", {}).get("samples_count")
    if record is not None and samples == samples_after(mlperf, first, header):
      return (
          f"{EVAL_ACCURACY}: the first evaluation, after {first} steps "
          f"(config.first_eval_samples={mlperf.first_eval_samples}, "
          f"eval_interval={mlperf.eval_interval}, "
          f"global_batch_size={mlperf.global_batch_size}), at "
          f"samples_count={samples} fails `{test}`"
      )
    if test and record is None:
      return (
          f"{EVAL_ACCURACY}: the run stops at config.{header.target_field}="
          f"{header.target!r}, and no evaluation passes `{test}`"
      )
  if record is not None and test:
    where = f" ({source})" if source else ""
    return f"{failure.key}={record.get('value')!r}{where} fails `{test}`"
  return failure.message.strip().splitlines()[0]


def fresh_run_header(
    mlperf: mlperf_config.MlperfConfig,
    config_filename: str = PROOF_CONFIG_FILENAME,
    header: Optional[workload_header.WorkloadHeader] = None,
) -> dict[str, Any]:
  """`hyperparameters.run_hyperparameters` of a fresh run, before its mesh
  exists: the header the pre-flight proves.

  The mesh decides a data axis of -1; the rules ask only for a positive
  micro batch, which the mesh code guarantees, so -1 counts as 1 here.
  """
  return hyperparameters_lib.run_hyperparameters(
      mlperf,
      data_parallelism=max(mlperf.data_parallelism, 1),
      start_step=0,
      config_filename=config_filename,
      header=header,
  )


def _source(key: str, header: workload_header.WorkloadHeader) -> str:
  """What in the config sets header key `key`, or ""."""
  sources = hyperparameters_lib.header_sources(header)
  if key in sources:
    return sources[key]
  # A key named as a config field is set by that field.
  return f"config.{key}" if key in config_lib.FIELD_TYPES else ""


def check_config(
    mlperf: mlperf_config.MlperfConfig,
    header: Optional[workload_header.WorkloadHeader] = None,
) -> None:
  """The MLPerf pre-flight: the official checker on the run's header.

  The log a run starts with (its real header, `fresh_run_header`) plus
  synthetic run events at the run's own evaluation points goes through the
  installed compliance checker with the rules of the run's ruleset,
  division and benchmark (`prove`). Every failure about a header key or
  `eval_accuracy` (the first evaluation's samples, the target) is one the
  run's log would fail after the run. Closed division: an error; open: a
  warning each.

  Args:
    mlperf: the run's MLPerf log settings, `enable_mllog` on.
    header: the workload's part of the log; None = pretraining's.

  Raises:
    ValueError: closed division and the checker fails the header; the
      message names each failing key, its logged value and the rule.
  """
  header = workload_header.of_run(mlperf, header)
  verdict = prove(mlperf, fresh_run_header(mlperf, header=header), header)
  for failure in verdict.run_failures():
    # The synthetic events are this engine's, not the config's: a bug to
    # report, not a reason to refuse the run.
    absl_logging.warning(
        "MLPerf header proof: the synthetic run events fail the checker "
        "(maxtext.mllog.header_proof): %s",
        failure.message,
    )
  problems = [
      describe(f, mlperf, _source(f.key, header), header)
      for f in verdict.config_failures()
  ]
  if problems:
    _refuse_or_warn(mlperf, problems)


def _refuse_or_warn(
    mlperf: mlperf_config.MlperfConfig, problems: list[str]
) -> None:
  """Closed division: one error naming every problem; open: a warning
  each."""
  rules_name = (
      f"mlperf_logging training_{mlperf.mllog_ruleset} "
      f"{mlperf.submission_division} {mlperf.submission_benchmark} rules"
  )
  if mlperf.submission_division == "closed":
    raise ValueError(
        f"closed-division pre-flight: the MLPerf log this config writes "
        f"fails the official compliance checker ({rules_name}): "
        + "; ".join(problems)
        + " (submission_division='open' runs it anyway, with warnings)"
    )
  for problem in problems:
    absl_logging.warning(
        "MLPerf open division: the log fails the checker (%s): %s",
        rules_name,
        problem,
    )
