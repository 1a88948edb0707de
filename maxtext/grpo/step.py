"""One GRPO step on the training engine: rollout, then the policy updates.

A step draws its prompts, generates with the engine's current parameters
(`rollout`), computes the frozen reference's log-probabilities when the KL
term is on, and runs `num_iterations` passes over the rollout's K
micro-batches: each pass is K `engine.fwd_bwd` calls and one
`engine.update()`, so the engine's one packed flush carries every metric
(the loss's, and the rollout's statistics fed in as inputs). The behaviour
log-probabilities stay those of the parameters that generated, so later
passes are off-policy by exactly the updates in between, which the clipped
ratio bounds. A step consumes P x G samples whatever `num_iterations` is.
"""

import dataclasses
import functools
import time
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from maxtext import engine as engine_lib
from maxtext.generation import scoring
from maxtext.grpo import rewards as rewards_lib
from maxtext.grpo import rollout as rollout_lib
from maxtext.metrics import buffer
from maxtext.text import sampling


@functools.partial(jax.jit, static_argnames=("width", "config", "mesh"))
def _reference_log_probs(params, tokens, prompt_lengths, width, config, mesh):
  return scoring.completion_log_probs_and_entropy(
      params, tokens, prompt_lengths, width, config, mesh
  )[0]


@dataclasses.dataclass
class StepResult:
  """What one GRPO step did.

  Attributes:
    rollout: its rollout.
    records: one flushed MetricsBuffer per pass (num_iterations of them).
  """

  rollout: rollout_lib.Rollout
  records: list[buffer.MetricsBuffer]


class GrpoStep:
  """Runs GRPO steps on an engine whose loss is `train_loss.loss_fn`.

  Args:
    engine: the training engine (its params are generated with in place).
    model_config: the model's config, frozen.
    prompts_of_step: step -> the step's P prompts.
    options_of_step: step -> the rollout's SamplingOptions (num_samples = G).
    reward_functions: from `rewards.load`.
    num_micro_batches: K (the engine's gradient_accumulation_steps).
    num_iterations: passes over each rollout.
    estimator: the advantage estimator.
    advantage_eps: the "grpo" estimator's eps.
    width: the rollout's token columns (fixed, so programs compile once).
    reference_params: the frozen reference policy, or None (beta = 0).
    mesh: the engine's mesh, or None for one device.
  """

  def __init__(
      self,
      engine: engine_lib.Engine,
      model_config: Any,
      prompts_of_step: Callable[[int], Sequence[Sequence[int]]],
      options_of_step: Callable[[int], sampling.SamplingOptions],
      reward_functions: Sequence[rewards_lib.RewardFunction],
      *,
      num_micro_batches: int,
      num_iterations: int = 1,
      estimator: str = "grpo",
      advantage_eps: float = 1e-4,
      width: int,
      reference_params: Optional[Any] = None,
      mesh: Optional[jax.sharding.Mesh] = None,
  ):
    if num_iterations < 1:
      raise ValueError(f"num_iterations={num_iterations}: must be >= 1")
    self._engine = engine
    self._config = model_config
    self._prompts_of_step = prompts_of_step
    self._options_of_step = options_of_step
    self._rewards = list(reward_functions)
    self._k = num_micro_batches
    self._iterations = num_iterations
    self._estimator = estimator
    self._eps = advantage_eps
    self._width = width
    self._reference = reference_params
    self._mesh = mesh

  def rollout(self, step: int) -> tuple[rollout_lib.Rollout, list[dict]]:
    """Step `step`'s rollout and its K micro-batches (reference included)."""
    start = time.perf_counter()
    options = self._options_of_step(step)
    result = rollout_lib.rollout(
        self._engine.params,
        self._config,
        self._prompts_of_step(step),
        options,
        self._rewards,
        estimator=self._estimator,
        advantage_eps=self._eps,
        width=self._width,
        mesh=self._mesh,
    )
    rolled = time.perf_counter()
    ref = None
    if self._reference is not None:
      ref = np.asarray(
          _reference_log_probs(
              self._reference,
              result.tokens,
              result.prompt_lengths,
              width=options.max_new_tokens,
              config=self._config,
              mesh=self._mesh,
          )
      )
    referenced = time.perf_counter()
    extra = {
        "timing/rollout_s": rolled - start,
        "timing/reference_s": referenced - rolled,
    }
    return result, rollout_lib.micro_batches(result, self._k, ref, extra)

  def train(self, batches: list[dict]) -> buffer.MetricsBuffer:
    """One pass over a rollout's micro-batches: K fwd_bwd, one update."""
    for micro_batch in batches:
      self._engine.fwd_bwd(micro_batch)
    return self._engine.update(release=True)

  def run(self, step: int) -> StepResult:
    """Runs GRPO step `step` (a rollout and num_iterations updates)."""
    result, batches = self.rollout(step)
    records = [self.train(batches) for _ in range(self._iterations)]
    return StepResult(result, records)
