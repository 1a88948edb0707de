"""Trains the runs of a submission, one after another, in this process.

Each run gets a fresh copy of the config with its own run directory
(`<out>/runs/run_<i>`) and its own seed, and its log goes through the official
compliance checker as soon as it ends, so a bad configuration is found after
one run, not after all of them.

The seeds are drawn from `os.urandom` (the closed division's seed check wants
a different seed per run, and a seed no one chose); the config's own `seed`
is not used.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from maxtext.core import checks
from maxtext import workloads
from tools.mlperf import run_logs
from tools.mlperf import submission

# Seeds stay below 2**31: the config's seed is a non-negative int that every
# PRNG the engine uses takes.
_SEED_BOUND = 2**31


def draw_seeds(
    count: int, urandom: Callable[[int], bytes] = os.urandom
) -> list[int]:
  """`count` distinct seeds in [0, 2**31) drawn from `urandom`."""
  checks.check_int("count", count, 1)
  seeds: list[int] = []
  while len(seeds) < count:
    seed = int.from_bytes(urandom(4), "little") % _SEED_BOUND
    if seed not in seeds:
      seeds.append(seed)
  return seeds


def runs_dir(out_dir: str) -> str:
  """Where `train_runs` puts its run directories."""
  return os.path.join(out_dir, "runs")


def train_runs(
    config,
    count: int,
    out_dir: str,
    *,
    config_filename: str = "unknown",
    seeds: Optional[Sequence[int]] = None,
    emit: Callable[[str], None] = print,
) -> list[run_logs.RunLog]:
  """Trains `count` runs of `config`, checking each log right after its run.

  Args:
    config: the runs' ml_collections config; it is not changed. Each run's
      copy sets `base_output_directory` to `<out_dir>/runs`, `run_name` to
      `run_<i>`, `seed`, `enable_mllog=True`, `mllog_file=""` (each run its
      own log) and `resume=False`.
    count: how many runs; must be the benchmark's required count.
    out_dir: the packager's output directory.
    config_filename: the config file's name, for the logs' disclosure.
    seeds: one seed per run (default `draw_seeds(count)`); must be distinct.
    emit: where progress lines go.

  Returns:
    The runs' RunLogs, in order.

  Raises:
    submission.PackageError: `count` is not the benchmark's required count,
      seeds repeat, a run directory exists, or a run's log fails the
      compliance checker (no further run is started).
  """
  checks.check_int("runs", count, 1)
  submission.check_run_count(config.submission_benchmark, count)
  seeds = _checked_seeds(count, seeds)
  base = runs_dir(out_dir)
  _check_fresh(base, count)
  runs = []
  for i, seed in enumerate(seeds):
    run_config = _run_config(config, base, i, seed)
    emit(f"mlperf_package: run {i + 1}/{count} (seed {seed})")
    result = workloads.run(run_config, config_filename=config_filename)
    run = run_logs.read_run(result.run_dir)
    emit(
        f"mlperf_package: run {i + 1}/{count} {result.status.value} after "
        f"step {result.final_step}; {run.log_path}"
    )
    submission.check_compliance([run], submission.checker_logs(out_dir))
    runs.append(run)
  return runs


def _checked_seeds(count: int, seeds: Optional[Sequence[int]]) -> list[int]:
  """`seeds` as a list, or `count` drawn ones when None.

  Raises:
    submission.PackageError: not `count` distinct seeds.
  """
  seeds = list(seeds) if seeds is not None else draw_seeds(count)
  if len(seeds) != count or len(set(seeds)) != count:
    raise submission.PackageError(
        f"seeds={seeds!r}: need {count} distinct seeds, one per run"
    )
  return seeds


def _check_fresh(base: str, count: int) -> None:
  """Raises submission.PackageError when a run directory of the `count`
  runs exists under `base` (it would be resumed, not run anew)."""
  for i in range(count):
    if os.path.exists(os.path.join(base, f"run_{i}")):
      raise submission.PackageError(
          f"{os.path.join(base, f'run_{i}')} exists: --runs needs a fresh "
          f"--output_dir (a run directory would be resumed, not run anew)"
      )


def _run_config(config, base: str, i: int, seed: int):
  """Run `i`'s copy of `config`: its own run directory under `base`, `seed`,
  its own MLPerf log, never a resume."""
  run_config = config.copy_and_resolve_references()
  with run_config.unlocked():
    run_config.base_output_directory = base
    run_config.run_name = f"run_{i}"
    run_config.seed = seed
    run_config.enable_mllog = True
    run_config.mllog_file = ""
    run_config.resume = False
  return run_config
