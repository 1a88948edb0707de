r"""Benchmark: a GRPO step's time by phase, and its metrics' dispatches.

Runbook:

  tools/bazel run //tools/benchmarks:grpo_bench
  # Fewer or more timed steps: --steps; any --config.x override of
  # maxtext/configs/grpo_tiny.py (or another --config file), e.g.
  # --config.load_parameters_path=<a pretraining run's checkpoints>.
  # Multi-turn episodes with tools in the sandbox (a text task's config):
  tools/bazel run //tools/benchmarks:grpo_bench -- \
      --config=maxtext/configs/grpo_repair_tiny.py --steps=3

One process on the default devices (the CPU here), the config's model with
random parameters (or `load_parameters_path`'s: a benchmark of speed, not of
learning), trained by the one training loop (`maxtext.run.trainer.run` with
the GRPO workload, in a temporary run directory, without the MLPerf log),
watched by a run listener. The workload's warm-up compiles every program
first; then `--steps` steps run, each a rollout and one update, and the
step's own timings (the `timing/*` metrics of its record,
`maxtext/grpo/rollout/rollout_batches.py`) are averaged: the table gives each
phase's mean seconds and share of `timing/step` (rollout = generation +
rewards + advantages; reference; old log-probs, which generation computes,
so 0; update), generated tokens/s (the completions' tokens over
`timing/generate`), trained tokens/s (the padded rows' tokens, N x (prompt
+ completion columns), over `timing/update`) and the padding fraction of
the model's input: the share of the micro-batches' tokens that hold no
sequence, one padded row per sequence and packed first-fit
(`maxtext.grpo.rollout.packed_batches`, the rows `--config.packing=true`
trains).
The rollouts themselves (their lengths and tokens) come from the workload's
batch source (`RolloutSource.rollout_for`) as each update's record is
completed. Then the rollouts' decode step against the bandwidth limit
(`maxtext.generation.decode_roofline`): the bytes a step reads (the weights
in the compute dtype, the mean visible key/value cache and recurrent states
of a step's rows, over every timed rollout's decode steps) and, where the
device's HBM bandwidth is known, the step time it allows against the
measured one (`timing/generate` summed over the decode steps summed);
multi-turn episodes count no decode steps.

With a config whose `grpo_task` is set (multi-turn mode), the steps play the
task's episodes (`maxtext/grpo/rollout/episode_rollout.py`) and the rollout
splits into generation (`timing/generate`: the generation function alone), tool
execution (`timing/tools`: the environments' tools, verifiers and
rendering) and the reward functions; generated tokens/s then counts every
id after the prompts (the environment's too) over generation's seconds.

Then a second run of `--steps` steps with each rollout drawn while the
update before runs its micro-batches but the last, which takes the update
(grpo_max_age = 1, the loop's order for a source that draws ahead), and
the line

  step by grpo_max_age: 0 A s, 1 B s, speedup S (age_max 1)

gives each mode's seconds per step (the loop's step time, eval and
checkpoint time left out, averaged over the steps), S = A / B, and the
oldest trained sample's age in updates (`rollout/age_max`).

Then the device dispatches of one step's metrics, counted with
`tools.benchmarks.metric_ways` (as `metrics_bench` counts them) on the GRPO
loss of the same config: what the engine's recorder adds to a step beyond
its K micro-steps and optimizer apply, against one `jnp.append` per metric
and micro-batch. The last line is:

  grpo_bench: rollout_share=R metrics=M recorder_dispatches=D \
      append_dispatches=A

(one line, without the backslash). R is mean timing/rollout / mean
timing/step; M the metrics of a real step's record (the micro-batches' m,
the engine's 3, and the host values: the rollout's statistics, one per
reward function among them, and the 7 timings); D the recorder's dispatches
per step (the same for any M); A the appends' dispatches per step (m x K).
"""

import dataclasses
import os
import tempfile

from absl import app
from absl import flags
import jax
from ml_collections import config_flags
import numpy as np

from maxtext.config import config_lib
from maxtext.configs import grpo_tiny
from maxtext.generation import decode_roofline
from maxtext.grpo import grpo_config
from maxtext.grpo import grpo_workload
from maxtext.grpo.rollout import packed_batches
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.listeners import interface
from maxtext.model import transformer
from maxtext.run import batch_source
from maxtext.run import run_settings
from maxtext import workloads
from maxtext.runtime import mesh as mesh_lib
from tools import command_line
from tools.benchmarks import metric_ways

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.abspath(grpo_tiny.__file__),
    "GRPO config (default: maxtext/configs/grpo_tiny.py).",
    lock_config=True,
)
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps after the warm-up.")

# The phases of a step, as the table lists them.
_PHASES = (
    ("rollout", "timing/rollout"),
    ("  generate", "timing/generate"),
    ("  tools", "timing/tools"),
    ("  reward", "timing/reward"),
    ("reference", "timing/reference"),
    ("old_logprobs", "timing/old_logprobs"),
    ("update", "timing/update"),
    ("step", "timing/step"),
)
# The ways of metric_ways whose dispatches are compared.
_WAYS = ("baseline", "a/append", "c/engine")


def _check(config) -> None:
  """The bench's own checks before any device work (the run checks the
  config itself)."""
  if _STEPS.value < 1:
    raise ValueError(f"--steps={_STEPS.value}: must be >= 1")
  config_lib.validate(config)
  config_lib.validate_grpo(config)
  if config.grpo_num_iterations != 1:
    raise ValueError(
        f"grpo_num_iterations={config.grpo_num_iterations}: the bench times "
        "one update per rollout; give 1"
    )


class _Records(interface.RunListener):
  """Keeps a run's warm-up seconds and its steps' records."""

  name = "grpo_bench"

  def __init__(self):
    self.warmup_time = 0.0
    self.records: list[interface.StepRecord] = []

  def on_run_start(self, start: interface.RunStart) -> None:
    self.warmup_time = start.warmup_time

  def on_step(self, record: interface.StepRecord) -> None:
    self.records.append(record)


class _WatchedSource(batch_source.BatchSource):
  """The GRPO run's batch source, keeping each update's rollout."""

  def __init__(self, source, rollouts: list):
    self._source = source
    self._rollouts = rollouts
    self.draws_ahead = source.draws_ahead
    self.reads_parameters = source.reads_parameters
    self.updates_per_batch = source.updates_per_batch

  def draw(self, step, policy):
    return self._source.draw(step, policy)

  def complete_record(self, step, record):
    self._source.complete_record(step, record)
    self._rollouts.append(self._source.rollout_for(step).rollout)


class _WatchedGrpo(grpo_workload.GrpoWorkload):
  """The GRPO workload, its rollouts kept (`rollouts`, one per update)."""

  def __init__(self, settings: grpo_config.GrpoConfig):
    super().__init__(settings)
    self.rollouts: list[rollout_lib.Rollout] = []

  def batch_source(self, state):
    return _WatchedSource(super().batch_source(state), self.rollouts)


@dataclasses.dataclass
class _Run:
  """One benchmark run: its steps' records and rollouts."""

  warmup_time: float
  records: list[dict]  # Each step's reduced metrics.
  rollouts: list[rollout_lib.Rollout]
  step_time: float  # Mean seconds per step (the loop's step time).


def _run(config, max_age: int, directory: str) -> _Run:
  """Trains `--steps` GRPO steps with `grpo_max_age` = max_age through the
  training loop, in a run directory under `directory`."""
  config = config_lib.with_values(
      config,
      dict(
          base_output_directory=directory,
          run_name=f"grpo_bench_age{max_age}",
          steps=_STEPS.value,
          grpo_max_age=max_age,
          enable_mllog=False,
          checkpoint_period=0,
          eval_interval=_STEPS.value,
      ),
  )
  watch = _Records()
  workload = _WatchedGrpo(grpo_config.GrpoConfig.from_config(config))
  workloads.run(config, workload=workload, extra_listeners=[watch])
  return _Run(
      warmup_time=watch.warmup_time,
      records=[dict(r.metrics) for r in watch.records],
      rollouts=workload.rollouts,
      step_time=float(np.mean([r.step_time for r in watch.records])),
  )


def _padding(rollout, k: int, shards: int) -> tuple[float, float]:
  """(padded, packed) padding fractions of a rollout's K micro-batches:
  one row per sequence, and first-fit packed rows (`packed_batches`, the
  row count `RolloutBatches` uses)."""
  batches = rollout_lib.micro_batches(rollout, k)
  multiple = packed_batches.row_multiple(
      len(batches[0]["prompt_lengths"]), shards
  )
  rows = packed_batches.num_rows(batches, multiple)
  return (
      packed_batches.padding_fraction(batches),
      packed_batches.padding_fraction(batches, rows),
  )


def _decode_lines(config, params, rollouts, generate_s: float) -> list[str]:
  """The rollouts' decode step against the bandwidth limit
  (`decode_roofline`): bytes a step reads, the limit, the measured step
  (generation's seconds over its decode steps)."""
  steps = sum(r.decode_steps for r in rollouts)
  if not all(r.decode_steps for r in rollouts):
    return ["decode step reads: not counted (episodes count no decode steps)"]
  step = decode_roofline.step_bytes(
      config,
      params,
      np.concatenate([r.prompt_lengths for r in rollouts]),
      np.concatenate([r.completion_lengths for r in rollouts]),
      steps,
  )
  return decode_roofline.report(step, jax.devices()[0].device_kind, generate_s)


def _print_phases(config, sync: _Run, k: int) -> dict[str, float]:
  """The run's header and its phase table; returns each phase's mean."""
  # timing/tools is 0 without a task's environments.
  mean = {
      name: float(np.mean([r.get(name, 0.0) for r in sync.records]))
      for _, name in _PHASES
  }
  print(
      f"grpo_bench: {config.global_batch_size // config.grpo_num_generations}"
      f" prompts x {config.grpo_num_generations} completions of up to "
      f"{config.grpo_max_completion_length} tokens, K={k}, "
      f"beta={config.grpo_beta}, {_STEPS.value} steps after a "
      f"{sync.warmup_time:.1f} s warm-up; jax {jax.__version__} on "
      f"{jax.devices()[0].platform} x {jax.device_count()}"
  )
  print(f"{'phase':<13} {'mean_s':>9} {'share':>7}")
  for label, name in _PHASES:
    print(
        f"{label:<13} {mean[name]:>9.4f} "
        f"{mean[name] / mean['timing/step']:>7.1%}"
    )
  return mean


def _print_tokens(config, sync: _Run, k: int, shards: int) -> None:
  """Generated and trained tokens/s, the decode roofline, the padding."""
  rollouts, records = sync.rollouts, sync.records
  generated = sum(int(r.completion_lengths.sum()) for r in rollouts)
  trained = sum(r.tokens.size for r in rollouts)
  generate_s = sum(r["timing/generate"] for r in records)
  update_s = sum(r["timing/update"] for r in records)
  print(f"generated tokens/s {generated / generate_s:.1f}")
  print(f"trained tokens/s {trained / update_s:.1f}")
  # The weights' shapes: what a decode step reads of them.
  params = transformer.abstract_params(config)
  for line in _decode_lines(config, params, rollouts, generate_s):
    print(line)
  padded, packed = np.mean([_padding(r, k, shards) for r in rollouts], axis=0)
  print(
      f"padding fraction: padded {padded:.4f} packed {packed:.4f} "
      f"(packing={config.packing})"
  )


def _print_dispatches(config, k: int, metrics: int, rollout_share) -> None:
  """The metrics' dispatches per step, and the closing line."""
  problem = metric_ways.grpo_problem(config)
  dispatches = metric_ways.dispatches_per_step(
      metric_ways.make_ways(problem, k, _WAYS), problem.batch
  )
  m = len(problem.names)
  recorder = dispatches["c/engine"] - dispatches["baseline"]
  appends = dispatches["a/append"] - dispatches["baseline"]
  print(
      f"dispatches per step (K={k}, m={m} micro-batch metrics): "
      + ", ".join(f"{w} {dispatches[w]}" for w in _WAYS)
  )
  print(
      f"grpo_bench: rollout_share={rollout_share:.4f} "
      f"metrics={metrics} recorder_dispatches={recorder} "
      f"append_dispatches={appends}"
  )


def main(argv):
  command_line.check(argv)
  config = _CONFIG.value
  with command_line.user_errors("grpo_bench"):
    _check(config)
  k = config.gradient_accumulation_steps
  shards = mesh_lib.make_mesh(
      workloads.for_config(config).mesh_config(
          run_settings.RunSettings.from_config(config)
      )
  ).devices.size
  with tempfile.TemporaryDirectory(prefix="grpo_bench_") as directory:
    sync = _run(config, 0, directory)
    ahead = _run(config, 1, directory)
  mean = _print_phases(config, sync, k)
  _print_tokens(config, sync, k, shards)
  age = int(max(r["rollout/age_max"] for r in ahead.records))
  print(
      f"step by grpo_max_age: 0 {sync.step_time:.4f} s, 1 "
      f"{ahead.step_time:.4f} s, speedup "
      f"{sync.step_time / ahead.step_time:.3f} (age_max {age})"
  )
  _print_dispatches(
      config,
      k,
      len(sync.records[-1]),
      mean["timing/rollout"] / mean["timing/step"],
  )


if __name__ == "__main__":
  app.run(main)
