"""Counts JAX's compilation events: tracing, lowering, backend compiles.

JAX reports the duration of each stage of turning a function into a program
through `jax.monitoring` under "/jax/core/compile/" (jaxpr_trace_duration,
jaxpr_to_mlir_module_duration, backend_compile_duration); a persistent-cache
hit skips the backend compile but not the tracing. `install()` starts
recording the time of every such event in this process; `times()` reads them.
A count of events after some moment (a run's `run_start`) says whether
anything was compiled after it, independently of the machine's speed.
"""

import functools
import threading
import time

from jax import monitoring

PREFIX = "/jax/core/compile/"

_lock = threading.Lock()
_times: list[float] = []


def _on_duration(event: str, duration_s: float, **unused_kwargs) -> None:
  del duration_s
  if event.startswith(PREFIX):
    with _lock:
      _times.append(time.monotonic())


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
