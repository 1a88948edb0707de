"""When a run evaluates: after which completed optimizer steps.

One pure function of the config, shared by the training loop (which runs the
evaluations) and by anything that must know in advance where they fall, such
as an MLPerf log whose rules fix the first evaluation's sample count
(deepseekv3_671b: `global_batch_size * floor(42 + 24576 / global_batch_size)`
samples).

The schedule: the first evaluation after `first_eval_step(config)` completed
steps, then every `eval_interval` steps after it, and always after the last
step of the budget (`steps`).
"""

from typing import Any


def first_eval_step(config: Any) -> int:
  """Completed steps at the first evaluation.

  Args:
    config: a validated config (`eval_interval`, `first_eval_samples`,
      `global_batch_size`); `first_eval_samples` is a multiple of
      `global_batch_size` (config_lib checks it).

  Returns:
    `first_eval_samples // global_batch_size`, or `eval_interval` when
    `first_eval_samples` is 0.
  """
  if config.first_eval_samples:
    return config.first_eval_samples // config.global_batch_size
  return config.eval_interval


def eval_due(config: Any, completed: int) -> bool:
  """Whether the run evaluates once `completed` steps are done.

  Args:
    config: a validated config (the fields of `first_eval_step`, and
      `steps`).
    completed: optimizer steps completed so far (>= 1), counted from the
      start of the run, not of the attempt.

  Returns:
    True at the first evaluation step, every `eval_interval` steps after it,
    and at `steps`.
  """
  if completed == config.steps:
    return True
  first = first_eval_step(config)
  if completed < first:
    return False
  return (completed - first) % config.eval_interval == 0
