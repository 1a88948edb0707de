"""Writes per-step training and eval metrics: console, JSON lines, TensorBoard.

One `MetricLogger` serves one run. The trainer reduces each step's metrics
buffer to host scalars and hands them over with `write_train` / `write_eval`;
the logger never touches device arrays, so writing cannot stall the device.

Outputs, written only by the primary process (process 0):

* a console line (absl `logging.info`) every `log_period` steps and on the last
  step: step, loss, learning rate, gradient norm, tokens/s, step time, ETA;
* `<run_dir>/metrics.jsonl`: one JSON object per line and per write, e.g.
  `{"step": 3, "kind": "train", "loss": 2.5, ..., "step_time_s": 0.1}`;
  the file is flushed after every line, so a crashed process loses nothing;
* TensorBoard scalars under `<run_dir>/tensorboard`, tagged `<kind>/<name>`,
  one event (one `Summary` of all its values) per write.

Non-finite values are data. JSON has no NaN or infinity, so they are written
as the strings "NaN", "Infinity" and "-Infinity" (the spellings Python's
`float()` parses back); `read_jsonl` turns them back into floats.

Steps are the trainer's 0-based step indices: `write_train(step, ...)` reports
the step that has just finished, so `total_steps - step - 1` steps remain.

Resuming: a logger built with `first_step=s` first drops every record whose
step is >= s from an existing `metrics.jsonl` and starts its TensorBoard event
file with a session start at step s, TensorBoard's sign to discard the older
files' events at steps >= s; so both match what an uninterrupted run would
have written.
Checkpoint steps count completed steps (see `checkpointing`), so a trainer
resuming from checkpoint step `c`, taken after that many steps and their
evals, passes `first_step=c`.
"""

from collections.abc import Callable, Mapping
import datetime
import json
import math
import numbers
import os
import tempfile
import time
from typing import Any, TextIO

from absl import logging
import numpy as np

METRICS_FILENAME = "metrics.jsonl"
TENSORBOARD_DIRNAME = "tensorboard"

# Metric names the console line shows, when present in a train write.
LOSS_KEY = "loss"
LEARNING_RATE_KEY = "learning_rate"
GRAD_NORM_KEY = "grad_norm"
# Names the logger adds to every train record.
STEP_TIME_KEY = "step_time_s"
TOKENS_PER_SECOND_KEY = "tokens_per_s"

_RESERVED_KEYS = frozenset({"step", "kind"})
_KINDS = ("train", "eval")
_JSON_TO_NON_FINITE = {
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}


def _check_positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be an int, got {value!r}")
  if value <= 0:
    raise ValueError(f"{name} must be > 0, got {value!r}")


def _check_step(step: Any) -> int:
  if isinstance(step, bool) or not isinstance(step, numbers.Integral):
    raise TypeError(f"step must be an int, got {step!r}")
  if step < 0:
    raise ValueError(f"step must be >= 0, got {step!r}")
  return int(step)


def _to_host_number(name: str, value: Any) -> int | float:
  """Returns `value` as a Python int or float, or raises naming the metric."""
  if isinstance(value, np.ndarray) and value.shape in ((), (1,)):
    value = value.reshape(()).item()
  if isinstance(value, (bool, np.bool_)):
    return int(value)
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    return float(value)
  raise TypeError(
      f"metric {name!r} must be a host scalar (Python or NumPy int/float), "
      f"got {type(value).__name__}: {value!r}; fetch device values with "
      "jax.device_get before logging")


def _json_value(value: int | float) -> int | float | str:
  if isinstance(value, float) and not math.isfinite(value):
    if math.isnan(value):
      return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
  return value


def encode_record(step: int, kind: str, scalars: Mapping[str, int | float]) -> str:
  """Returns one `metrics.jsonl` line (without the newline).

  Args:
    step: the step index.
    kind: "train" or "eval".
    scalars: metric name -> Python int or float; non-finite floats are written
      as "NaN", "Infinity" or "-Infinity".
  """
  record = {"step": step, "kind": kind}
  record.update((k, _json_value(v)) for k, v in scalars.items())
  return json.dumps(record, allow_nan=False)


def _decode_value(value: Any) -> Any:
  if isinstance(value, str) and value in _JSON_TO_NON_FINITE:
    return _JSON_TO_NON_FINITE[value]
  return value


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """Reads a `metrics.jsonl` file written by `MetricLogger`.

  A torn last line (a process killed mid-write) is dropped with a warning;
  any other malformed line is an error.

  Args:
    path: the file.

  Returns:
    The records in file order, non-finite values back as floats.

  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: a line other than the last is not a JSON object with an
      integer "step" and a "kind" of "train" or "eval"; names path and line.
  """
  path = os.fspath(path)
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  # A complete file ends with "\n", leaving one empty final element.
  torn_tail = lines[-1]
  lines = lines[:-1]
  records = []
  for number, line in enumerate(lines, start=1):
    records.append(_parse_line(path, number, line))
  if torn_tail:
    try:
      records.append(_parse_line(path, len(lines) + 1, torn_tail))
    except ValueError:
      logging.warning("%s: dropping a torn last line: %r", path, torn_tail[:80])
  return records


def _parse_line(path: str, number: int, line: str) -> dict[str, Any]:
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}:{number}: not valid JSON ({e}): {line[:80]!r}") from e
  if (not isinstance(record, dict) or
      isinstance(record.get("step"), bool) or
      not isinstance(record.get("step"), int) or
      record.get("kind") not in _KINDS):
    raise ValueError(
        f"{path}:{number}: expected an object with an int 'step' and 'kind' in "
        f"{_KINDS}, got {line[:80]!r}")
  return {k: _decode_value(v) for k, v in record.items()}


def truncate_jsonl(path: str | os.PathLike[str], first_step: int) -> int:
  """Drops every record with step >= `first_step` from a metrics file.

  The file is rewritten through a temporary file and an atomic rename, so a
  crash during truncation leaves either the old or the new file. A missing
  file is left missing.

  Args:
    path: the `metrics.jsonl` file.
    first_step: the first step the resumed run will write.

  Returns:
    The number of records kept.
  """
  first_step = _check_step(first_step)
  path = os.fspath(path)
  if not os.path.exists(path):
    return 0
  kept = [r for r in read_jsonl(path) if r["step"] < first_step]
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=".metrics.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      for r in kept:
        scalars = {k: v for k, v in r.items() if k not in _RESERVED_KEYS}
        f.write(encode_record(r["step"], r["kind"], scalars) + "\n")
    os.replace(tmp_path, path)
  except BaseException:
    os.unlink(tmp_path)
    raise
  return len(kept)


def _format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  return str(datetime.timedelta(seconds=round(seconds)))


def _format_number(value: float, fmt: str) -> str:
  return format(value, fmt) if math.isfinite(value) else str(value)


class MetricLogger:
  """Console, JSONL and TensorBoard writer for one run (see module docstring).

  Not thread-safe: one training loop calls it.
  """

  def __init__(self,
               run_dir: str | os.PathLike[str],
               *,
               is_primary: bool,
               log_period: int,
               total_steps: int,
               tokens_per_step: int,
               first_step: int = 0,
               time_fn: Callable[[], float] = time.monotonic):
    """Opens the outputs (primary process only).

    Args:
      run_dir: local run directory; created if missing.
      is_primary: whether this process writes. Others open and write nothing.
      log_period: a console line every this many steps (> 0).
      total_steps: the run's step budget (> 0), for the ETA.
      tokens_per_step: tokens trained per step across all processes (> 0).
      first_step: the first step this logger will write; records with a step
        >= `first_step` already in `metrics.jsonl` are dropped (resume).
      time_fn: monotonic clock in seconds; tests inject a fake one.

    Raises:
      TypeError, ValueError: an argument has the wrong type or range.
    """
    _check_positive_int("log_period", log_period)
    _check_positive_int("total_steps", total_steps)
    _check_positive_int("tokens_per_step", tokens_per_step)
    first_step = _check_step(first_step)
    if not callable(time_fn):
      raise TypeError(f"time_fn must be callable, got {time_fn!r}")
    self._run_dir = os.fspath(run_dir)
    self._is_primary = bool(is_primary)
    self._log_period = int(log_period)
    self._total_steps = int(total_steps)
    self._tokens_per_step = int(tokens_per_step)
    self._time_fn = time_fn
    self._closed = False
    self._jsonl: TextIO | None = None
    self._tb = None
    # Timing: the clock at the previous train write (or at construction), and
    # the time and step count accumulated since the last console line.
    self._last_time = time_fn()
    self._window_seconds = 0.0
    self._window_steps = 0
    if not self._is_primary:
      return
    os.makedirs(self._run_dir, exist_ok=True)
    jsonl_path = os.path.join(self._run_dir, METRICS_FILENAME)
    truncate_jsonl(jsonl_path, first_step)
    self._jsonl = open(jsonl_path, "a", encoding="utf-8")
    # Imported here so that non-primary processes never load it.
    import tensorboardX  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import summary_pb2  # pylint: disable=g-import-not-at-top
    self._summary_pb2 = summary_pb2
    # The plain event file writer: one Summary per record holds all its
    # scalars (SummaryWriter.add_scalar writes one event per scalar, about
    # ten times the host time per step).
    self._tb = tensorboardX.FileWriter(
        os.path.join(self._run_dir, TENSORBOARD_DIRNAME), flush_secs=30)
    # A session start at first_step makes TensorBoard discard the events at
    # steps >= first_step that an interrupted earlier attempt left in older
    # event files.
    self._tb.add_event(event_pb2.Event(
        step=first_step,
        session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

  @property
  def jsonl_path(self) -> str:
    return os.path.join(self._run_dir, METRICS_FILENAME)

  @property
  def tensorboard_dir(self) -> str:
    return os.path.join(self._run_dir, TENSORBOARD_DIRNAME)

  def _convert(self, step: Any, scalars: Any) -> tuple[int, dict[str, int | float]]:
    if self._closed:
      raise RuntimeError("MetricLogger is closed")
    step = _check_step(step)
    if not isinstance(scalars, Mapping):
      raise TypeError(f"scalars must be a mapping, got {type(scalars).__name__}")
    converted = {}
    for name, value in scalars.items():
      if not isinstance(name, str) or not name:
        raise TypeError(f"metric names must be non-empty str, got {name!r}")
      if name in _RESERVED_KEYS:
        raise ValueError(f"metric name {name!r} is reserved")
      converted[name] = _to_host_number(name, value)
    return step, converted

  def write_train(self, step: int, scalars: Mapping[str, Any], *,
                  step_time: float | None = None) -> None:
    """Records one finished training step.

    Adds `step_time_s` and `tokens_per_s` to the record.

    Args:
      step: 0-based index of the step that just finished.
      scalars: metric name -> host scalar (Python/NumPy int or float, or a
        NumPy array of shape () or (1,)). Names "step" and "kind" are
        reserved.
      step_time: the step's time in seconds as the caller measured it (the
        trainer leaves eval time out); None means the clock time since the
        previous train write (or since construction, for the first).

    Raises:
      TypeError, ValueError: a bad step, name, value or step_time (nothing is
        written).
      RuntimeError: the logger is closed.
    """
    step, values = self._convert(step, scalars)
    for key in (STEP_TIME_KEY, TOKENS_PER_SECOND_KEY):
      if key in values:
        raise ValueError(f"metric name {key!r} is reserved for train writes")
    if step_time is not None:
      step_time = _to_host_number("step_time", step_time)
      if not (math.isfinite(step_time) and step_time >= 0):
        raise ValueError(f"step_time must be a finite number >= 0, got {step_time!r}")
    now = self._time_fn()
    if step_time is None:
      step_time = now - self._last_time
    self._last_time = now
    values[STEP_TIME_KEY] = step_time
    values[TOKENS_PER_SECOND_KEY] = (
        self._tokens_per_step / step_time if step_time > 0 else float("inf"))
    self._window_seconds += step_time
    self._window_steps += 1
    if not self._is_primary:
      return
    self._write_record(step, "train", values)
    if step % self._log_period == 0 or step >= self._total_steps - 1:
      self._log_train_line(step, values)

  def _log_train_line(self, step: int, values: Mapping[str, int | float]) -> None:
    mean_step_time = self._window_seconds / self._window_steps
    self._window_seconds = 0.0
    self._window_steps = 0
    remaining = max(self._total_steps - step - 1, 0)
    parts = [f"step {step}/{self._total_steps}"]
    for key, label, fmt in ((LOSS_KEY, "loss", ".4f"),
                            (LEARNING_RATE_KEY, "lr", ".3e"),
                            (GRAD_NORM_KEY, "grad_norm", ".3f")):
      if key in values:
        parts.append(f"{label} {_format_number(values[key], fmt)}")
    tokens_per_s = (self._tokens_per_step / mean_step_time
                    if mean_step_time > 0 else float("inf"))
    parts.append(f"tokens/s {_format_number(tokens_per_s, ',.0f')}")
    parts.append(f"step_time {mean_step_time:.3f}s")
    parts.append(f"ETA {_format_duration(remaining * mean_step_time)}")
    logging.info("%s", " | ".join(parts))

  def write_eval(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Records an evaluation taken after train step `step`.

    Args:
      step: the train step the evaluation follows.
      scalars: metric name -> host scalar, as for `write_train`.

    Raises:
      TypeError, ValueError: a bad step, name or value (nothing is written).
      RuntimeError: the logger is closed.
    """
    step, values = self._convert(step, scalars)
    if not self._is_primary:
      return
    self._write_record(step, "eval", values)
    logging.info("eval after step %d | %s", step, " | ".join(
        f"{k} {_format_number(float(v), '.4f')}" for k, v in values.items()))

  def _write_record(self, step: int, kind: str,
                    values: Mapping[str, int | float]) -> None:
    self._jsonl.write(encode_record(step, kind, values) + "\n")
    self._jsonl.flush()
    value_pb = self._summary_pb2.Summary.Value
    self._tb.add_summary(
        self._summary_pb2.Summary(value=[
            value_pb(tag=f"{kind}/{name}", simple_value=float(value))
            for name, value in values.items()]),
        global_step=step)

  def flush(self) -> None:
    """Pushes buffered TensorBoard events to disk (the JSONL is always flushed)."""
    if self._tb is not None and not self._closed:
      self._tb.flush()

  def close(self) -> None:
    """Flushes and closes every output. Safe to call more than once."""
    if self._closed:
      return
    self._closed = True
    try:
      if self._tb is not None:
        self._tb.close()
    finally:
      if self._jsonl is not None:
        self._jsonl.close()

  def __enter__(self) -> "MetricLogger":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
