"""The profiler as a run listener: traces a window of training steps."""

import jax

from maxtext.listeners import interface


class ProfilerListener(interface.RunListener):
  """Traces steps [start_step, start_step + num_steps) into `trace_dir`.

  The trace starts just before the first step of the window is dispatched
  and stops just before the step after it, so it holds whole steps. A run
  that ends inside the window still writes its trace (`close`).
  """

  name = "profiler"

  def __init__(self, trace_dir: str, start_step: int, num_steps: int):
    self._trace_dir = trace_dir
    self._start = start_step
    self._stop = start_step + num_steps
    self._tracing = False

  def on_step_start(self, step: int) -> None:
    if step == self._start and not self._tracing:
      jax.profiler.start_trace(self._trace_dir)
      self._tracing = True
    elif step == self._stop:
      self.close()

  def close(self) -> None:
    if self._tracing:
      self._tracing = False
      jax.profiler.stop_trace()
