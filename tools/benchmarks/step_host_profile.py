r"""Benchmark: the host work of one trainer step, by component, with counts.

Runbook:

  tools/bazel run //tools/benchmarks:step_host_profile -- [--steps=120]
      [--count_steps=30] [--skip_steps=10]
  # Another model or config: any --config.x override of configs/default.py.

`engine_bench` says how much slower the trainer's step is than a bare jitted
loop; this says where the trainer's host time goes. Two trainer runs of the
config (`maxtext.run.trainer.run`, every output on; evals and checkpoints
moved past the run's end, so no step holds them), each measured from step
`--skip_steps` (compilation left out) to the last but one (the last reads
no batch ahead):

  timed    Each component's wall time and main-thread CPU time
           (`time.thread_time`, nothing XLA's threads do) per step: the
           engine's `fwd_bwd` calls (their dispatch), `update()` (the
           flush; the device is made idle before it, so its time is host
           work and the transfer, not the step's device work), the data
           (`device_batches`: the batch read and placed), the step's record
           (`reduce_buffer`), the skip guard, and each listener's
           `on_step_start` and `on_step` (console/JSONL/TensorBoard,
           MLPerf log, ...). Then the tail: from `update()` entered with
           the device idle to the next step's first micro-step dispatch,
           the host work a device waits through between two steps.
  counted  The device programs launched per step, by name
           (`testing/dispatch_counter`, which turns JAX's C++ dispatch
           fast path off, hence a run of its own), and the transfers:
           `jax.device_get`, `jax.device_put` and
           `jax.make_array_from_process_local_data` calls and host reads of
           a device array outside them (`float`, `int`, `bool`, `.item()`,
           `.tolist()`, `__array__`; `testing/transfer_counter`).

The last line is:

  step_host_profile: launches_per_step=L fetches_per_step=F
      host_cpu_us_per_step=C tail_us=U

(one line), where F counts the device-to-host transfers (`jax.device_get`
calls and host reads), C is the main thread's CPU time per step and U the
tail's median.
"""

import collections
import contextlib
import os
import statistics
import tempfile
import time

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from maxtext import workloads
from maxtext.configs import default
from maxtext.engine import engine as engine_lib
from maxtext.engine import step_programs
from maxtext.listeners import interface
from maxtext.listeners import multi_listener
from maxtext.run import run_state
from maxtext.run import trainer
from testing import dispatch_counter
from testing import transfer_counter

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.abspath(default.__file__),
    "Model and run config (default: configs/default.py).",
    lock_config=True,
)
_STEPS = flags.DEFINE_integer("steps", 120, "Steps of the timed run.")
_COUNT_STEPS = flags.DEFINE_integer(
    "count_steps", 30, "Steps of the counted run."
)
_SKIP = flags.DEFINE_integer(
    "skip_steps", 10, "Leading steps left out of both runs."
)


class _Tally:
  """Per-label wall and main-thread CPU seconds and calls, once on."""

  def __init__(self):
    self.on = False
    self.wall = collections.defaultdict(float)
    self.cpu = collections.defaultdict(float)
    self.calls = collections.Counter()
    self.marks = []  # (label, perf_counter) for the tail.

  @contextlib.contextmanager
  def timing(self, label):
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
      yield
    finally:
      if self.on:
        self.wall[label] += time.perf_counter() - wall
        self.cpu[label] += time.thread_time() - cpu
        self.calls[label] += 1

  def mark(self, label):
    if self.on:
      self.marks.append((label, time.perf_counter()))


def _patch(stack, owner, name, make):
  """Replaces owner.name with make(original) until the stack closes."""
  original = getattr(owner, name)
  setattr(owner, name, make(original))
  stack.callback(setattr, owner, name, original)


def _timed(tally, label):
  """A `make` for `_patch`: the method, timed under `label`."""

  def make(original):
    def wrapper(self, *args, **kwargs):
      with tally.timing(label):
        return original(self, *args, **kwargs)

    return wrapper

  return make


def _device_idle(engine):
  """Waits for the engine's device work: `update()` then times host work."""
  jax.block_until_ready((engine.params, engine.opt_state))


def _instrument(stack, tally):
  """Wraps the step's components so that `tally` times them."""
  _patch(stack, engine_lib.Engine, "fwd_bwd", _timed(tally, "engine.fwd_bwd"))

  def update(original):
    def wrapper(self, *args, **kwargs):
      _device_idle(self)
      tally.mark("update")
      with tally.timing("engine.update"):
        return original(self, *args, **kwargs)

    return wrapper

  _patch(stack, engine_lib.Engine, "update", update)

  def micro_step(original):
    def wrapper(self, *args, first, **kwargs):
      if first:
        tally.mark("first micro-step")
      return original(self, *args, first=first, **kwargs)

    return wrapper

  _patch(stack, step_programs.StepPrograms, "micro_step", micro_step)
  _patch(
      stack,
      run_state.RunState,
      "device_batches",
      _timed(tally, "data: read and place"),
  )
  # pylint: disable-next=protected-access  # The loop's own pieces, timed.
  _patch(stack, trainer._Finished, "record", _timed(tally, "reduce_buffer"))
  # pylint: disable-next=protected-access  # Likewise.
  _patch(stack, trainer._SkipGuard, "check", _timed(tally, "skip guard"))

  def dispatch(original):
    def wrapper(self, event, *args):
      if event not in ("on_step_start", "on_step"):
        return original(self, event, *args)
      # pylint: disable-next=protected-access  # Times each listener alone.
      for listener in tuple(self._by_event[event]):
        if listener.name == _Window.name:
          getattr(listener, event)(*args)
          continue
        with tally.timing(f"{event}: {listener.name}"):
          getattr(listener, event)(*args)
      return None

    return wrapper

  # The listeners' one dispatch: each listener's step events, timed.
  _patch(stack, multi_listener.MultiListener, "_dispatch", dispatch)


class _Window(interface.RunListener):
  """Counts steps `skip` to `stop` - 1: turns the tally on as step `skip`
  starts and off as step `stop` starts, calling `on_start` and `on_stop`
  there, and notes each step's start in between (and `stop`'s)."""

  name = "step_host_profile"

  def __init__(self, tally, skip, stop, on_start=None, on_stop=None):
    self._tally, self._skip, self._stop = tally, skip, stop
    self._on_start, self._on_stop = on_start, on_stop
    self.starts = []  # (wall, main-thread CPU) as each step starts.

  def on_step_start(self, step):
    if self._skip <= step <= self._stop:
      self.starts.append((time.perf_counter(), time.thread_time()))
    if step == self._skip:
      self._tally.on = True
      if self._on_start is not None:
        self._on_start()
    elif step == self._stop:
      self._tally.on = False
      if self._on_stop is not None:
        self._on_stop()


def _config(steps):
  """The config of one measured run: no eval or checkpoint inside it."""
  config = _CONFIG.value.copy_and_resolve_references()
  if not config.lr_schedule_steps:
    config.lr_schedule_steps = config.steps
  config.steps = steps
  config.target_eval_loss = 0.0
  config.eval_interval = steps + 1
  config.checkpoint_period = steps + 1
  config.base_output_directory = tempfile.mkdtemp(prefix="step_host_profile_")
  config.run_name = "profile"
  return config


def _tail(marks):
  """Seconds from each `update()` (device idle) to the next first dispatch."""
  gaps, start = [], None
  for label, at in marks:
    if label == "update":
      start = at
    elif start is not None:
      gaps.append(at - start)
      start = None
  return gaps


def timed_run(steps, skip):
  """Runs the timed run; returns (tally, steps counted, CPU s/step, tail),
  the steps from `skip` to the last but one."""
  tally = _Tally()
  # The last step reads no batch ahead: it is left out.
  window = _Window(tally, skip, steps - 1)
  with contextlib.ExitStack() as stack:
    _instrument(stack, tally)
    workloads.run(
        _config(steps), config_filename="default.py", extra_listeners=[window]
    )
  cpu = [b[1] - a[1] for a, b in zip(window.starts, window.starts[1:])]
  return tally, len(cpu), statistics.median(cpu), _tail(tally.marks)


def counted_run(steps, skip):
  """Runs the counted run; returns (launch names, transfer counts, steps)."""
  tally = _Tally()
  launches = []
  with contextlib.ExitStack() as stack, contextlib.ExitStack() as counting:
    window = _Window(
        tally,
        skip,
        steps - 1,
        on_start=lambda: launches.append(
            counting.enter_context(dispatch_counter.record_launches())
        ),
        on_stop=counting.close,
    )
    transfers = stack.enter_context(
        transfer_counter.count_transfers(lambda: tally.on)
    )
    workloads.run(
        _config(steps), config_filename="default.py", extra_listeners=[window]
    )
  return (
      collections.Counter(launches[0]),
      transfers.calls,
      len(window.starts) - 1,
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  skip = _SKIP.value
  if min(_STEPS.value, _COUNT_STEPS.value) <= skip + 2:
    raise app.UsageError("need --steps and --count_steps > --skip_steps + 2")
  tally, n, cpu_per_step, tail = timed_run(_STEPS.value, skip)
  print(f"timed: {n} steps from step {skip}")
  print(f"{'component':<40} {'wall us/step':>13} {'cpu us/step':>12} calls")
  for label in sorted(tally.wall, key=lambda l: -tally.cpu[l]):
    print(
        f"{label:<40} {tally.wall[label] / n * 1e6:>13.1f} "
        f"{tally.cpu[label] / n * 1e6:>12.1f} {tally.calls[label] / n:.2f}"
    )
  tail_us = statistics.median(tail) * 1e6
  print(f"main thread CPU per step: {cpu_per_step * 1e6:.1f} us")
  print(
      f"tail (update() with the device idle -> next first dispatch): "
      f"median {tail_us:.1f} us over {len(tail)} steps"
  )
  launches, transfers, m = counted_run(_COUNT_STEPS.value, skip)
  per_step = {name: count / m for name, count in sorted(launches.items())}
  print(f"counted: {m} steps from step {skip}")
  print(
      "launches per step: "
      + ", ".join(f"{name} {count:.2f}" for name, count in per_step.items())
  )
  print(
      "transfers per step: "
      + ", ".join(
          f"{name} {count / m:.2f}" for name, count in sorted(transfers.items())
      )
  )
  fetches = sum(
      count
      for name, count in transfers.items()
      if name == "jax.device_get" or name.startswith("host read")
  )
  print(
      f"step_host_profile: launches_per_step={sum(per_step.values()):.2f} "
      f"fetches_per_step={fetches / m:.2f} "
      f"host_cpu_us_per_step={cpu_per_step * 1e6:.0f} tail_us={tail_us:.0f}"
  )


if __name__ == "__main__":
  app.run(main)
