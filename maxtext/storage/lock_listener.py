"""The run's directory locks as a run listener: checked each step, released
last."""

from maxtext.listeners import interface
from maxtext.storage import run_lock


class RunLockListener(interface.RunListener):
  """Holds the run's locks for the run's life.

  After every step it checks that no other run took over a remote lock
  (which happens only if this run could not refresh it for three refresh
  intervals); if one did, the run stops after a checkpoint, as for any
  failed output. It is the last listener, so the locks are released only
  after every other output, the GCS mirror's final upload included, is done.
  """

  name = "run_lock"

  def __init__(self, locks: run_lock.RunLocks):
    self._locks = locks

  def on_step(self, record: interface.StepRecord) -> None:
    self._locks.check()

  def close(self) -> None:
    self._locks.release()
