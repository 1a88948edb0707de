"""When a run evaluates: after which completed optimizer steps.

One pure function of the config, shared by the training loop (which runs the
evaluations) and by anything that must know in advance where they fall, such
as an MLPerf log whose rules fix the first evaluation's sample count
(deepseekv3_671b: `global_batch_size * floor(42 + 24576 / global_batch_size)`
samples).

The schedule: the first evaluation after `first_eval_step(schedule)`
completed steps, then every `eval_interval` steps after it, and always after
the last step of the budget (`steps`). Its settings are `EvalSchedule`, the
four config fields it reads.

A step is one optimizer update. Where one batch feeds several updates (a
GRPO rollout feeds `grpo_num_iterations`), `updates_per_batch` says how
many, so that `first_eval_samples` (a count of samples, which a batch adds
once) still names the batch after which the run first evaluates.
"""

import dataclasses

from maxtext.core import component_config


@dataclasses.dataclass(frozen=True)
class EvalSchedule(component_config.ComponentConfig):
  """The fields the schedule reads (`maxtext/configs/base.py` documents
  each; `config_lib.validate` checks them: `first_eval_samples` is a
  multiple of `global_batch_size`)."""

  steps: int = 1000
  eval_interval: int = 100
  first_eval_samples: int = 0
  global_batch_size: int = 16


def first_eval_step(config: EvalSchedule, updates_per_batch: int = 1) -> int:
  """Completed steps at the first evaluation.

  Args:
    config: the schedule's settings, from a validated config.
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


def eval_due(
    config: EvalSchedule, completed: int, updates_per_batch: int = 1
) -> bool:
  """Whether the run evaluates once `completed` steps are done.

  Args:
    config: the schedule's settings, from a validated config.
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
