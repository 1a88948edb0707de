"""A GRPO rollout of the progression task on a tiny model, for tests."""

import jax
import ml_collections

from maxtext.generation import sampling
from maxtext.grpo.tasks import progression_task
from maxtext.grpo.rewards import rewards
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.model import transformer


def rollout(config: ml_collections.ConfigDict, stop_ids, width: int):
  """(config frozen, parameters from seed 0, the rollout of 4 prompts of
  `ProgressionTask(32, 3, 6)` x 4 samples at temperature 1, up to 6 new
  ids, stopping at `stop_ids`, in rows of `width` ids)."""
  frozen = ml_collections.FrozenConfigDict(config)
  params = transformer.init_params(config, jax.random.PRNGKey(0))
  task = progression_task.ProgressionTask(32, 3, 6, num_eval=8, seed=0)
  options = sampling.SamplingOptions(
      max_new_tokens=6,
      temperature=1.0,
      seed=3,
      num_samples=4,
      stop_ids=tuple(stop_ids),
  )
  result = rollout_lib.rollout(
      params,
      frozen,
      task.train_prompts(0, 4),
      options,
      rewards.load("maxtext.grpo.tasks.progression_task:prefix_match"),
      width=width,
  )
  return frozen, params, result
