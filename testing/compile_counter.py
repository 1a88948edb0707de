"""Counts JAX's compilation events: tracing, lowering, backend compiles.

JAX reports the duration of each stage of turning a function into a program
through `jax.monitoring` under "/jax/core/compile/" (jaxpr_trace_duration,
jaxpr_to_mlir_module_duration, backend_compile_duration); a persistent-cache
hit skips the backend compile but not the tracing. `install()` starts
recording the time of every such event in this process; `times()` reads them.
A count of events after some moment (a run's `run_start`) says whether
anything was compiled after it, independently of the machine's speed:
`RunStartCounter` is the run listener that notes that moment.
`backend_compiles_after` names the programs the backend compiled (JAX passes
the function's name with each event), so a test can say which programs, and
how many of each, a piece of code compiles.
"""

import functools
import threading
import time

from jax import monitoring

from maxtext.listeners import interface

PREFIX = "/jax/core/compile/"
BACKEND_COMPILE = PREFIX + "backend_compile_duration"

_lock = threading.Lock()
_times: list[float] = []
# (time.monotonic(), function name) of every backend compilation.
_backend_compiles: list[tuple[float, str]] = []


def _on_duration(
    event: str, duration_s: float, fun_name: str = "?", **unused_kwargs
) -> None:
  del duration_s
  if event.startswith(PREFIX):
    now = time.monotonic()
    with _lock:
      _times.append(now)
      if event == BACKEND_COMPILE:
        _backend_compiles.append((now, fun_name))


@functools.cache
def install() -> None:
  """Starts recording; later calls do nothing (JAX keeps listeners for the
  life of the process, so there is one)."""
  monitoring.register_event_duration_secs_listener(_on_duration)


def times() -> list[float]:
  """`time.monotonic()` of every compilation event since `install()`."""
  with _lock:
    return list(_times)


def count_after(moment: float) -> int:
  """Compilation events later than `moment` (a `time.monotonic()` value)."""
  return sum(1 for t in times() if t > moment)


def backend_compiles_after(moment: float) -> list[str]:
  """The names of the functions the backend compiled after `moment`, in
  order (a persistent-cache hit counts: JAX reports it as a compile)."""
  with _lock:
    return [name for t, name in _backend_compiles if t > moment]


class RunStartCounter(interface.RunListener):
  """A run listener that counts the compilation events after `run_start`.

  Pass it in a run's `extra_listeners`; it installs the recording itself.

  Attributes:
    at: `time.monotonic()` at the run's `run_start`, or None before it.
  """

  def __init__(self):
    install()
    self.at = None

  def on_run_start(self, start: interface.RunStart) -> None:
    del start
    self.at = time.monotonic()

  def count(self) -> int:
    """Compilation events since `run_start`.

    Raises:
      RuntimeError: the run has not reached `run_start`.
    """
    if self.at is None:
      raise RuntimeError("no run_start yet: the run never began its timed part")
    return count_after(self.at)
