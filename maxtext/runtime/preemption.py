"""Graceful stops: SIGTERM/SIGINT ask the training loop to stop between steps.

A scheduler that preempts a job sends SIGTERM (a user at a terminal, SIGINT).
The handler only records the request; the training loop finishes the step it is
in, writes a checkpoint, closes its writers and stops. With several processes,
each one may see the signal at a different step, so they agree on the stop step
through JAX's preemption sync point (every process reaches it at the same step)
or, failing that, through a small all-reduce of the local flags.
"""

import signal
import threading
from typing import Optional

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np


class StopRequest:
  """Installs SIGTERM/SIGINT handlers that set a flag; close restores the old.

  Handlers can only be installed from the main thread; elsewhere (a test that
  runs the trainer in a thread) the request is still usable through
  `request()`. The handler only records the request: it runs between any
  two bytecodes of the main thread, possibly in the middle of a write to a
  log stream, where logging again could fail and lose the request. The
  request is logged by `should_stop`, from the loop, when the loop sees it.
  """

  def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
    self._event = threading.Event()
    self._signal_name: Optional[str] = None
    self._announced = False
    self._previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in signals:
        self._previous[sig] = signal.signal(sig, self._handle)
      # A launcher may have started this process with the signals blocked;
      # a blocked signal would stay pending and never stop the run.
      signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)

  def _handle(self, signum, frame):
    del frame
    self._record(signal.Signals(signum).name)

  def _record(self, reason: str) -> None:
    """Notes the first request's reason and sets the flag (no I/O)."""
    if self._signal_name is None:
      self._signal_name = reason
    self._event.set()

  def request(self, reason: str = "request") -> None:
    """Asks the loop to stop after the current step."""
    self._record(reason)

  @property
  def reason(self) -> Optional[str]:
    return self._signal_name

  def local(self) -> bool:
    return self._event.is_set()

  def should_stop(self, step: int) -> bool:
    """Whether every process stops after `step` (a collective with >1 process).

    Args:
      step: the step just completed; every process must call this at every step.
    """
    if jax.process_count() == 1:
      stop = self._event.is_set()
    else:
      flags = multihost_utils.process_allgather(
          np.asarray(self._event.is_set())
      )
      stop = bool(np.any(flags))
      if stop and not self._event.is_set():
        self._record("a peer's stop request")
    if stop and not self._announced:
      self._announced = True
      logging.warning(
          "%s received: stopping after step %d.", self._signal_name, step
      )
    return stop

  def close(self) -> None:
    """Restores the signal handlers that were there before."""
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)
    self._previous = {}
