r"""Benchmark: host CPU time per training step, of this tree or several.

Runbook:

  tools/bazel run //tools/benchmarks:host_cpu_bench -- [--rounds=3] [--steps=60]
  # Two source trees side by side (e.g. before and after a change; each a
  # checkout whose maxtext/ is imported instead of this one's):
  python3 tools/benchmarks/host_cpu_bench.py --trees=old=/tmp/old,new=$PWD

On a shared machine wall-clock ratios of millisecond steps are noise; the CPU
time the training loop's own thread spends per step is not: it counts the
host work of the loop (dispatch, metrics, records, outputs) and nothing the
device (XLA's CPU threads included) does. Each round runs every tree once,
as a fresh process (`--child`), in alternating order, training
configs/default.py for `--steps` steps with `--set` overrides; a step's CPU
time is the main thread's `time.thread_time()` between the starts of two
steps (seen by a run listener's `on_step_start`), and a run's figure is the
median over its steps after the first `--skip_steps` (compilation and
warm-up). The process CPU time per step
(all threads) is shown beside it. The table shows every round; the summary,
each tree's median over rounds with its spread, and the last line:

  host_cpu_bench: main_thread_ms=<first tree's median> [<tree>/<first>=R ...]
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds (each runs every tree).")
_STEPS = flags.DEFINE_integer("steps", 60, "Training steps per run.")
_SKIP = flags.DEFINE_integer(
    "skip_steps", 5, "Leading steps left out (compilation)."
)
_TREES = flags.DEFINE_list(
    "trees", [], "name=path of source trees to compare; empty = this tree."
)
_SET = flags.DEFINE_multi_string(
    "set", [], "field=value overrides of configs/default.py (JSON values)."
)
_CHILD = flags.DEFINE_string(
    "child", "", "Internal: run one measurement into this dir."
)

_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _overrides(steps: int, output_dir: str) -> dict:
  """The config overrides of one run: its steps and output, then `--set`."""
  values = {
      "steps": steps,
      "base_output_directory": output_dir,
      "run_name": "bench",
      "log_period": 1000,
  }
  for item in _SET.value:
    key, _, value = item.partition("=")
    try:
      values[key] = json.loads(value)
    except json.JSONDecodeError:
      values[key] = value
  return values


def measure(overrides: dict, skip: int) -> dict:
  """Trains one run in this process; returns its CPU times per step (ms)."""
  # Imported here: the tree on sys.path decides which maxtext this is.
  # pylint: disable=import-outside-toplevel
  from maxtext import workloads
  from maxtext.configs import default
  from maxtext.listeners import interface
  # pylint: enable=import-outside-toplevel

  config = default.get_config()
  config.update(overrides)
  thread, process = [], []

  class StepStarts(interface.RunListener):
    """Notes the CPU times as each step starts."""

    name = "host_cpu_bench"

    def on_step_start(self, step):
      del step
      thread.append(time.thread_time())
      process.append(time.process_time())

  workloads.run(
      config, config_filename="default.py", extra_listeners=[StepStarts()]
  )

  def per_step(stamps):
    diffs = [b - a for a, b in zip(stamps, stamps[1:])][skip:]
    return statistics.median(diffs) * 1e3

  return {"main_thread_ms": per_step(thread), "process_ms": per_step(process)}


def _run_child(tree: str, output_dir: str) -> dict:
  """Runs measure() in a fresh process on `tree`; returns what it measured."""
  env = dict(os.environ)
  # The tree's own packages first; this tree's maxtext must not shadow it.
  path = [p for p in sys.path if p and os.path.abspath(p) != _ROOT]
  env["PYTHONPATH"] = os.pathsep.join([tree] + path)
  env.setdefault("JAX_PLATFORMS", "cpu")
  command = [
      sys.executable,
      os.path.abspath(__file__),
      f"--child={output_dir}",
      f"--steps={_STEPS.value}",
      f"--skip_steps={_SKIP.value}",
  ]
  command += [f"--set={item}" for item in _SET.value]
  proc = subprocess.run(
      command, env=env, cwd=tree, capture_output=True, text=True, check=False
  )
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    raise RuntimeError(
        f"measurement in {tree} failed (exit "
        f"{proc.returncode}):\n{proc.stderr[-3000:]}"
    )
  return json.loads(lines[-1])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if _STEPS.value <= _SKIP.value + 2:
    raise app.UsageError("need --steps > --skip_steps + 2")
  if _CHILD.value:
    print(
        json.dumps(measure(_overrides(_STEPS.value, _CHILD.value), _SKIP.value))
    )
    return
  trees = []
  for item in _TREES.value or [f"this={_ROOT}"]:
    name, sep, path = item.partition("=")
    if not sep or not os.path.isdir(os.path.join(path, "maxtext")):
      raise app.UsageError(
          f"--trees item {item!r}: want name=path of a "
          "checkout holding maxtext/"
      )
    trees.append((name, os.path.abspath(path)))
  results = {name: [] for name, _ in trees}
  print(
      f"{'round':>5} {'tree':>8} {'main thread ms/step':>20} "
      f"{'process ms/step':>16}"
  )
  for round_index in range(_ROUNDS.value):
    order = trees if round_index % 2 == 0 else trees[::-1]
    for name, path in order:
      output_dir = tempfile.mkdtemp(prefix="host_cpu_bench_")
      try:
        result = _run_child(path, output_dir)
      finally:
        shutil.rmtree(output_dir, ignore_errors=True)
      results[name].append(result)
      print(
          f"{round_index:>5} {name:>8} {result['main_thread_ms']:>20.3f} "
          f"{result['process_ms']:>16.3f}",
          flush=True,
      )
  summary = {}
  for name, _ in trees:
    values = [r["main_thread_ms"] for r in results[name]]
    summary[name] = statistics.median(values)
    print(
        f"{name}: main thread {summary[name]:.3f} ms/step (rounds "
        f"{min(values):.3f}-{max(values):.3f})"
    )
  first = trees[0][0]
  ratios = " ".join(
      f"{name}/{first}={summary[name] / summary[first]:.3f}"
      for name, _ in trees[1:]
  )
  print(
      f"host_cpu_bench: main_thread_ms={summary[first]:.3f}"
      + (f" {ratios}" if ratios else "")
  )


if __name__ == "__main__":
  app.run(main)
