"""Late reports of a checkpoint read or write that already failed, as one line.

When one array of a checkpoint cannot be read or written, orbax fails the
whole restore or save at once: the caller gets one exception, which
`checkpointing` turns into its one-line report (a checkpoint set aside, or a
CheckpointError). Two kinds of late report of the same failure would
otherwise reach stderr with tracebacks, one per array still in flight:

- orbax closes its asyncio event loop while tensorstore still completes the
  other arrays' reads and writes on its own threads. Each completion calls
  `loop.call_soon_threadsafe` on the closed loop; the RuntimeError it raises
  has no Python caller, so it is handed to `sys.unraisablehook` with no
  object (printed as a bare traceback), or, by bindings that print errors
  their own way, to `sys.excepthook`.
- orbax's abandoned read coroutines raise their own read error when they
  are collected, which the interpreter hands to `sys.unraisablehook`.

`install()` wraps both hooks: those two reports become one warning line for
the first and a count at debug level after it; everything else, including
every other uncaught exception, goes to the hook that was there before,
traceback and all.
"""

import sys
import threading
import types

from absl import logging

_ORBAX_PATH = "/orbax/"
_LOOP_CLOSED = "Event loop is closed"


def _is_closed_loop_callback(exc: BaseException, tb) -> bool:
  """A RuntimeError that a closed asyncio loop raised to a foreign thread."""
  if not isinstance(exc, RuntimeError) or str(exc) != _LOOP_CLOSED:
    return False
  # No Python caller: the traceback starts inside asyncio itself.
  return tb is not None and "asyncio" in tb.tb_frame.f_code.co_filename


def _is_orbax_coroutine(obj) -> bool:
  return isinstance(obj, types.CoroutineType) and (
      _ORBAX_PATH in obj.cr_code.co_filename
  )


class _Reports:
  """The late reports seen so far: the first is a warning, the rest debug."""

  def __init__(self):
    self._lock = threading.Lock()
    self.count = 0
    self.installed = False

  def report(self, what: str) -> None:
    """Logs one late report: a warning the first time, then at debug."""
    with self._lock:
      self.count += 1
      count = self.count
    if count == 1:
      logging.warning(
          "A checkpoint read or write that failed is still finishing in the"
          " background (%s); its failure is reported on its own. Further"
          " reports like this are logged at debug level.",
          what,
      )
    else:
      logging.debug("late checkpoint I/O report %d: %s", count, what)

  def claim_install(self) -> bool:
    """True the first time only: the caller then installs the hooks."""
    with self._lock:
      first = not self.installed
      self.installed = True
    return first


_REPORTS = _Reports()


def reports_seen() -> int:
  """How many late reports the hooks have turned into log lines."""
  return _REPORTS.count


def install() -> None:
  """Wraps `sys.excepthook` and `sys.unraisablehook`; a second call is a
  no-op."""
  if not _REPORTS.claim_install():
    return
  previous_excepthook = sys.excepthook
  previous_unraisablehook = sys.unraisablehook

  def excepthook(exc_type, exc, tb):
    if _is_closed_loop_callback(exc, tb):
      _REPORTS.report(f"RuntimeError: {_LOOP_CLOSED}")
      return
    previous_excepthook(exc_type, exc, tb)

  def unraisablehook(unraisable):
    if _is_closed_loop_callback(unraisable.exc_value, unraisable.exc_traceback):
      _REPORTS.report(f"RuntimeError: {_LOOP_CLOSED}")
      return
    if _is_orbax_coroutine(unraisable.object):
      first_line = str(unraisable.exc_value).splitlines()[0:1]
      _REPORTS.report(
          f"{type(unraisable.exc_value).__name__}:"
          f" {first_line[0] if first_line else ''}"
          f" in {unraisable.object.cr_code.co_name}"
      )
      return
    previous_unraisablehook(unraisable)

  sys.excepthook = excepthook
  sys.unraisablehook = unraisablehook
