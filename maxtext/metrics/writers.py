"""Writes per-step training and eval metrics: console, JSON lines, TensorBoard.

One `MetricLogger` serves one run. The trainer reduces each step's metrics
buffer to host scalars and hands them over with `write_train` / `write_eval`;
the logger never touches device arrays, so writing cannot stall the device.

Outputs, written only by the primary process (process 0):

* a console line (absl `logging.info`) every `log_period` steps and on the last
  step: step, loss, learning rate, gradient norm, tokens/s (with a
  `throughput` also samples/s, TFLOP/s per device and MFU when the peak is
  known), step time, ETA;
* `<run_dir>/metrics.jsonl`: one JSON object per line and per write, in the
  format of `maxtext.metrics.jsonl` (non-finite values as "NaN",
  "Infinity", "-Infinity"); the file is flushed after every line, so a
  crashed process loses nothing;
* TensorBoard scalars under `<run_dir>/tensorboard`, tagged `<kind>/<name>`,
  one event (one `Summary` of all its values) per write.

Train records carry `step_time_s` and `tokens_per_s`; a logger given the run's
`throughput.StepThroughput` adds `samples_per_s`, `tflops_per_device` and,
where the devices' peak is known, `mfu` (a fraction), to the JSONL and
TensorBoard records alike (`maxtext.metrics.throughput` states the FLOP
convention).

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
import contextlib
import datetime
import math
import numbers
import os
import time
from typing import Any, TextIO

from absl import logging
import numpy as np

from maxtext.core import checks
from maxtext.metrics import event_file
from maxtext.metrics import jsonl
from maxtext.metrics import throughput as throughput_lib

TENSORBOARD_DIRNAME = "tensorboard"
# Seconds between syncs of the TensorBoard event file to the disk.
_TB_FLUSH_SECONDS = 30.0

# The console line's figures, in order: (record key, label, format). A key
# the step's figures lack is left out of the line.
_CONSOLE_FIGURES = (
    (jsonl.LOSS_KEY, "loss", ".4f"),
    (jsonl.LEARNING_RATE_KEY, "lr", ".3e"),
    (jsonl.GRAD_NORM_KEY, "grad_norm", ".3f"),
    (jsonl.TOKENS_PER_SECOND_KEY, "tokens/s", ",.0f"),
    (throughput_lib.SAMPLES_PER_SECOND_KEY, "samples/s", ",.1f"),
    (throughput_lib.TFLOPS_PER_DEVICE_KEY, "TFLOP/s/device", ".4g"),
    (throughput_lib.MFU_KEY, "MFU", ".1%"),
)
# Names a train write adds itself; metrics may not use them.
_TRAIN_TIMING_KEYS = jsonl.TIMING_KEYS - {jsonl.EVAL_TIME_KEY}


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
      "jax.device_get before logging"
  )


def _seconds(name: str, value: Any) -> float:
  """`value` as a duration: a finite number >= 0, or raises naming it."""
  seconds = _to_host_number(name, value)
  if not (math.isfinite(seconds) and seconds >= 0):
    raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
  return seconds


def _format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  return str(datetime.timedelta(seconds=round(seconds)))


def _format_number(value: float, fmt: str) -> str:
  return format(value, fmt) if math.isfinite(value) else str(value)


def _check_throughput(
    throughput: throughput_lib.StepThroughput | None, tokens_per_step: int
) -> None:
  """Raises TypeError or ValueError unless `throughput` is None or a
  StepThroughput of `tokens_per_step` tokens per step."""
  if throughput is None:
    return
  if not isinstance(throughput, throughput_lib.StepThroughput):
    raise TypeError(
        "throughput must be a throughput.StepThroughput or "
        f"None, got {throughput!r}"
    )
  if throughput.tokens_per_step != tokens_per_step:
    raise ValueError(
        f"throughput.tokens_per_step ({throughput.tokens_per_step}) must "
        f"equal tokens_per_step ({tokens_per_step})"
    )


def _open_jsonl(path: str, first_step: int) -> TextIO:
  """metrics.jsonl at `path` opened for appending, its records at steps >=
  `first_step` dropped first (an earlier attempt's, on a resume)."""
  jsonl.truncate_jsonl(path, first_step)
  # Held open for the logger's life and closed by MetricLogger.close().
  return open(path, "a", encoding="utf-8")


class _TensorBoardEvents:
  """The run's TensorBoard event file (primary process only).

  Each record is one event whose Summary holds all its scalars (one event
  per scalar costs about ten times the host time per step). Events reach
  the disk every _TB_FLUSH_SECONDS (a flush syncs the file), at `flush()`
  and at `close()`.
  """

  def __init__(self, directory: str, first_step: int):
    """Opens a new event file in `directory` whose session starts at
    `first_step`: TensorBoard then discards the events at steps >=
    `first_step` that an interrupted earlier attempt left in older event
    files."""
    # Imported here so that non-primary processes never load tensorboardX.
    from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
    # Imported here for the same reason.
    from tensorboardX.proto import summary_pb2  # pylint: disable=import-outside-toplevel

    self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
    self._file = event_file.EventFile(
        directory,
        event_pb2.Event(
            wall_time=time.time(), file_version="brain.Event:2"
        ).SerializeToString(),
    )
    self._file.write(
        event_pb2.Event(
            step=first_step,
            wall_time=time.time(),
            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START),
        ).SerializeToString()
    )
    # Real time, not time_fn: the flush cadence is no metric.
    self._flushed_at = time.monotonic()

  def write(
      self, step: int, kind: str, values: Mapping[str, int | float]
  ) -> None:
    """Appends the record's event: each value tagged `<kind>/<name>`."""
    value_pb = self._summary_pb2.Summary.Value
    self._file.write(
        self._event_pb2.Event(
            step=step,
            wall_time=time.time(),
            summary=self._summary_pb2.Summary(
                value=[
                    value_pb(tag=f"{kind}/{name}", simple_value=float(value))
                    for name, value in values.items()
                ]
            ),
        ).SerializeToString()
    )
    if time.monotonic() - self._flushed_at >= _TB_FLUSH_SECONDS:
      self.flush()

  def flush(self) -> None:
    self._file.flush()
    self._flushed_at = time.monotonic()

  def close(self) -> None:
    self._file.close()


class MetricLogger:
  """Console, JSONL and TensorBoard writer for one run (see module docstring).

  Not thread-safe: one training loop calls it.
  """

  def __init__(
      self,
      run_dir: str | os.PathLike[str],
      *,
      is_primary: bool,
      log_period: int,
      total_steps: int,
      tokens_per_step: int,
      first_step: int = 0,
      throughput: throughput_lib.StepThroughput | None = None,
      time_fn: Callable[[], float] = time.monotonic,
  ):
    """Opens the outputs (primary process only).

    Args:
      run_dir: local run directory; created if missing.
      is_primary: whether this process writes. Others open and write nothing.
      log_period: a console line every this many steps (> 0).
      total_steps: the run's step budget (> 0), for the ETA.
      tokens_per_step: tokens trained per step across all processes (> 0).
      first_step: the first step this logger will write; records with a step
        >= `first_step` already in `metrics.jsonl` are dropped (resume).
      throughput: the run's per-step throughput constants; when given, train
        records and console lines add samples/s, TFLOP/s per device and MFU
        (MFU only where its peak is known). Its `tokens_per_step` must equal
        `tokens_per_step`.
      time_fn: monotonic clock in seconds; tests inject a fake one.

    Raises:
      TypeError, ValueError: an argument has the wrong type or range.
    """
    checks.check_int("log_period", log_period, 1)
    checks.check_int("total_steps", total_steps, 1)
    checks.check_int("tokens_per_step", tokens_per_step, 1)
    first_step = checks.check_int("first_step", first_step, 0)
    if not callable(time_fn):
      raise TypeError(f"time_fn must be callable, got {time_fn!r}")
    _check_throughput(throughput, tokens_per_step)
    self._throughput = throughput
    self._run_dir = os.fspath(run_dir)
    self._is_primary = bool(is_primary)
    self._log_period = int(log_period)
    self._total_steps = int(total_steps)
    self._tokens_per_step = int(tokens_per_step)
    self._time_fn = time_fn
    self._closed = False
    self._jsonl: TextIO | None = None
    self._tb: _TensorBoardEvents | None = None
    # Timing: the clock at the previous train write (or at construction), and
    # the time and step count accumulated since the last console line.
    self._last_time = time_fn()
    self._window_seconds = 0.0
    self._window_steps = 0
    if not self._is_primary:
      return
    os.makedirs(self._run_dir, exist_ok=True)
    self._jsonl = _open_jsonl(self.jsonl_path, first_step)
    self._tb = _TensorBoardEvents(self.tensorboard_dir, first_step)

  @staticmethod
  @contextlib.contextmanager
  def _naming(path: str):
    """Re-raises an OSError with `path` as its file name, so that the one
    line a failed output gets says which file could not be written."""
    try:
      yield
    except OSError as e:
      if e.filename:
        raise
      raise OSError(e.errno, e.strerror or str(e), path) from e

  @property
  def jsonl_path(self) -> str:
    return os.path.join(self._run_dir, jsonl.METRICS_FILENAME)

  @property
  def tensorboard_dir(self) -> str:
    return os.path.join(self._run_dir, TENSORBOARD_DIRNAME)

  def _convert(
      self, step: Any, scalars: Any
  ) -> tuple[int, dict[str, int | float]]:
    """The checked step and the scalars as host numbers, for a record."""
    if self._closed:
      raise RuntimeError("MetricLogger is closed")
    step = checks.check_int("step", step, 0)
    if not isinstance(scalars, Mapping):
      raise TypeError(
          f"scalars must be a mapping, got {type(scalars).__name__}"
      )
    converted = {}
    for name, value in scalars.items():
      if not isinstance(name, str) or not name:
        raise TypeError(f"metric names must be non-empty str, got {name!r}")
      if name in jsonl.RESERVED_KEYS:
        raise ValueError(f"metric name {name!r} is reserved")
      converted[name] = _to_host_number(name, value)
    return step, converted

  def write_train(
      self,
      step: int,
      scalars: Mapping[str, Any],
      *,
      step_time: float | None = None,
      data_wait: float | None = None,
  ) -> None:
    """Records one finished training step.

    Adds `step_time_s` and `tokens_per_s` to the record, with a `data_wait`
    also `data_wait_s`, and with a `throughput` also `samples_per_s`,
    `tflops_per_device` and `mfu` (when known).

    Args:
      step: 0-based index of the step that just finished.
      scalars: metric name -> host scalar (Python/NumPy int or float, or a
        NumPy array of shape () or (1,)). Names "step" and "kind" are
        reserved.
      step_time: the step's time in seconds as the caller measured it (the
        trainer leaves eval time out); None means the clock time since the
        previous train write (or since construction, for the first).
      data_wait: seconds of the step's time spent waiting for the data set;
        None leaves `data_wait_s` out of the record.

    Raises:
      TypeError, ValueError: a bad step, name, value, step_time or
        data_wait (nothing is written).
      RuntimeError: the logger is closed.
    """
    step, values = self._convert(step, scalars)
    reserved = _TRAIN_TIMING_KEYS.intersection(values)
    if reserved:
      raise ValueError(
          f"metric name {min(reserved)!r} is reserved for train writes"
      )
    if step_time is not None:
      step_time = _seconds("step_time", step_time)
    if data_wait is not None:
      values[jsonl.DATA_WAIT_KEY] = _seconds("data_wait", data_wait)
    now = self._time_fn()
    if step_time is None:
      step_time = now - self._last_time
    self._last_time = now
    values[jsonl.STEP_TIME_KEY] = step_time
    if self._throughput is not None:
      values.update(self._throughput.figures(step_time))
    else:
      values[jsonl.TOKENS_PER_SECOND_KEY] = (
          self._tokens_per_step / step_time if step_time > 0 else float("inf")
      )
    self._window_seconds += step_time
    self._window_steps += 1
    if not self._is_primary:
      return
    self._write_record(step, jsonl.TRAIN, values)
    if step % self._log_period == 0 or step >= self._total_steps - 1:
      self._log_train_line(step, values)

  def _log_train_line(
      self, step: int, values: Mapping[str, int | float]
  ) -> None:
    """Logs the console line of `step` with the window's mean step time."""
    mean_step_time = self._window_seconds / self._window_steps
    self._window_seconds = 0.0
    self._window_steps = 0
    remaining = max(self._total_steps - step - 1, 0)
    tokens_per_s = (
        self._tokens_per_step / mean_step_time
        if mean_step_time > 0
        else float("inf")
    )
    figures = {**values, jsonl.TOKENS_PER_SECOND_KEY: tokens_per_s}
    if self._throughput is not None:
      figures.update(self._throughput.figures(mean_step_time))
    parts = [f"step {step}/{self._total_steps}"]
    for key, label, fmt in _CONSOLE_FIGURES:
      if key in figures:
        parts.append(f"{label} {_format_number(figures[key], fmt)}")
    parts.append(f"step_time {mean_step_time:.3f}s")
    parts.append(f"ETA {_format_duration(remaining * mean_step_time)}")
    logging.info("%s", " | ".join(parts))

  def write_eval(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Records an evaluation taken after train step `step`.

    Args:
      step: the train step the evaluation follows.
      scalars: metric name -> host scalar, as for `write_train`; every name
        starts with "eval_" (the `jsonl` schema: the eval loss is
        "eval_loss").

    Raises:
      TypeError, ValueError: a bad step, name or value, or a name without the
        "eval_" prefix (nothing is written).
      RuntimeError: the logger is closed.
    """
    step, values = self._convert(step, scalars)
    for name in values:
      if not name.startswith(jsonl.EVAL_PREFIX):
        raise ValueError(
            f"eval metric name {name!r} must start with {jsonl.EVAL_PREFIX!r} "
            f"(e.g. {jsonl.EVAL_LOSS_KEY!r})"
        )
    if not self._is_primary:
      return
    self._write_record(step, jsonl.EVAL, values)
    logging.info(
        "eval after step %d | %s",
        step,
        " | ".join(
            f"{k} {_format_number(float(v), '.4f')}" for k, v in values.items()
        ),
    )

  def _write_record(
      self, step: int, kind: str, values: Mapping[str, int | float]
  ) -> None:
    """Appends one record to the JSONL file and to the TensorBoard events."""
    with self._naming(self.jsonl_path):
      self._jsonl.write(jsonl.encode_record(step, kind, values) + "\n")
      self._jsonl.flush()
    self._tb.write(step, kind, values)

  def flush(self) -> None:
    """Pushes buffered TensorBoard events to disk (the JSONL always is)."""
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
        with self._naming(self.jsonl_path):
          self._jsonl.close()

  def __enter__(self) -> "MetricLogger":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
