"""When a run evaluates: after which completed optimizer steps.

One pure function of the config, shared by the training loop (which runs the
evaluations) and by anything that must know in advance where they fall, such
as an MLPerf log whose rules fix the first evaluation's sample count
(deepseekv3_671b: `global_batch_size * floor(42 + 24576 / global_batch_size)`
samples).

The schedule: the first evaluation after `first_eval_step(config)` completed
steps, then every `eval_interval` steps after it, and always after the last
step of the budget (`steps`).

A step is one optimizer update. Where one batch feeds several updates (a
GRPO rollout feeds `grpo_num_iterations`), `updates_per_batch` says how
many, so that `first_eval_samples` (a count of samples, which a batch adds
once) still names the batch after which the run first evaluates.
"""

from typing import Any


def first_eval_step(config: Any, updates_per_batch: int = 1) -> int:
  """Completed steps at the first evaluation.

  Args:
    config: a validated config (`eval_interval`, `first_eval_samples`,
      `global_batch_size`); `first_eval_samples` is a multiple of
      `global_batch_size` (config_lib checks it).
    updates_per_batch: optimizer updates each batch feeds (1 for
      pretraining; `grpo_num_iterations` for GRPO).

  Returns:
    `first_eval_samples // global_batch_size * updates_per_batch`, or
    `eval_interval` when `first_eval_samples` is 0.
  """
  if config.first_eval_samples:
    batches = config.first_eval_samples // config.global_batch_size
    return batches * updates_per_batch
  return config.eval_interval


def eval_due(config: Any, completed: int, updates_per_batch: int = 1) -> bool:
  """Whether the run evaluates once `completed` steps are done.

  Args:
    config: a validated config (the fields of `first_eval_step`, and
      `steps`).
    completed: optimizer steps completed so far (>= 1), counted from the
      start of the run, not of the attempt.
    updates_per_batch: as for `first_eval_step`.

  Returns:
    True at the first evaluation step, every `eval_interval` steps after it,
    and at `steps`.
  """
  if completed == config.steps:
    return True
  first = first_eval_step(config, updates_per_batch)
  if completed < first:
    return False
  return (completed - first) % config.eval_interval == 0
