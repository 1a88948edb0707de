"""The GCS mirror as a run listener: asks for an upload after every event."""

from maxtext.listeners import interface
from maxtext.storage import gcs_mirror


class MirrorListener(interface.RunListener):
  """Requests a mirror pass whenever the run has written something new.

  `GcsMirror.request_sync` only flags the background uploader (passes are
  coalesced and spaced by the mirror), so calling it after every event costs
  the loop nothing. Not critical: GCS trouble is a warning, never a stopped
  run, and the local run directory keeps everything.
  """

  name = "gcs_mirror"
  critical = False

  def __init__(self, mirror: gcs_mirror.GcsMirror):
    self._mirror = mirror

  def on_run_start(self, start: interface.RunStart) -> None:
    self._mirror.request_sync()

  def on_step(self, record: interface.StepRecord) -> None:
    self._mirror.request_sync()

  def on_eval(self, record: interface.EvalRecord) -> None:
    self._mirror.request_sync()

  def on_checkpoint(self, step: int, directory: str) -> None:
    self._mirror.request_sync()

  def on_run_end(self, end: interface.RunEnd) -> None:
    self._mirror.request_sync()

  def close(self) -> None:
    """Runs the final, bounded upload pass."""
    self._mirror.close()
