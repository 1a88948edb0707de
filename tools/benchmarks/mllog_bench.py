r"""Benchmark: what MLPerf logging costs the training loop's step time.

Runbook:

  bazel run //tools/benchmarks:mllog_bench -- [--blocks=5] [--steps=200]

Each way trains the same tiny model (the default config, shrunk) through the
real `maxtext.run.trainer.run`, in this process, and records the step times the
loop itself measures (each step record's `step_time`, seen by a run listener:
the same number the MLPerf log's `tracked_stats` reports; eval time
excluded):

  off      enable_mllog=False, local output directory.
  local    enable_mllog=True, the log in the local run directory.
  gcs      enable_mllog=True, base_output_directory=gs://..., staged locally
           and mirrored by the background uploader to a fake-gcs-server
           emulator behind a loopback proxy that delays every answer by
           --delay_ms (a slow network). The mirror syncs every
           --sync_interval_s seconds, so uploads overlap the steps.

The ways run interleaved in blocks (a shuffled order per block) so machine
noise hits them alike. Per run, the first --skip_steps steps (compilation,
warm-up) are dropped and the median of the rest is the run's step time. A
way's ratio in a block is its step time over the `off` run's of the same
block; the table shows the median ratio over blocks and its spread (min-max).
The last two columns are the slowest step over the median step of a run,
every step from run_start on, and the JAX compilation events (tracing,
lowering, compiling: `testing.compile_counter`) after run_start (each the
largest over the blocks): with the compilation done before run_start
(`warmup_steps_before_run_start`), no timed step pays for it, and the count,
unlike the ratio, does not depend on the machine's noise.

Wall-clock ratios of millisecond steps are noisy on a shared machine, so
each run also measures CPU time per step after the warm-up: the process's
(all threads: the loop, the GCS mirror's uploader, XLA's CPU threads) and
the loop thread's own. A way's "cpu added" is the median over blocks of its
CPU time per step over the `off` run's of the same block, minus one. The
last line holds the largest of each over the two logging ways:

  mllog_bench: worst_ratio=R worst_cpu_added=P% worst_main_thread_added=Q%
"""

import os
import random
import shutil
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from maxtext import workloads

from maxtext.configs import default
from maxtext.listeners import interface
from testing import compile_counter
from testing import gcs_emulator
from testing import tiny_configs

_BLOCKS = flags.DEFINE_integer("blocks", 5, "Interleaved blocks (rounds).")
_STEPS = flags.DEFINE_integer("steps", 200, "Training steps per run.")
_SKIP = flags.DEFINE_integer(
    "skip_steps", 10, "First steps of each run left out (warm-up)."
)
_DELAY_MS = flags.DEFINE_float(
    "delay_ms", 50.0, "Delay of each emulator answer chunk (ms)."
)
_SYNC_S = flags.DEFINE_float(
    "sync_interval_s", 1.0, "gcs_sync_interval_seconds of the gcs way."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the block order.")

_WAYS = ("off", "local", "gcs")
_BUCKET = "bench"

# The tests' MLPerf-shaped tiny model, so a step takes milliseconds on a CPU
# and the logging cost is as large a share of the step as it can be; the
# schedule spans the whole run, evals are rare, no checkpoints, no console.
_TINY = dict(
    tiny_configs.MLPERF_SHAPE,
    eval_interval=50,
    lr_schedule_steps=0,
    target_eval_loss=0.0,
    checkpoint_period=0,
    log_period=1_000_000,
    # Every way compiles (the step and the eval) before its first step, as
    # MLPerf logging does by default: otherwise the `off` way's mean CPU time
    # per step would hold the eval's compilation.
    warmup_steps_before_run_start=1,
)


def _config(way: str, run_name: str, out: str, cache_dir: str):
  """The tiny config of one run, MLPerf log off or on (local or GCS output).

  Args:
    way: "off", "local" or "gcs".
    run_name: the run's name.
    out: the folder for the run's local files.
    cache_dir: JAX's compilation cache.
  """
  config = default.get_config()
  for key, value in _TINY.items():
    setattr(config, key, value)
  config.steps = _STEPS.value
  config.run_name = run_name
  config.jax_compilation_cache_dir = cache_dir
  config.enable_mllog = way != "off"
  if way == "gcs":
    config.base_output_directory = f"gs://{_BUCKET}/mllog_bench"
    config.local_staging_directory = os.path.join(out, "staging")
    config.gcs_sync_interval_seconds = _SYNC_S.value
    config.gcs_final_timeout_seconds = 60.0
  else:
    config.base_output_directory = os.path.join(out, "runs")
  return config


def _run_once(
    way: str, run_name: str, out: str, cache_dir: str
) -> tuple[float, float, float, float, int]:
  """Trains one run.

  Returns:
    (median step time, process CPU time per step, main-thread CPU time per
    step) in seconds, over the steps after --skip_steps; CPU times are
    means: the mirror's uploads come in bursts on their own thread, and a
    mean charges each burst to the steps it served. Then the slowest step
    over the median, over every step from run_start on, and the number of
    JAX compilation events after run_start.
  """
  times, process, thread = [], [], []
  compiles = compile_counter.RunStartCounter()

  class StepTimes(interface.RunListener):
    """Notes each step's time and the CPU times as its record arrives."""

    name = "mllog_bench"

    def on_step(self, record):
      times.append(record.step_time)
      process.append(time.process_time())
      thread.append(time.thread_time())

  workloads.run(
      _config(way, run_name, out, cache_dir),
      config_filename="default.py",
      extra_listeners=[compiles, StepTimes()],
  )
  kept = times[_SKIP.value :]
  if len(kept) < 2:
    raise ValueError(
        f"--steps={_STEPS.value} leaves too few steps after "
        f"--skip_steps={_SKIP.value}"
    )
  steps = len(kept) - 1
  return (
      float(np.median(kept)),
      (process[-1] - process[_SKIP.value]) / steps,
      (thread[-1] - thread[_SKIP.value]) / steps,
      # Every step from run_start on, none left out: compilation before
      # run_start (the warm-up) keeps the slowest near the median.
      float(np.max(times) / np.median(times)),
      compiles.count(),
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _BLOCKS.value < 1:
    raise app.UsageError(f"--blocks must be >= 1, got {_BLOCKS.value}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # Keep the libraries' INFO quiet.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  out = tempfile.mkdtemp(prefix="mllog_bench_")
  emulator = gcs_emulator.GcsEmulator(buckets=[_BUCKET]).start()
  proxy = gcs_emulator.SlowProxy(
      emulator.port, _DELAY_MS.value / 1e3, delay_replies=True
  )
  previous_host = os.environ.get("STORAGE_EMULATOR_HOST")
  os.environ["STORAGE_EMULATOR_HOST"] = proxy.url
  try:
    measured = _measure(out)
  finally:
    if previous_host is None:
      os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
      os.environ["STORAGE_EMULATOR_HOST"] = previous_host
    proxy.close()
    emulator.cleanup()
    shutil.rmtree(out, ignore_errors=True)
  _report(measured)


def _measure(out: str) -> dict[str, dict[str, list]]:
  """Runs every way once untimed, then --blocks blocks of every way in a
  shuffled order.

  Returns:
    {"step_times", "process_cpu", "thread_cpu", "slowest", "compiles":
    {way: one value a block}}: `_run_once`'s figures.
  """
  rng = random.Random(_SEED.value)
  measured = {
      name: {way: [] for way in _WAYS}
      for name in (
          "step_times",
          "process_cpu",
          "thread_cpu",
          "slowest",
          "compiles",
      )
  }
  # One untimed run per way: fills the compilation cache, starts threads.
  for way in _WAYS:
    _run_once(way, f"warmup-{way}", out, os.path.join(out, "jax_cache"))
  for block in range(_BLOCKS.value):
    order = list(_WAYS)
    rng.shuffle(order)
    for way in order:
      wall, cpu, main_cpu, worst_step, compiled = _run_once(
          way, f"{way}-{block}", out, os.path.join(out, "jax_cache")
      )
      measured["slowest"][way].append(worst_step)
      measured["compiles"][way].append(compiled)
      measured["step_times"][way].append(wall)
      measured["process_cpu"][way].append(cpu)
      measured["thread_cpu"][way].append(main_cpu)
  return measured


def _report(measured: dict[str, dict[str, list]]) -> None:
  """The header, one line a way against `off`, and the closing line."""
  step_times, process_cpu = measured["step_times"], measured["process_cpu"]
  thread_cpu, slowest = measured["thread_cpu"], measured["slowest"]
  compiles = measured["compiles"]
  off = np.asarray(step_times["off"])
  print(
      f"mllog_bench: {_BLOCKS.value} interleaved blocks x {len(_WAYS)} ways,"
      f" {_STEPS.value} steps per run (first {_SKIP.value} dropped), gcs "
      f"answers delayed {_DELAY_MS.value:g} ms, mirror interval "
      f"{_SYNC_S.value:g} s"
  )
  print(
      f"{'way':<6} {'median step ms':>15} {'ratio vs off':>13} "
      f"{'min ratio':>10} {'max ratio':>10} {'cpu ms/step':>12} "
      f"{'cpu added':>10} {'main ms/step':>13} {'main added':>11} "
      f"{'slowest/median':>15} {'compiles':>9}"
  )
  # The CPU shares may be negative (noise), so their worst starts below any.
  worst, worst_cpu, worst_main = 0.0, float("-inf"), float("-inf")
  off_cpu = np.asarray(process_cpu["off"])
  off_main = np.asarray(thread_cpu["off"])
  for way in _WAYS:
    times = np.asarray(step_times[way])
    ratios = times / off
    median_ratio = float(np.median(ratios))
    # CPU time the way adds per step, as a share of the `off` run's of the
    # same block (all threads, then the loop's own thread).
    cpu_added = float(np.median(np.asarray(process_cpu[way]) / off_cpu - 1))
    main_added = float(np.median(np.asarray(thread_cpu[way]) / off_main - 1))
    if way != "off":
      worst = max(worst, median_ratio)
      worst_cpu = max(worst_cpu, cpu_added)
      worst_main = max(worst_main, main_added)
    print(
        f"{way:<6} {np.median(times) * 1e3:>15.3f} {median_ratio:>13.4f} "
        f"{ratios.min():>10.4f} {ratios.max():>10.4f} "
        f"{np.median(process_cpu[way]) * 1e3:>12.3f} {cpu_added:>+10.2%} "
        f"{np.median(thread_cpu[way]) * 1e3:>13.3f} {main_added:>+11.2%} "
        f"{max(slowest[way]):>15.2f} {max(compiles[way]):>9d}"
    )
  print(
      f"mllog_bench: worst_ratio={worst:.4f} worst_cpu_added="
      f"{worst_cpu * 100:.2f}% worst_main_thread_added={worst_main * 100:.2f}%"
  )


if __name__ == "__main__":
  app.run(main)
