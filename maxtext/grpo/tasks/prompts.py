"""The GRPO run's prompts as a data set: the built-in progression task.

A GRPO run reads its prompts where a pretraining run reads its batches:
through the run state's `Dataset` (`maxtext/data/dataset.py`). Batch `b` is the
prompts of rollout `b`, {"prompts": int32 [P, grpo_prompt_length]} with P =
global_batch_size / grpo_num_generations; eval batch 0 is every held-out
prompt. Every process holds the same prompts (each process scores the whole
rollout). The prompts are a function of (seed, b), so the data set has no
position to checkpoint; its provenance (the task's fields) goes into the
run's `config.json`.
"""

from typing import Any, Optional

import numpy as np

from maxtext.data import dataset
from maxtext.grpo.tasks import progression_task
from maxtext.grpo.tasks import task_config


def make_task(
    settings: task_config.TaskConfig,
) -> progression_task.ProgressionTask:
  """The settings' progression task (raises ValueError naming the field)."""
  return progression_task.ProgressionTask(
      settings.vocab_size,
      settings.grpo_prompt_length,
      settings.grpo_max_completion_length,
      settings.grpo_eval_prompts,
      seed=settings.seed,
  )


class PromptDataset(dataset.Dataset):
  """The progression task's prompts, by rollout.

  Args:
    settings: the run's task settings (the task's fields and the prompts a
      rollout holds).
  """

  def __init__(self, settings: task_config.TaskConfig):
    self._task = make_task(settings)
    self._count = settings.prompts_per_rollout
    self._provenance = {
        "kind": "progression_task",
        "vocab_size": settings.vocab_size,
        "prompt_length": settings.grpo_prompt_length,
        "completion_length": settings.grpo_max_completion_length,
        "eval_prompts": settings.grpo_eval_prompts,
        "seed": settings.seed,
    }

  @property
  def task(self) -> progression_task.ProgressionTask:
    return self._task

  def get_batch(self, step: int) -> dataset.Batch:
    """The prompts of rollout `step`."""
    if step < 0:
      raise ValueError(f"rollout {step}: must be >= 0")
    return {
        "prompts": np.asarray(
            self._task.train_prompts(step, self._count), np.int32
        )
    }

  def get_eval_batch(self, index: int) -> dataset.Batch:
    """Every held-out prompt (index 0; the eval is one batch)."""
    if index != 0:
      raise ValueError(f"eval batch {index}: the held-out prompts are batch 0")
    return {"prompts": np.asarray(self._task.eval_prompts(), np.int32)}

  def provenance(self) -> Optional[dict[str, Any]]:
    """The task's fields, for the run's config.json."""
    return {"prompts": self._provenance}
