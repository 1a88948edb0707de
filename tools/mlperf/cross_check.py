"""Checks a run's MLPerf log against its own `metrics.jsonl`.

A result is the run's MLPerf log; the run's `metrics.jsonl` is what the
trainer recorded of the same steps, written by another output. The two must
tell the same story: every `eval_accuracy` is an eval record's `eval_loss`
at the same step, every `tracked_stats` train loss is that step's train
record's `loss`, and every `samples_count` is the steps trained times
`global_batch_size` (a packaged run is one uninterrupted attempt). A log
edited by hand, or taken from another run, disagrees somewhere; the first
disagreement is reported as `<log>:<line>: ...`.
"""

import math
import os
from typing import Any, Mapping, Optional, Sequence

from maxtext.metrics import jsonl

# Float values are written by Python's JSON encoder on both sides; a small
# tolerance still accepts any faithful round trip.
_REL_TOL = 1e-6


class MismatchError(ValueError):
  """The log and the metrics disagree; the message names the log's line."""


def _same(a: Any, b: Any) -> bool:
  try:
    a, b = float(a), float(b)
  except (TypeError, ValueError):
    return False
  if math.isnan(a) or math.isnan(b):
    return math.isnan(a) and math.isnan(b)
  return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=1e-12)


def check_run(
    log_path: str,
    events: Sequence[tuple[int, Mapping[str, Any]]],
    run_dir: str,
    global_batch_size: int,
) -> None:
  """Raises unless the log's evals, losses and samples match the metrics.

  Args:
    log_path: the MLPerf log, for messages.
    events: its (line number, event) pairs, in file order.
    run_dir: the run directory holding `metrics.jsonl`.
    global_batch_size: the run's samples per step.

  Raises:
    MismatchError: the first event that disagrees (or a metrics record the
      log lacks), naming the log's line, or no `metrics.jsonl`.
  """
  metrics_path = os.path.join(run_dir, jsonl.METRICS_FILENAME)
  if not os.path.isfile(metrics_path):
    raise MismatchError(
        f"{metrics_path} is missing: the MLPerf log {log_path} cannot be"
        " checked against the run's metrics"
    )
  run = _RunCheck(log_path, metrics_path, global_batch_size)
  # The line and event of an eval_accuracy whose step is not known yet.
  eval_line: Optional[int] = None
  eval_event: Mapping[str, Any] = {}
  for lineno, event in events:
    key = event.get("key")
    metadata = event.get("metadata") or {}
    value = event.get("value")
    if key == "eval_accuracy":
      eval_line, eval_event = lineno, event
    elif key == "tracked_stats" and isinstance(value, dict):
      steps = metadata.get("step")
      if not isinstance(steps, int):
        continue
      if "validation_time" in value and eval_line is not None:
        # The tracked_stats that closes an eval names its step.
        run.check_eval(eval_line, eval_event, steps)
        eval_line = None
      if "train_loss" in value:
        run.check_train(lineno, event, steps)
  if eval_line is not None:
    raise run.fail(eval_line, "eval_accuracy without its step")
  missing = sorted(set(run.evals) - run.evals_seen)
  if missing:
    last = events[-1][0] if events else 0
    raise run.fail(
        last,
        f"no eval_accuracy for the eval record(s) of step(s)"
        f" {', '.join(str(s + 1) for s in missing)}",
    )


class _RunCheck:
  """A run's metrics records, against which `check_run` checks log events.

  Attributes:
    train, evals: the metrics' train and eval records by step.
    evals_seen: the steps of the eval records an eval_accuracy matched.
  """

  def __init__(self, log_path: str, metrics_path: str, global_batch_size: int):
    self._log_path = log_path
    self._metrics_path = metrics_path
    self._global_batch_size = global_batch_size
    self.train, self.evals = {}, {}
    for record in jsonl.read_jsonl(metrics_path):
      step = record.get(jsonl.STEP_KEY)
      if record.get(jsonl.KIND_KEY) == jsonl.TRAIN:
        self.train[step] = record
      elif record.get(jsonl.KIND_KEY) == jsonl.EVAL:
        self.evals[step] = record
    self.evals_seen = set()

  def fail(self, lineno: int, what: str) -> MismatchError:
    """The error for the log's line `lineno`."""
    return MismatchError(
        f"{self._log_path}:{lineno}: {what} (in {self._metrics_path}); the"
        " log does not describe this run"
    )

  def check_samples(self, lineno, event, steps: int) -> None:
    """`event`'s samples_count, if any, is `steps` global batches."""
    samples = (event.get("metadata") or {}).get("samples_count")
    batch = self._global_batch_size
    if samples is not None and samples != steps * batch:
      raise self.fail(
          lineno,
          f"{event.get('key')} has samples_count {samples} but {steps}"
          f" steps of global_batch_size {batch} are {steps * batch}",
      )

  def check_eval(self, eval_line, eval_event, steps: int) -> None:
    """An eval_accuracy (at `eval_line`) against the eval after `steps`."""
    record = self.evals.get(steps - 1)
    if record is None:
      raise self.fail(
          eval_line, f"eval_accuracy after step {steps} has no eval record"
      )
    if not _same(eval_event.get("value"), record.get(jsonl.EVAL_LOSS_KEY)):
      raise self.fail(
          eval_line,
          f"eval_accuracy {eval_event.get('value')} after step {steps}"
          f" but eval_loss {record.get(jsonl.EVAL_LOSS_KEY)}",
      )
    self.check_samples(eval_line, eval_event, steps)
    self.evals_seen.add(steps - 1)

  def check_train(self, lineno, event, steps: int) -> None:
    """A tracked_stats' train_loss against the train record of `steps`."""
    value = event.get("value")
    record = self.train.get(steps - 1)
    if record is None:
      raise self.fail(lineno, f"train_loss of step {steps} has no train record")
    if not _same(value["train_loss"], record.get(jsonl.LOSS_KEY)):
      raise self.fail(
          lineno,
          f"train_loss {value['train_loss']} at step {steps} but loss"
          f" {record.get(jsonl.LOSS_KEY)}",
      )
    self.check_samples(lineno, event, steps)
