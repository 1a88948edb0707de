"""The deferred evaluation's part of a run's MLPerf log.

MLPerf Training's rules let a run whose reference does so "generate
timestamped checkpoints, evaluate them after the clock has been stopped,
and update the clock stopped time to the timestamp of the first passing
checkpoint", a checkpoint's timestamp being any time after its last weight
was updated. A `deferred_eval` run does that, and its log says so in two
events of its own (the compliance checker skips keys its rules do not
name):

  deferred_eval_checkpoint  at every point the eval schedule names, in
                            place of the eval: value the weights-only
                            checkpoint's step (completed steps), metadata
                            `samples_count` and `update_time_ms` (when that
                            step's update had finished, in ms since the
                            epoch)
  deferred_eval_pending     once the training ran its `steps`, after the
                            last block_stop: metadata `samples_count` and
                            `step`; the log then has no run_stop, it awaits
                            its evaluation

A run that stops otherwise (a signal, an error) ends its log with
run_stop(aborted) as any run does: that attempt is no result.

`read(path)` gives an awaiting log's points; `append(...)` adds what the
evaluation found, in one write: per evaluated checkpoint, in step order,
eval_start, eval_accuracy and eval_stop at its samples count and a
tracked_stats with its validation_time (each dated when it happened), then
run_stop: `success` at the first checkpoint that reached the target, dated
at its update time, or `aborted` at the training's end (the
deferred_eval_pending event's time) when none did. run_stop's metadata
adds `deferred_eval: true` and the checkpoint's step. A closed log (one
with a run_stop) is refused, so nothing is ever appended twice.
"""

import dataclasses
import io
import os
from typing import Optional, Sequence

from maxtext.listeners import interface
from maxtext.mllog import logger as mllog_logger
from maxtext.storage import weights_checkpoints

POINT_KEY = "deferred_eval_checkpoint"
PENDING_KEY = "deferred_eval_pending"


class LogError(ValueError):
  """The log cannot take a deferred evaluation (one line, naming it)."""


def log_point(
    logger: mllog_logger.MLLogger, point: interface.DeferredEval
) -> None:
  """Logs an evaluation point whose weights were saved (training side)."""
  logger.event(
      POINT_KEY,
      point.step + 1,
      {
          "samples_count": point.samples,
          "update_time_ms": weights_checkpoints.update_time_ms(
              point.update_time
          ),
      },
  )


def log_pending(
    logger: mllog_logger.MLLogger, samples: int, final_step: int
) -> None:
  """Ends a completed deferred_eval run's log without run_stop."""
  logger.block_stop(samples)
  logger.event(
      PENDING_KEY, None, {"samples_count": samples, "step": final_step}
  )


@dataclasses.dataclass(frozen=True)
class Point:
  """An evaluation point the training logged.

  Attributes:
    checkpoint_step: the weights-only checkpoint's step (completed steps).
    samples: samples trained before the point.
    update_time_ms: when that step's update had finished (ms since epoch).
  """

  checkpoint_step: int
  samples: int
  update_time_ms: int


@dataclasses.dataclass(frozen=True)
class Pending:
  """A log that awaits its deferred evaluation.

  Attributes:
    path: the log file.
    points: the evaluation points, in the order the training logged them
      (step order).
    end_samples: samples trained when the training ended.
    end_time_ms: when it ended (the deferred_eval_pending event's time).
  """

  path: str
  points: tuple[Point, ...]
  end_samples: int
  end_time_ms: int


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """The evaluation of one point's weights.

  Attributes:
    point: the point evaluated.
    value: the target metric's value (MLPerf's eval_accuracy).
    reached: whether it reached the run's target.
    start_time: seconds since the epoch when the evaluation started.
    stop_time: and when it ended.
  """

  point: Point
  value: float
  reached: bool
  start_time: float
  stop_time: float


def read(path: str) -> Pending:
  """The points of a log that awaits its deferred evaluation.

  Raises:
    LogError: the log does not exist, is already closed (it has a
      run_stop), was written by a run without deferred_eval, or by a
      training that did not finish (no deferred_eval_pending), or its
      events are out of order (one run_start, before every point, the
      points before the pending event) or malformed (a point without its
      metadata); one line.
  """
  if not os.path.isfile(path):
    raise LogError(f"no MLPerf log {path}: the run wrote none")
  try:
    events = mllog_logger.read_events(path)
  except (UnicodeDecodeError, ValueError) as e:
    raise LogError(f"{path}: a :::MLLOG line is not JSON: {e}") from None
  for number, event in enumerate(events, 1):
    if not isinstance(event, dict):
      raise LogError(f"{path}: MLLOG event {number} is not a JSON object")
  for event in events:
    if event.get("key") == "run_stop":
      metadata = event.get("metadata") or {}
      raise LogError(
          f"{path} is already closed (run_stop {metadata.get('status')!r} at"
          f" samples_count {metadata.get('samples_count')}): nothing is"
          " appended to it"
      )
  points = tuple(
      _point(path, number, event)
      for number, event in enumerate(events, 1)
      if event.get("key") == POINT_KEY
  )
  pending = [e for e in events if e.get("key") == PENDING_KEY]
  if not points:
    raise LogError(
        f"{path} has no {POINT_KEY} event: its run was not trained with"
        " deferred_eval=True"
    )
  if not pending:
    raise LogError(
        f"{path} has no {PENDING_KEY} event: its training did not finish"
        " (resume it with its training command, then evaluate)"
    )
  steps = [p.checkpoint_step for p in points]
  if steps != sorted(set(steps)):
    raise LogError(f"{path}: its {POINT_KEY} steps {steps} are not ascending")
  _check_order(path, [e.get("key") for e in events])
  end = pending[-1]
  return Pending(
      path=path,
      points=points,
      end_samples=_integer(
          path, PENDING_KEY, end.get("metadata"), "samples_count"
      ),
      end_time_ms=_integer(path, PENDING_KEY, end, "time_ms"),
  )


def _integer(path: str, key: str, fields, name: str) -> int:
  """`fields[name]`, an integer, or LogError naming the event and field."""
  value = fields.get(name) if isinstance(fields, dict) else None
  if not isinstance(value, int) or isinstance(value, bool):
    raise LogError(
        f"{path}: a {key} event's {name} is {value!r}, not an integer"
    )
  return value


def _point(path: str, number: int, event: dict) -> Point:
  """A point event, its fields checked (LogError: one line)."""
  del number  # The field names the event well enough.
  return Point(
      checkpoint_step=_integer(path, POINT_KEY, event, "value"),
      samples=_integer(path, POINT_KEY, event.get("metadata"), "samples_count"),
      update_time_ms=_integer(
          path, POINT_KEY, event.get("metadata"), "update_time_ms"
      ),
  )


def _check_order(path: str, keys: list) -> None:
  """One run_start, before every point; every point before the pending
  event (the training's end), which is the last of them."""
  starts = [i for i, key in enumerate(keys) if key == "run_start"]
  if len(starts) != 1:
    raise LogError(
        f"{path} has {len(starts)} run_start events: one attempt's log has one"
    )
  marks = [i for i, key in enumerate(keys) if key in (POINT_KEY, PENDING_KEY)]
  if marks[0] < starts[0]:
    raise LogError(
        f"{path}: a {keys[marks[0]]} event comes before run_start: the log's "
        "events are out of order"
    )
  if keys[marks[-1]] != PENDING_KEY:
    raise LogError(
        f"{path}: a {POINT_KEY} event comes after {PENDING_KEY}: the log's "
        "events are out of order"
    )


class _Clock:
  """The time each appended line is dated at (seconds since the epoch)."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now

  def set_ms(self, time_ms: int) -> None:
    # Half a millisecond above, so that the logger's int(now * 1e3) gives
    # exactly `time_ms` whatever the float rounding.
    self.now = (time_ms + 0.5) / 1e3


def append(pending: Pending, evaluations: Sequence[Evaluation]) -> str:
  """Appends the evaluations and the run_stop to the log, in one write.

  Args:
    pending: the log, as `read` gave it.
    evaluations: the points evaluated, in step order, the first that
      reached the target last (if one did).

  Returns:
    The run_stop status, "success" or "aborted".

  Raises:
    OSError: the log could not be written.
  """
  clock = _Clock()
  text = io.StringIO()
  log = mllog_logger.MLLogger(text, pending.path, time_fn=clock)
  passed: Optional[Evaluation] = None
  for evaluation in evaluations:
    samples = evaluation.point.samples
    clock.now = evaluation.start_time
    log.eval_start(samples)
    clock.now = evaluation.stop_time
    log.eval_accuracy(evaluation.value, samples)
    log.eval_stop(samples)
    log.tracked_stats(
        evaluation.point.checkpoint_step,
        {"validation_time": evaluation.stop_time - evaluation.start_time},
    )
    if evaluation.reached:
      passed = evaluation
      break
  if passed is not None:
    status = mllog_logger.SUCCESS
    clock.set_ms(passed.point.update_time_ms)
    samples = passed.point.samples
    step = passed.point.checkpoint_step
  else:
    status = mllog_logger.ABORTED
    clock.set_ms(pending.end_time_ms)
    samples = pending.end_samples
    step = None
  log.run_stop(
      status,
      samples,
      metadata={"deferred_eval": True, "checkpoint_step": step},
  )
  with open(pending.path, "a", encoding="utf-8") as f:
    f.write(text.getvalue())
    f.flush()
    os.fsync(f.fileno())
  return status
