"""MLPerf Training compliance logging: one `:::MLLOG` file per run attempt.

An `MLLogger` writes the MLCommons log line format (`:::MLLOG {json}`, the JSON
object holding `namespace`, `time_ms`, `event_type`, `key`, `value` and
`metadata` in that order) straight into its own file. It never touches a
process-global `logging.Logger`, so two runs in one process never write into
each other's file, and nothing is left behind after `close()`.

Only process 0 writes. With `enable_mllog` off, or on any other process, the
factory returns a disabled logger whose methods return at once: no file, no
thread, no work. Every line is flushed as it is written, so the staged log
survives a crash of the training process.

The event sequence the MLPerf Training rules (6.0.0 and 6.1.0) demand:

    cache_clear, init_start, submission_info, hyperparameters, init_stop,
    run_start, { block_start, [tracked_stats...], block_stop,
    eval_start, eval_accuracy, eval_stop } ..., run_stop (exactly once)

Values are host Python/NumPy numbers the caller already has; this module never
reads device arrays, so logging adds no device synchronization to a step.

What a log holds is decided elsewhere: the submission fields are checked by
`maxtext.mllog.rules`, the hyperparameter keys and their values from a config
come from `maxtext.mllog.hyperparameters` (whose names callers use are
re-exported here).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional, TextIO

from absl import logging
import numpy as np

from maxtext.core import checks
from maxtext.mllog import hyperparameters as mllog_config
from maxtext.mllog import mlperf_config
from maxtext.mllog import rules
from maxtext.storage import build_info as build_info_lib

REQUIRED_HYPERPARAMETERS = mllog_config.REQUIRED_HYPERPARAMETERS
hyperparameters_from_config = mllog_config.hyperparameters_from_config

# Event types of the MLCommons log format.
INTERVAL_START = "INTERVAL_START"
INTERVAL_END = "INTERVAL_END"
POINT_IN_TIME = "POINT_IN_TIME"

LINE_PREFIX = ":::MLLOG "


def read_events(path: str) -> list[dict[str, Any]]:
  """The `:::MLLOG` events of the log at `path`, each a dict (key, value,
  metadata, ...), in order; other lines are skipped."""
  with open(path, encoding="utf-8") as f:
    return [
        json.loads(line[len(LINE_PREFIX) :])
        for line in f
        if line.startswith(LINE_PREFIX)
    ]


# The event whose metadata names the source the run was built from
# (`git_revision`, `git_revision_source`, see maxtext.storage.build_info). The
# checker allows unknown keys today, but a submission key every ruleset
# requires exactly once cannot be rejected by a stricter checker and is read
# from one place.
REVISION_EVENT = "submission_platform"
REVISION_METADATA = "git_revision"

# The submission events, in the order they are logged; each key is also the
# config field its value comes from.
SUBMISSION_KEYS = tuple(mlperf_config.MlperfConfig().submission())

# `run_stop` statuses.
SUCCESS = "success"
ABORTED = "aborted"


def next_attempt_path(path: str) -> str:
  """Returns the first free log path of a run: `path`, then `stem.N.ext`.

  `mllog.log` is the first attempt's log; a resumed run writes `mllog.2.log`,
  then `mllog.3.log`, so each attempt's file is one complete sequence.

  Args:
    path: the first attempt's log path, e.g. `<run dir>/mllog.log`.
  """
  if not path:
    raise ValueError(f"mllog path must be a non-empty path, got {path!r}")
  if not os.path.exists(path):
    return path
  stem, ext = os.path.splitext(path)
  attempt = 2
  while os.path.exists(f"{stem}.{attempt}{ext}"):
    attempt += 1
  return f"{stem}.{attempt}{ext}"


def default_log_path(mlperf: mlperf_config.MlperfConfig, run_dir: str) -> str:
  """The first attempt's log: `mllog_file` or `<run_dir>/mllog.log`."""
  return mlperf.mllog_file or os.path.join(run_dir, "mllog.log")


def attempt_paths(path: str) -> list[str]:
  """Returns the existing log files of a run's attempts, first attempt first."""
  found = []
  if os.path.exists(path):
    found.append(path)
  stem, ext = os.path.splitext(path)
  attempt = 2
  while os.path.exists(f"{stem}.{attempt}{ext}"):
    found.append(f"{stem}.{attempt}{ext}")
    attempt += 1
  return found


_PLAIN_TYPES = (bool, str, int, float, type(None))


def _to_json_value(name: str, value: Any) -> Any:
  """Returns `value` as a JSON-ready host value, or raises naming `name`."""
  if type(value) in _PLAIN_TYPES:  # The common case, checked first.
    return value
  if isinstance(value, np.generic) or (
      isinstance(value, np.ndarray) and value.ndim == 0
  ):
    return value.item()
  if isinstance(value, (dict, Mapping)):
    return {str(k): _to_json_value(f"{name}/{k}", v) for k, v in value.items()}
  if isinstance(value, _PLAIN_TYPES):  # Subclasses, e.g. IntEnum.
    return value
  if isinstance(value, (list, tuple)):
    return [_to_json_value(f"{name}[{i}]", v) for i, v in enumerate(value)]
  raise TypeError(
      f"MLPerf log value {name!r} must be a host scalar (Python or NumPy), "
      f"str, list or dict; got {type(value).__name__}. Device arrays are "
      "rejected so that logging never waits for the device."
  )


class MLLogger:
  """Writes one run attempt's MLPerf log; a disabled instance does nothing.

  Create it with `create_mllogger`. All methods are safe to call on a disabled
  logger. Writing is serialized by a reentrant lock, so `run_stop` may be
  called from a signal handler that interrupted another event. An `OSError`
  while writing (disk full, ...) is raised to the caller, with the log's path
  as its filename, and the logger is disabled: the log is incomplete from
  there on, so the run must not pass for one with a log. (A signal handler
  that calls `run_stop` catches it.)
  """

  def __init__(
      self,
      file: Optional[TextIO],
      path: Optional[str],
      submission: Optional[Mapping[str, str]] = None,
      time_fn: Callable[[], float] = time.time,
      build: Optional[build_info_lib.BuildInfo] = None,
  ):
    """Wraps an open file; use `create_mllogger` or `MLLogger.disabled()`.

    Args:
      file: a text file opened for writing, or None for a disabled logger.
      path: the file's path (reported by `path`), or None.
      submission: the five `submission_*` values, keyed by their log key.
      time_fn: seconds since the epoch; injectable for tests.
      build: the source the run was built from, written into the metadata
        of `REVISION_EVENT`; None writes no revision.
    """
    if build is not None and not isinstance(build, build_info_lib.BuildInfo):
      raise TypeError(
          f"build must be a build_info.BuildInfo, got {type(build).__name__}"
      )
    self._file = file
    self._path = path
    self._submission = dict(submission or {})
    self._revision = (
        {}
        if build is None
        else {
            REVISION_METADATA: build.git_revision,
            "git_revision_source": build.source,
        }
    )
    self._time_fn = time_fn
    self._lock = threading.RLock()
    self._logged_hparams: set[str] = set()
    self._in_block = False
    self._run_stopped = False
    # The newest samples_count any event reported; run_stop's default.
    self._samples_count = 0

  @classmethod
  def disabled(cls) -> "MLLogger":
    """A logger that writes nothing."""
    return cls(None, None)

  @property
  def enabled(self) -> bool:
    return self._file is not None

  @property
  def path(self) -> Optional[str]:
    """The log file of this attempt, or None when disabled."""
    return self._path

  @property
  def run_stopped(self) -> bool:
    return self._run_stopped

  # --- low level -----------------------------------------------------------

  def event(
      self,
      key: str,
      value: Any = None,
      metadata: Optional[Mapping[str, Any]] = None,
      event_type: str = POINT_IN_TIME,
  ) -> None:
    """Writes one log line (any key); the named methods below call this.

    Raises:
      OSError: the line could not be written; it names the log file. The
        logger is disabled from then on.
    """
    if self._file is None:
      return
    if event_type not in (INTERVAL_START, INTERVAL_END, POINT_IN_TIME):
      raise ValueError(
          f"event_type must be an MLLOG event type, got {event_type!r}"
      )
    self._write(
        key,
        _to_json_value(key, value),
        _to_json_value(f"{key}.metadata", metadata or {}),
        event_type,
    )

  def _write(
      self, key: str, value: Any, metadata: dict[str, Any], event_type: str
  ) -> None:
    """Formats and writes one line; `value` and `metadata` are JSON-ready."""
    # The caller's frame, for its file and line; sys._getframe is the
    # documented cheap way to get it (inspect.stack reads source files).
    caller = sys._getframe(1)  # pylint: disable=protected-access
    while caller.f_code.co_filename == __file__ and caller.f_back is not None:
      caller = caller.f_back
    meta = {"file": caller.f_code.co_filename, "lineno": caller.f_lineno}
    meta.update(metadata)
    # Field order as in the MLCommons format; dicts keep insertion order.
    record = {
        "namespace": "",
        "time_ms": int(self._time_fn() * 1e3),
        "event_type": event_type,
        "key": key,
        "value": value,
        "metadata": meta,
    }
    line = LINE_PREFIX + json.dumps(record) + "\n"
    with self._lock:
      if self._file is None:
        return
      try:
        self._file.write(line)
        self._file.flush()
      except OSError as e:
        # A run asked for an MLPerf log has lost it: that is the caller's
        # failure to handle (the run listener stops the run after a
        # checkpoint), not a warning. The file is let go first, so later
        # events, `run_stop` included, do nothing.
        file, self._file = self._file, None
        try:
          file.close()
        except OSError:
          pass  # Its buffered bytes hit the same error, raised below.
        raise OSError(e.errno, e.strerror or str(e), self._path) from e

  # --- init phase ------------------------------------------------------------

  def cache_clear(self, flushed: bool = False) -> None:
    """Logs `cache_clear`: True only for a flush that really happened.

    Args:
      flushed: whether the caches were flushed on every host (see
        `maxtext.mllog.cache_flush`); the default claims nothing.
    """
    if not isinstance(flushed, (bool, np.bool_)):
      raise TypeError(
          f"cache_clear flushed must be a bool, got "
          f"{type(flushed).__name__}"
      )
    self.event("cache_clear", bool(flushed))

  def init_start(self) -> None:
    self.event("init_start", None, event_type=INTERVAL_START)

  def submission_info(self) -> None:
    """Logs org, platform, division, status and benchmark from the config.

    The platform's event also names the source revision (see
    `REVISION_EVENT`), when the logger was given one.
    """
    for key in SUBMISSION_KEYS:
      self.event(
          key,
          self._submission.get(key),
          self._revision if key == REVISION_EVENT else None,
      )

  def hyperparameters(self, values: Mapping[str, Any]) -> None:
    """Logs hyperparameter events, one line per key, in the mapping's order.

    Args:
      values: key -> host value. Must hold every key of
        `REQUIRED_HYPERPARAMETERS` (see `hyperparameters_from_config`); extra
        keys are logged too.

    Raises:
      ValueError: a required key is missing, a key was already logged by this
        logger, or a value is outside what the rules accept
        (`hyperparameters.check_values`).
      TypeError: a value is not a host scalar/str, or a count is no int.
    """
    if self._file is None:
      return
    mllog_config.check_values(values)
    repeated = sorted(set(values) & self._logged_hparams)
    if repeated:
      raise ValueError(f"hyperparameters {repeated} were already logged")
    converted = [(k, _to_json_value(k, v)) for k, v in values.items()]
    for key, value in converted:
      self.event(key, value)
    self._logged_hparams.update(values)

  def init_stop(self) -> None:
    self.event("init_stop", None, event_type=INTERVAL_END)

  # --- run phase -------------------------------------------------------------

  def run_start(self) -> None:
    self.event("run_start", None, event_type=INTERVAL_START)

  def block_start(
      self,
      samples_count: int,
      *,
      epoch_count: Optional[int] = None,
      first_epoch_num: Optional[int] = None,
  ) -> None:
    """Opens a training block; `samples_count`: samples trained so far."""
    if self._file is None:
      return
    meta = {"samples_count": self._note_samples(samples_count)}
    if epoch_count is not None or first_epoch_num is not None:
      if epoch_count is None or first_epoch_num is None:
        raise ValueError(
            "block_start needs both epoch_count and "
            "first_epoch_num, or neither"
        )
      meta["epoch_count"] = checks.check_int("epoch_count", epoch_count, 1)
      meta["first_epoch_num"] = checks.check_int(
          "first_epoch_num", first_epoch_num, 0
      )
    self._in_block = True
    self.event("block_start", None, meta, INTERVAL_START)

  def block_stop(self, samples_count: int) -> None:
    """Closes the open training block (no-op when none is open)."""
    if self._file is None or not self._in_block:
      return
    self._in_block = False
    self._counted_event("block_stop", samples_count, INTERVAL_END)

  def eval_start(self, samples_count: int) -> None:
    self._counted_event("eval_start", samples_count, INTERVAL_START)

  def eval_accuracy(self, value: float, samples_count: int) -> None:
    """Logs the eval metric (mean eval loss, nats/token) at `samples_count`."""
    if self._file is None:
      return
    # A non-finite loss is still the run's result, so it is logged as is.
    value = checks.check_number("eval_accuracy value", value, finite=False)
    self._counted_event("eval_accuracy", samples_count, POINT_IN_TIME, value)

  def eval_stop(self, samples_count: int) -> None:
    self._counted_event("eval_stop", samples_count, INTERVAL_END)

  def _counted_event(
      self, key: str, samples_count: int, event_type: str, value: Any = None
  ) -> None:
    """Logs `key` with `samples_count` in its metadata (run_stop's default).

    A disabled logger checks nothing: its events cost no work.
    """
    if self._file is None:
      return
    self.event(
        key,
        value,
        {"samples_count": self._note_samples(samples_count)},
        event_type,
    )

  def tracked_stats(
      self,
      step: int,
      stats: Mapping[str, Any],
      samples_count: Optional[int] = None,
  ) -> None:
    """Logs per-step statistics (host values, e.g. loss and step time).

    Args:
      step: the training step the statistics belong to.
      stats: name -> host scalar; device arrays are rejected (TypeError).
      samples_count: samples trained when the statistics were taken, added
        to the metadata when given.
    """
    if self._file is None:
      return
    meta = {"step": checks.check_int("step", step, 0)}
    if samples_count is not None:
      meta["samples_count"] = checks.check_int(
          "samples_count", samples_count, 0
      )
    self._write(
        "tracked_stats",
        _to_json_value("tracked_stats", stats),
        meta,
        POINT_IN_TIME,
    )

  def run_stop(
      self,
      status: str,
      samples_count: Optional[int] = None,
      metadata: Optional[Mapping[str, Any]] = None,
  ) -> bool:
    """Logs `run_stop` once per logger; later calls do nothing.

    An open training block is closed first, so block events stay paired.

    Args:
      status: `SUCCESS` ("success") or `ABORTED` ("aborted").
      samples_count: samples trained in total; defaults to the newest
        samples_count an earlier event reported.
      metadata: more metadata, after `status` and `samples_count` (e.g. a
        deferred evaluation's checkpoint).

    Returns:
      True if this call wrote `run_stop`.

    Raises:
      OSError: the line could not be written (see `event`); later calls
        return False.
    """
    if status not in (SUCCESS, ABORTED):
      raise ValueError(
          f"run_stop status must be {SUCCESS!r} or {ABORTED!r},"
          f" got {status!r}"
      )
    with self._lock:
      if self._file is None or self._run_stopped:
        return False
      self._run_stopped = True
      if samples_count is None:
        samples_count = self._samples_count
      self.block_stop(samples_count)
      self.event(
          "run_stop",
          None,
          {
              "status": status,
              "samples_count": self._note_samples(samples_count),
              **(metadata or {}),
          },
          INTERVAL_END,
      )
      return True

  def _note_samples(self, samples_count: Any) -> int:
    self._samples_count = checks.check_int("samples_count", samples_count, 0)
    return self._samples_count

  def close(self) -> None:
    """Closes the file; later events are dropped. Safe to call twice."""
    with self._lock:
      self._close_file()

  def _close_file(self) -> None:
    if self._file is not None:
      try:
        self._file.close()
      except OSError as e:
        logging.warning("MLPerf log %s: close failed: %s", self._path, e)
      self._file = None

  def __enter__(self) -> "MLLogger":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def create_mllogger(
    mlperf: mlperf_config.MlperfConfig,
    path: str,
    *,
    process_index: Optional[int] = None,
    time_fn: Callable[[], float] = time.time,
    build: Optional[build_info_lib.BuildInfo] = None,
) -> MLLogger:
  """Returns the run attempt's logger (disabled when off or not process 0).

  Args:
    mlperf: the log's settings: `enable_mllog` and the fields
      `rules.validate_submission` reads.
    path: the first attempt's log path (e.g. `<run dir>/mllog.log`); this
      attempt writes to `next_attempt_path(path)`, see `MLLogger.path`.
    process_index: this process's index; defaults to `jax.process_index()`.
    time_fn: seconds since the epoch; injectable for tests.
    build: the source the run was built from, logged with
      `submission_info` (pass the BuildInfo the run's config.json records);
      default `build_info.loaded()`, asked only for an enabled logger.

  Returns:
    An enabled `MLLogger`, or a disabled one when `enable_mllog` is off or
    this is not process 0.

  Raises:
    ValueError: a submission field the official checker rejects, or the log
      file cannot be created (the message names `mllog_file`, the path and
      the OS error).
    TypeError: `build` is not a BuildInfo.
  """
  if not mlperf.enable_mllog:
    return MLLogger.disabled()
  rules.validate_submission(mlperf)
  if process_index is None:
    # Imported only here: a caller that passes process_index never loads jax.
    import jax  # pylint: disable=import-outside-toplevel

    process_index = jax.process_index()
  if process_index != 0:
    return MLLogger.disabled()
  if build is None:
    build = build_info_lib.loaded()
  elif not isinstance(build, build_info_lib.BuildInfo):
    # Checked before the file exists, so a bad argument leaves no log.
    raise TypeError(
        f"build must be a build_info.BuildInfo, got {type(build).__name__}"
    )
  file, attempt_path = _create_attempt_file(path, mlperf.mllog_file)
  return MLLogger(file, attempt_path, mlperf.submission(), time_fn, build)


def _create_attempt_file(path: str, mllog_file: str) -> tuple[TextIO, str]:
  """Creates this attempt's log file next to `path`: (its file, its path).

  Raises:
    ValueError: it cannot be created (naming `mllog_file`, the path and the
      OS error).
  """
  try:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # Exclusive create: a concurrent attempt that took the same name makes us
    # move on to the next free one instead of interleaving two sequences.
    for _ in range(100):
      attempt_path = next_attempt_path(path)
      try:
        # The MLLogger made of it holds the file open and closes it.
        file = open(  # pylint: disable=consider-using-with
            attempt_path, "x", encoding="utf-8"
        )
        return file, attempt_path
      except FileExistsError:
        continue
    raise OSError(f"no free attempt file name next to {path}")
  except OSError as e:
    # A run asked to write an MLPerf log must not train without one.
    raise ValueError(
        f"config.mllog_file={mllog_file!r}: the MLPerf "
        f"log {path} cannot be created: {e.strerror or e}"
    ) from e
