"""Tiny MLPerf runs for the submission packager's tests, trained in-process.

`make_runs(out_dir, count)` trains `count` runs of the MLPerf tiny shape
(`tiny_configs.MLPERF_SHAPE`), open division, benchmark llama31_8b, each with
its own seed, and returns their run directories. A run stops at the eval loss
target (about 20-30 steps, a few seconds with the persistent compilation
cache) and its log passes the official compliance checker.
"""

import json
from typing import Optional, Sequence

import jax

from maxtext import workloads

from maxtext.run import trainer
from testing import tiny_configs

# Overrides of `tiny_configs.tiny_config` for a run that reaches its target
# (0.95 nats per token, below the open llama31_8b rule's 1.0) well inside 40
# steps, with no checkpoints to write.
MLPERF_RUN = dict(
    tiny_configs.MLPERF_SHAPE,
    steps=40,
    checkpoint_period=0,
    target_eval_loss=0.95,
    submission_division="open",
    submission_benchmark="llama31_8b",
    enable_mllog=True,
)


def tiny_mlperf_config(out_dir: str, *, run_name: str = "tiny", **overrides):
  """The tiny MLPerf run config under `out_dir` (see `MLPERF_RUN`)."""
  return tiny_configs.tiny_config(
      out_dir, run_name=run_name, **{**MLPERF_RUN, **overrides}
  )


def make_runs(
    out_dir: str,
    count: int,
    *,
    seeds: Optional[Sequence[int]] = None,
    prefix: str = "run",
    **overrides,
) -> list[str]:
  """Trains `count` tiny MLPerf runs; returns their run directories.

  Args:
    out_dir: the base output directory.
    count: how many runs.
    seeds: one seed per run (default 1000, 1001, ...).
    prefix: run names are `<prefix>_<i>`.
    **overrides: further config fields.

  Raises:
    AssertionError: a run did not reach its target.
  """
  # Even the tiny compilations are worth caching between the runs.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  seeds = list(seeds) if seeds is not None else [1000 + i for i in range(count)]
  run_dirs = []
  for i in range(count):
    config = tiny_mlperf_config(
        out_dir, run_name=f"{prefix}_{i}", seed=seeds[i], **overrides
    )
    result = workloads.run(config, config_filename="default.py")
    if result.status != trainer.RunOutcome.SUCCESS:
      raise AssertionError(
          f"tiny MLPerf run {i} (seed {seeds[i]}) ended "
          f"{result.status.value} at step "
          f"{result.final_step}, eval loss "
          f"{result.last_eval_loss}"
      )
    run_dirs.append(result.run_dir)
  return run_dirs


def tiny_mlperf_flags(out_dir: str) -> list[str]:
  """`--config.key=value` flags giving default.py the tiny MLPerf run."""
  return tiny_configs.tiny_flags(
      out_dir,
      steps=MLPERF_RUN["steps"],
      extra={k: v for k, v in MLPERF_RUN.items() if k != "steps"},
  )


def edit_log(
    log_path: str,
    *,
    drop_key: Optional[str] = None,
    set_value: Optional[tuple[str, str]] = None,
) -> None:
  """Rewrites an MLPerf log in place (to make a log the checks refuse).

  Args:
    log_path: the `:::MLLOG` file.
    drop_key: every event of this key is removed.
    set_value: (key, value): the events of this key get this value.
  """
  prefix = ":::MLLOG "
  with open(log_path, encoding="utf-8") as f:
    lines = f.readlines()
  out = []
  for line in lines:
    if line.startswith(prefix):
      event = json.loads(line[len(prefix) :])
      if event["key"] == drop_key:
        continue
      if set_value and event["key"] == set_value[0]:
        event["value"] = set_value[1]
        line = prefix + json.dumps(event) + "\n"
    out.append(line)
  with open(log_path, "w", encoding="utf-8") as f:
    f.writelines(out)
