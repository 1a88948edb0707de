"""Fans each run event out to every listener; the one place listener failures
are handled.

The policy, for an exception raised by a listener method:

* A non-critical listener (the GCS mirror) gets a warning and keeps receiving
  events: its trouble is transient and never costs the run anything.
* A critical listener (metrics files, the MLPerf log, the profiler) is taken
  out: it receives no further events (only `close`, whose errors are then
  warnings). The other listeners still get the event, and then the call
  raises `ListenerError` naming the listener, the event and the error. The
  trainer answers it by writing a checkpoint of the last completed step,
  ending the run for the remaining listeners and stopping (train_main: exit
  status 1 with that one line).

An `OSError` (a full disk, a removed directory) is a fact about the
machine, so it is logged as one line; any other exception is a bug and is
logged with its traceback.

A fence (a listener that overrides `check_fence`: the run lock) is asked
before every event, before any listener receives it. When it raises (the
run's directory now belongs to another run), the run is fenced: that event
and every later one reach no listener (no step record, no MLPerf line, no
upload request), the fence's error is logged as one line and raised as it
is, not as a `ListenerError`, so the trainer writes no checkpoint either;
`close` still closes every listener.
"""

from typing import Optional, Sequence

from absl import logging

from maxtext.listeners import interface

_EVENTS = (
    "on_run_start",
    "on_step_start",
    "on_step",
    "on_eval_start",
    "on_eval",
    "on_eval_deferred",
    "on_checkpoint",
    "on_run_end",
)


class ListenerError(RuntimeError):
  """A critical listener failed; the run must stop.

  Attributes:
    listener: the failed listener's name.
    event: the method that failed ("on_step", "close", ...).
    error: the exception it raised.
  """

  def __init__(self, listener: str, event: str, error: BaseException):
    super().__init__(
        f"output {listener!r} failed ({event}): "
        f"{type(error).__name__}: {error}"
    )
    self.listener = listener
    self.event = event
    self.error = error


def _overrides(listener: interface.RunListener, method: str) -> bool:
  return getattr(type(listener), method) is not getattr(
      interface.RunListener, method
  )


class MultiListener(interface.RunListener):
  """Forwards every event to each of its listeners, in order."""

  name = "all"

  def __init__(self, listeners: Sequence[interface.RunListener] = ()):
    self._listeners: list[interface.RunListener] = []
    # Per event, the listeners that override it: the hot path (one step)
    # calls only those.
    self._by_event: dict[str, list[interface.RunListener]] = {
        event: [] for event in _EVENTS
    }
    self._broken: set[int] = set()  # ids of critical listeners taken out.
    self._fences: list[interface.RunListener] = []
    self._fenced: Optional[Exception] = None
    self._closed = False
    for listener in listeners:
      self.add(listener)

  @property
  def listeners(self) -> tuple[interface.RunListener, ...]:
    return tuple(self._listeners)

  def add(self, listener: interface.RunListener) -> None:
    """Adds `listener` last; it receives the events from now on."""
    self._listeners.append(listener)
    if _overrides(listener, "check_fence"):
      self._fences.append(listener)
    for event, receivers in self._by_event.items():
      if _overrides(listener, event):
        receivers.append(listener)

  def _failed(
      self, listener: interface.RunListener, event: str, error: Exception
  ) -> Optional[ListenerError]:
    """Applies the policy to one failure; returns the error to raise, if any."""
    log = (
        logging.warning
        if isinstance(error, OSError) or not listener.critical
        else logging.exception
    )
    if not listener.critical:
      log("Output %r failed (%s), continuing: %s", listener.name, event, error)
      return None
    log("Output %r failed (%s): %s", listener.name, event, error)
    self._broken.add(id(listener))
    for receivers in self._by_event.values():
      if listener in receivers:
        receivers.remove(listener)
    return ListenerError(listener.name, event, error)

  @property
  def fenced(self) -> Optional[Exception]:
    """The fence's error once the run is fenced, else None."""
    return self._fenced

  def _check_fences(self) -> bool:
    """False once fenced; raises the fence's error when it first fails."""
    if self._fenced is not None:
      return False
    for fence in self._fences:
      try:
        fence.check_fence()
      except Exception as e:
        self._fenced = e
        logging.error("Output %r: %s", fence.name, e)
        raise
    return True

  def _dispatch(self, event: str, *args) -> None:
    """Calls `event` on its listeners; raises the first critical failure.

    Raises:
      Exception: a fence's error (see the module docstring).
      ListenerError: the first critical listener that failed.
    """
    if not self._check_fences():
      return
    failure = None
    for listener in tuple(self._by_event[event]):
      try:
        getattr(listener, event)(*args)
      # Any exception: the policy above decides, in this one place.
      except Exception as e:  # pylint: disable=broad-except
        error = self._failed(listener, event, e)
        failure = failure or error
    if failure is not None:
      raise failure

  def on_run_start(self, start: interface.RunStart) -> None:
    self._dispatch("on_run_start", start)

  def on_step_start(self, step: int) -> None:
    self._dispatch("on_step_start", step)

  def on_step(self, record: interface.StepRecord) -> None:
    self._dispatch("on_step", record)

  def on_eval_start(self, step: int, samples: int) -> None:
    self._dispatch("on_eval_start", step, samples)

  def on_eval(self, record: interface.EvalRecord) -> None:
    self._dispatch("on_eval", record)

  def on_eval_deferred(self, point: interface.DeferredEval) -> None:
    self._dispatch("on_eval_deferred", point)

  def on_checkpoint(self, step: int, directory: str) -> None:
    self._dispatch("on_checkpoint", step, directory)

  def on_run_end(self, end: interface.RunEnd) -> None:
    self._dispatch("on_run_end", end)

  def close(self) -> None:
    """Closes every listener, failed ones included, in the order added.

    Raises:
      ListenerError: the first critical listener, not already failed, whose
        close failed (its final writes are lost); every listener was still
        closed.
    """
    if self._closed:
      return
    self._closed = True
    failure = None
    for listener in self._listeners:
      try:
        listener.close()
      # A listener that failed before is closed on a best-effort basis:
      # its error was already reported.
      except Exception as e:  # pylint: disable=broad-except
        if listener.critical and id(listener) not in self._broken:
          failure = failure or self._failed(listener, "close", e)
        else:
          logging.warning("Closing output %r: %s", listener.name, e)
    if failure is not None:
      raise failure
