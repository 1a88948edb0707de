"""The run's directory locks as a run listener: the run's fence, released
last."""

from maxtext.listeners import interface
from maxtext.storage import run_lock


class RunLockListener(interface.RunListener):
  """Holds the run's locks for the run's life.

  It is the run's fence: before every event (so before each step's records,
  MLPerf lines and upload requests) it checks that no other run took over a
  remote lock (which happens only if this run could not refresh it for
  three refresh intervals); if one did, `run_lock.RunLockLost` fences the
  run (see `MultiListener`): nothing more is written there. It is the last
  listener, so the locks are released only after every other output, the
  GCS mirror's final upload included, is done.
  """

  name = "run_lock"

  def __init__(self, locks: run_lock.RunLocks):
    self._locks = locks

  def check_fence(self) -> None:
    self._locks.check()

  def close(self) -> None:
    self._locks.release()
