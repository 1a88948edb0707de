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
learning) and the GRPO step of `maxtext.grpo.step.GrpoStep` on the built-in
progression task. `GrpoStep.warm_up` compiles every program first; then
`--steps` steps run, each a rollout and one update, and the step's own
timings (the `timing/*` metrics of its record, `maxtext/grpo/step.py`) are
averaged: the table gives each phase's mean seconds and share of
`timing/step` (rollout = generation + rewards + advantages; reference; old
log-probs, which generation computes, so 0; update), generated tokens/s
(the completions' tokens over `timing/generate`), trained tokens/s (the
padded rows' tokens, N x (prompt + completion columns), over
`timing/update`) and the padding fraction of the model's input: the share
of the micro-batches' tokens that hold no sequence, one padded row per
sequence and packed first-fit (`maxtext.grpo.packed_batches`, the rows
`--config.packing=true` trains). Then the rollouts' decode step against
the bandwidth limit (`maxtext.generation.decode_roofline`): the bytes a
step reads (the weights in the compute dtype, the mean visible key/value
cache and recurrent states of a step's rows, over every timed rollout's
decode steps) and, where the device's HBM bandwidth is known, the step time
it allows against the measured one (`timing/generate` summed over the
decode steps summed); multi-turn episodes count no decode steps.

With a config whose `grpo_task` is set (multi-turn mode), the steps play the
task's episodes (`maxtext/grpo/episode_rollout.py`) and the rollout splits
into generation (`timing/generate`: the generation function alone), tool
execution (`timing/tools`: the environments' tools, verifiers and
rendering) and the reward functions; generated tokens/s then counts every
id after the prompts (the environment's too) over generation's seconds.

Then the step with rollouts drawn ahead: `--steps` more steps with each
rollout drawn while the update before runs its micro-batches but the last,
which takes the update (grpo_max_age = 1, the training loop's order:
`GrpoStep.train_ahead`), on the same engine, and the line

  step by grpo_max_age: 0 A s, 1 B s, speedup S (age_max 1)

gives each mode's wall seconds per step (its steps' own time, until the
last update's parameters are ready; the table's steps for 0), S = A / B,
and the oldest trained sample's age in updates.

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

import functools
import os
import time

from absl import app
from absl import flags
import jax
import ml_collections
from ml_collections import config_flags
import numpy as np

from maxtext.config import config_lib
from maxtext.generation import decode_roofline
from maxtext.runtime import mesh as mesh_lib
from maxtext.engine import model_setup
from maxtext.configs import grpo_tiny
from maxtext.grpo import packed_batches
from maxtext.grpo import rewards
from maxtext.grpo import rollout as rollout_lib
from maxtext.grpo import step as step_lib
from maxtext.grpo import prompts as prompts_lib
from maxtext.grpo import grpo_workload
from maxtext.grpo import episode_rollout
from maxtext.grpo import text_task
from maxtext.metrics import recorder as metrics_recorder
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


def _check(config) -> list:
  """The config's checks before any device work; the reward functions."""
  if _STEPS.value < 1:
    raise ValueError(f"--steps={_STEPS.value}: must be >= 1")
  config_lib.validate(config)
  config_lib.validate_grpo(config)
  if config.grpo_num_iterations != 1:
    raise ValueError(
        f"grpo_num_iterations={config.grpo_num_iterations}: the bench times "
        "one update per rollout; give 1"
    )
  if config.grpo_task and not config.grpo_reward_functions.strip():
    return []
  return rewards.load(config.grpo_reward_functions)


def _records(task, count: int, step: int) -> list[dict]:
  """A text task's `count` records of step `step`."""
  return task.train_records(step, count)


def _prompts(task, count: int, step: int) -> list[list[int]]:
  """The progression task's `count` prompts of step `step`."""
  return task.train_prompts(step, count)


def _grpo_step(config, functions):
  """The GRPO run's step and engine (as `maxtext.grpo.grpo_workload` builds
  them), without its run directory and outputs.

  Returns:
    (the `step.GrpoStep`, its engine).
  """
  engine, setup = grpo_workload.engine_factory(
      config,
      mesh_lib.make_mesh(grpo_workload.GrpoWorkload().mesh_config(config)),
  )
  mesh = setup.mesh
  frozen = ml_collections.FrozenConfigDict(config)
  prompts = config.global_batch_size // config.grpo_num_generations
  if config.grpo_task:
    # Multi-turn (or text) episodes: the task's records, its environments.
    episodes = text_task.episode_setup(config)
    prompts_of = functools.partial(_records, episodes.task, prompts)
    rollout_fn = functools.partial(episode_rollout.rollout, setup=episodes)
  else:
    episodes = None
    prompts_of = functools.partial(
        _prompts, prompts_lib.make_task(config), prompts
    )
    rollout_fn = rollout_lib.rollout
  grpo = step_lib.GrpoStep(
      engine,
      frozen,
      prompts_of,
      grpo_workload.options_of_step(config, episodes),
      functions,
      num_micro_batches=config.gradient_accumulation_steps,
      width=config.grpo_prompt_length + config.grpo_max_completion_length,
      estimator=config.grpo_advantage_estimator,
      advantage_eps=config.grpo_advantage_eps,
      reference_params=(
          model_setup.init_params(config, setup)
          if config.grpo_beta > 0
          else None
      ),
      mesh=mesh,
      rollout_fn=rollout_fn,
      packing=config.packing,
      logprob_error_threshold=(
          grpo_workload.loss_options(config).logprob_error_threshold
      ),
  )
  return grpo, engine


def _padding(rollout, k: int, shards: int) -> tuple[float, float]:
  """(padded, packed) padding fractions of a rollout's K micro-batches:
  one row per sequence, and first-fit packed rows (`packed_batches`, the
  row count `GrpoStep` would use)."""
  batches = rollout_lib.micro_batches(rollout, k)
  multiple = packed_batches.row_multiple(
      len(batches[0]["prompt_lengths"]), shards
  )
  rows = packed_batches.num_rows(batches, multiple)
  return (
      packed_batches.padding_fraction(batches),
      packed_batches.padding_fraction(batches, rows),
  )


def _timed_steps(
    grpo, engine, steps: int, k: int, shards: int
) -> tuple[list[dict], list, list, float]:
  """Runs `steps` synchronous steps (grpo_max_age 0) after the warm-up.

  Returns:
    (each step's record reduced, each step's rollout, each step's (padded,
    packed) padding fractions, wall seconds per step: the steps' own time,
    until the last update's parameters are ready).
  """
  records, rollouts, padding, wall = [], [], [], 0.0
  for step in range(steps):
    start = time.perf_counter()
    result = grpo.run(step)
    wall += time.perf_counter() - start
    records.append(metrics_recorder.reduce_buffer(result.records[0]))
    rollouts.append(result.rollout)
    padding.append(_padding(result.rollout, k, shards))
  start = time.perf_counter()
  jax.block_until_ready(engine.params)
  wall += time.perf_counter() - start
  return records, rollouts, padding, wall / steps


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


def _timed_steps_ahead(grpo, engine, first: int, steps: int):
  """Runs steps first .. first + steps - 1 with each rollout drawn while
  the update before runs (grpo_max_age 1: `GrpoStep.train_ahead`, the
  training loop's order): the same rollouts and updates as `steps`
  synchronous steps.

  Returns:
    (wall seconds per step, until the last update's parameters are ready;
    the oldest trained sample's age in updates).
  """
  start = time.perf_counter()
  prepared = grpo.prepare(first)
  age = 0
  for i in range(steps):
    # The update about to run is the engine's step `engine.step`.
    age = max(age, int(np.max(engine.step - prepared.versions)))
    last = i + 1 == steps
    _, prepared = grpo.train_ahead(prepared, None if last else first + i + 1)
  jax.block_until_ready(engine.params)
  return (time.perf_counter() - start) / steps, age


def main(argv):
  command_line.check(argv)
  config = _CONFIG.value
  with command_line.user_errors("grpo_bench"):
    functions = _check(config)
  grpo, engine = _grpo_step(config, functions)
  k = config.gradient_accumulation_steps
  warmup_s = grpo.warm_up(0)
  shards = mesh_lib.make_mesh(
      grpo_workload.GrpoWorkload().mesh_config(config)
  ).devices.size
  records, rollouts, padding, sync_s = _timed_steps(
      grpo, engine, _STEPS.value, k, shards
  )
  generated = sum(int(r.completion_lengths.sum()) for r in rollouts)
  trained = sum(r.tokens.size for r in rollouts)
  ahead_s, age = _timed_steps_ahead(grpo, engine, _STEPS.value, _STEPS.value)
  # timing/tools is 0 without a task's environments.
  mean = {
      name: float(np.mean([r.get(name, 0.0) for r in records]))
      for _, name in _PHASES
  }
  print(
      f"grpo_bench: {config.global_batch_size // config.grpo_num_generations}"
      f" prompts x {config.grpo_num_generations} completions of up to "
      f"{config.grpo_max_completion_length} tokens, K={k}, "
      f"beta={config.grpo_beta}, {_STEPS.value} steps after a "
      f"{warmup_s:.1f} s warm-up; jax {jax.__version__} on "
      f"{jax.devices()[0].platform} x {jax.device_count()}"
  )
  print(f"{'phase':<13} {'mean_s':>9} {'share':>7}")
  for label, name in _PHASES:
    print(
        f"{label:<13} {mean[name]:>9.4f} "
        f"{mean[name] / mean['timing/step']:>7.1%}"
    )
  generate_s = sum(r["timing/generate"] for r in records)
  update_s = sum(r["timing/update"] for r in records)
  print(f"generated tokens/s {generated / generate_s:.1f}")
  print(f"trained tokens/s {trained / update_s:.1f}")
  for line in _decode_lines(config, engine.params, rollouts, generate_s):
    print(line)
  padded, packed = np.mean(padding, axis=0)
  print(
      f"padding fraction: padded {padded:.4f} packed {packed:.4f} "
      f"(packing={config.packing})"
  )

  print(
      f"step by grpo_max_age: 0 {sync_s:.4f} s, 1 {ahead_s:.4f} s, "
      f"speedup {sync_s / ahead_s:.3f} (age_max {age})"
  )

  problem = metric_ways.grpo_problem(config)
  dispatches = metric_ways.dispatches_per_step(
      metric_ways.make_ways(problem, k, _WAYS), problem.batch
  )
  m = len(problem.names)
  metrics = len(records[-1])
  recorder = dispatches["c/engine"] - dispatches["baseline"]
  appends = dispatches["a/append"] - dispatches["baseline"]
  print(
      f"dispatches per step (K={k}, m={m} micro-batch metrics): "
      + ", ".join(f"{w} {dispatches[w]}" for w in _WAYS)
  )
  print(
      f"grpo_bench: rollout_share="
      f"{mean['timing/rollout'] / mean['timing/step']:.4f} "
      f"metrics={metrics} recorder_dispatches={recorder} "
      f"append_dispatches={appends}"
  )


if __name__ == "__main__":
  app.run(main)
