"""The host's work in a paged decoder's rollout, by phase and per decode call.

`profile(rollout)` runs `rollout` (a function that calls
`paged_decoder.generate` once, with programs already compiled) twice:

  timed    The wall and main-thread CPU seconds (`time.thread_time`: the
           host's own work, not XLA's threads) of each phase of the
           engine's loop (`paged_scheduler.Scheduler`'s methods), each second
           counted in the innermost phase running:
             setup        `generate` outside the loop: checks, the weights'
                          cast, the pool, the sampling values, warm-up
             admit        filling free slots: the host's books and the
                          admit program's dispatch
             prefill      writing waiting contexts: their ids placed and
                          the prefill programs dispatched
             decode       a decode call's host values placed and its
                          program dispatched
             wait         `jax.device_get` of a decode call's results: the
                          host blocked until the device has run the call's
                          programs, then the transfer
             bookkeeping  the rest of the loop: the new ids into their
                          rows, finished sequences' slots and pages freed,
                          pages taken for the next chunk
           On an accelerator, "wait" is the device's time the host does
           not overlap; every other phase is host time between the
           device's calls. (On a CPU the device's threads share the cores
           with the host's, so wall seconds there mix the two.)
  counted  The programs launched, by name (`testing/dispatch_counter`:
           JAX's C++ dispatch fast path off, hence a run of its own), the
           arrays moved host->device (`jax.device_put` leaves and host
           values given to a program) and device->host (`jax.device_get`
           leaves and host reads; `testing/transfer_counter`), and the
           programs compiled (`testing/compile_counter`: none, warm).

Both are summed over the rollout and divided by its decode calls.
"""

import collections
import contextlib
import dataclasses
import time
from typing import Any, Callable

import jax

from maxtext.generation import paged_scheduler
from testing import compile_counter
from testing import dispatch_counter
from testing import transfer_counter

PHASES = ("setup", "admit", "prefill", "decode", "wait", "bookkeeping")

# The engine loop's methods and the phase each runs in.
_RUN = paged_scheduler.Scheduler
_METHODS = {
    "fill_slots": "admit",
    "prefill": "prefill",
    "prefill_ahead": "prefill",
    "decode": "decode",
    "collect": "bookkeeping",
    "reserve_chunk": "bookkeeping",
    "stop_after": "bookkeeping",
    "run": "bookkeeping",
    "warm_up": "setup",
}


@dataclasses.dataclass
class HostProfile:
  """One rollout's host work.

  Attributes:
    decode_calls: the rollout's decode program calls.
    wall, cpu: seconds by phase (`PHASES`), wall and main-thread CPU.
    launches: programs launched, by name ("jit(_decode)", ...).
    to_device, to_host: arrays moved each way.
    compiles: programs the backend compiled during the rollout.
    result: the rollout's own result (the timed run's).
  """

  decode_calls: int
  wall: dict
  cpu: dict
  launches: collections.Counter
  to_device: int
  to_host: int
  compiles: int
  result: Any

  def per_call(self, count: float) -> float:
    """`count` (of the whole rollout) per decode call."""
    return count / max(self.decode_calls, 1)


class _Phases:
  """Exclusive wall and CPU seconds by phase: a phase entered inside
  another takes its seconds from the outer one."""

  def __init__(self):
    self.wall = dict.fromkeys(PHASES, 0.0)
    self.cpu = dict.fromkeys(PHASES, 0.0)
    # [phase, wall and CPU at entry, inner phases' wall and CPU]
    self._stack = []

  @contextlib.contextmanager
  def phase(self, name: str):
    """Counts the block's seconds, less its inner phases', in `name`."""
    entry = [name, time.perf_counter(), time.thread_time(), 0.0, 0.0]
    self._stack.append(entry)
    try:
      yield
    finally:
      self._stack.pop()
      wall = time.perf_counter() - entry[1]
      cpu = time.thread_time() - entry[2]
      self.wall[name] += wall - entry[3]
      self.cpu[name] += cpu - entry[4]
      if self._stack:
        self._stack[-1][3] += wall
        self._stack[-1][4] += cpu


def _patch(stack, owner, name, make):
  original = getattr(owner, name)
  setattr(owner, name, make(original))
  stack.callback(setattr, owner, name, original)


def _in_phase(phases: _Phases, name: str):
  def make(original):
    def wrapper(*args, **kwargs):
      with phases.phase(name):
        return original(*args, **kwargs)

    return wrapper

  return make


def _timed(rollout: Callable[[], Any]):
  """(rollout's result, `_Phases`) of one run with the phases timed."""
  phases = _Phases()
  with contextlib.ExitStack() as stack:
    for method, name in _METHODS.items():
      _patch(stack, _RUN, method, _in_phase(phases, name))
    # The decode results' fetch: the only `device_get` the loop makes.
    _patch(stack, jax, "device_get", _in_phase(phases, "wait"))
    with phases.phase("setup"):
      result = rollout()
  return result, phases


def _counted(rollout: Callable[[], Any]):
  """(launch names, host arguments, `Transfers`, compiles) of one run."""
  compile_counter.install()
  start = time.monotonic()
  host_arguments = collections.Counter()
  with transfer_counter.count_transfers() as transfers:
    with dispatch_counter.record_launches(host_arguments) as names:
      rollout()
  compiles = len(compile_counter.backend_compiles_after(start))
  return collections.Counter(names), host_arguments, transfers, compiles


def profile(rollout: Callable[[], Any]) -> HostProfile:
  """Times, then counts, one warm `rollout` (a `paged_decoder.generate`
  call returning its `EngineGeneration`)."""
  result, phases = _timed(rollout)
  launches, host_arguments, transfers, compiles = _counted(rollout)
  return HostProfile(
      decode_calls=result.decode_calls,
      wall=phases.wall,
      cpu=phases.cpu,
      launches=launches,
      to_device=transfers.to_device + sum(host_arguments.values()),
      to_host=transfers.to_host,
      compiles=compiles,
      result=result,
  )


def report(got: HostProfile) -> list[str]:
  """The profile's lines: each phase's seconds and per decode call, the
  launches and transfers per call, and a closing line of the counts."""
  calls = got.decode_calls
  lines = [
      f"host profile: {calls} decode calls; by phase, ms in all and us a "
      "decode call (wall, main-thread CPU)"
  ]
  for name in PHASES:
    lines.append(
        f"  {name:<12} {got.wall[name] * 1e3:>9.1f} {got.cpu[name] * 1e3:>9.1f}"
        f" {got.per_call(got.wall[name]) * 1e6:>9.0f}"
        f" {got.per_call(got.cpu[name]) * 1e6:>9.0f}"
    )
  lines.append(
      "launches a decode call: "
      + ", ".join(
          f"{name} {got.per_call(count):.2f}"
          for name, count in sorted(got.launches.items())
      )
  )
  host = sum(got.cpu[name] for name in PHASES if name != "wait")
  lines.append(
      f"host profile: launches={got.per_call(sum(got.launches.values())):.2f} "
      f"to_device={got.per_call(got.to_device):.2f} "
      f"to_host={got.per_call(got.to_host):.2f} compiles={got.compiles} "
      f"host_cpu_us={got.per_call(host) * 1e6:.0f} (per decode call)"
  )
  return lines
