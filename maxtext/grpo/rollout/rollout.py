"""A GRPO rollout: P prompts x G completions, scored, as micro-batches.

`rollout(...)` generates G completions of each prompt with the paged,
continuous-batching decoder (`maxtext.generation.paged_decoder`: each prompt
prefilled once, its G completions sharing its pages; or, asked for, the static
decoder `maxtext.generation.decoder`, which draws the same ids) on the
parameters it is given (the engine's own: no copy), with the behaviour policy's
log-probability of every generated id, calls the reward functions on the host,
and computes the group-relative advantages. `micro_batches` cuts the result into
the engine's K micro-batches of fixed shapes: tokens [B, W] (prompt, completion,
padding), prompt lengths, the completion mask [B, L], the behaviour
log-probabilities, the advantages, the sequence mask (0 for a completion that
trains nothing: overlong filtering) and the step's loss normalisers (its counted
completion tokens and sequences over K, so the loss's "token_mean" is the whole
step's, not each micro-batch's). The rollout's statistics stay on the host
(`Rollout.stats`).

The draws of step s come from a seed that is a function of (config seed, s),
so a resumed run generates what an uninterrupted one would.
"""

import dataclasses
import time
from typing import Any, Optional, Sequence

import jax
import numpy as np

from maxtext.generation import paged_decoder
from maxtext.generation import rollout_decoder
from maxtext.grpo.loss import advantages as advantages_lib
from maxtext.grpo.rewards import rewards as rewards_lib
from maxtext.generation import sampling


def step_seed(seed: int, step: int) -> int:
  """The sampling seed of step `step`: a function of (seed, step) only."""
  return int(np.random.SeedSequence([seed, step]).generate_state(1)[0] >> 1)


@dataclasses.dataclass(frozen=True)
class Rollout:
  """One step's completions and everything the loss needs of them.

  Attributes:
    prompts: P id lists.
    completions: P x G id tuples, prompt-major.
    tokens: int32 [N, W]: row r is prompt r // G, then completion r, then
      `sampling.PAD_ID`.
    prompt_lengths: int32 [N].
    completion_lengths: int32 [N].
    mask: float32 [N, L]: 1 on completion ids.
    old_log_probs: float32 [N, L]: the behaviour policy's (0 off the mask),
      at the sampling temperature.
    rewards: the reward functions' values.
    advantages: float32 [N].
    stats: name -> float, the step's rollout statistics.
    sequence_mask: float32 [N]: 0 for a completion that trains nothing
      (cut by the length limit, with overlong filtering on; it still counts
      in its group's advantages, as the reference's), else 1.
    decode_steps: the decode steps generation ran: the paged decoder's
      count, or the static decoder's (its longest completion: every row
      steps until the last stops); 0 where none were counted (multi-turn
      episodes, a pending rollout restored from a checkpoint).
  """

  prompts: list
  completions: list
  tokens: np.ndarray
  prompt_lengths: np.ndarray
  completion_lengths: np.ndarray
  mask: np.ndarray
  old_log_probs: np.ndarray
  rewards: rewards_lib.Rewards
  advantages: np.ndarray
  stats: dict
  sequence_mask: Optional[np.ndarray] = None
  decode_steps: int = 0


def reward_stats(
    total: np.ndarray, per_function: dict[str, np.ndarray]
) -> dict[str, float]:
  """rewards/{sum,mean,min,max,std} of the total rewards and
  rewards/<function> (each function's mean) of the rewards given."""
  stats = {
      "rewards/sum": float(np.sum(total)),
      "rewards/mean": float(np.mean(total)),
      "rewards/min": float(np.min(total)),
      "rewards/max": float(np.max(total)),
      "rewards/std": float(np.std(total)),
  }
  for name, values in per_function.items():
    stats[f"rewards/{name}"] = float(np.mean(values))
  return stats


def rollout_stats(
    rewards: rewards_lib.Rewards,
    completion_lengths: np.ndarray,
    clipped: np.ndarray,
    num_generations: int,
    overlong_filtering: bool = False,
) -> dict[str, float]:
  """The rollout's metrics.

  Args:
    rewards: every completion's rewards (N of them).
    completion_lengths: int [N].
    clipped: bool [N]: the completion reached the length limit without a
      stop id.
    num_generations: G.
    overlong_filtering: the clipped completions train nothing.

  Returns:
    rewards/{sum,mean,min,max,std}, rewards/<function> (its mean),
    frac_reward_zero_std, completions/{mean,min,max}_length,
    completions/clipped_ratio, masked/overlong_frac (the share that trains
    nothing for it: clipped_ratio with overlong filtering, else 0).
  """
  total = rewards.total
  stats = reward_stats(total, rewards.per_function)
  stats["frac_reward_zero_std"] = advantages_lib.zero_std_fraction(
      total.reshape(-1, num_generations)
  )
  stats["completions/mean_length"] = float(np.mean(completion_lengths))
  stats["completions/min_length"] = float(np.min(completion_lengths))
  stats["completions/max_length"] = float(np.max(completion_lengths))
  stats["completions/clipped_ratio"] = float(np.mean(clipped))
  stats["masked/overlong_frac"] = (
      float(np.mean(clipped)) if overlong_filtering else 0.0
  )
  return stats


def rollout(
    params: Any,
    model_config: Any,
    prompts: Sequence[Sequence[int]],
    options: sampling.SamplingOptions,
    reward_functions: Sequence[rewards_lib.RewardFunction],
    *,
    estimator: str = "grpo",
    advantage_eps: float = 1e-4,
    width: int = 0,
    mesh: Optional[jax.sharding.Mesh] = None,
    overlong_filtering: bool = False,
    paged: Optional[paged_decoder.EngineOptions] = (
        paged_decoder.EngineOptions()
    ),
) -> Rollout:
  """Generates, scores and computes advantages for one step.

  Args:
    params: the policy's parameters (the engine's, read in place).
    model_config: the model's config, frozen (the decoder's static argument).
    prompts: P id lists.
    options: the rollout's sampling; `num_samples` is G (>= 2).
    reward_functions: from `rewards.load`.
    estimator: an advantage estimator (`advantages.ESTIMATORS`).
    advantage_eps: the "grpo" estimator's eps.
    width: W, the token columns of every row (a fixed shape compiles the
      loss once); 0 = the longest prompt + options.max_new_tokens.
    mesh: generate with the rows split over this mesh; None = one device.
    overlong_filtering: a completion cut by the length limit (no stop id)
      trains nothing (`Rollout.sequence_mask`).
    paged: the paged decoder's slots and pages (default: a slot per
      completion); None = the static decoder (the same ids).

  Returns:
    The Rollout; its stats add `timing/generate` and `timing/reward` (s).

  Raises:
    ValueError: G < 2, or a prompt longer than `width` allows.
    rewards.RewardError: a reward function failed (one line).
  """
  width = _row_width(prompts, options, width)
  generation, completions, rewards, timing = _generate_and_score(
      params, model_config, prompts, options, reward_functions, paged, mesh
  )
  adv = advantages_lib.per_completion(
      rewards.total, options.num_samples, estimator, advantage_eps
  )
  result = _assemble(
      prompts,
      completions,
      generation,
      rewards,
      adv,
      options,
      width,
      overlong_filtering,
  )
  result.stats.update(timing)
  return result


def _generate_and_score(
    params, model_config, prompts, options, reward_functions, paged, mesh
):
  """(the generation, its N completions, their rewards, the timing stats):
  `rollout`'s generation and scoring, timed."""
  g = options.num_samples
  start = time.perf_counter()
  generation = rollout_decoder.generate(
      params, model_config, prompts, options, engine=paged, mesh=mesh
  )
  generated = time.perf_counter()
  completions = _completions(generation, len(prompts) * g)
  rewards = rewards_lib.score(reward_functions, prompts, completions, g)
  scored = time.perf_counter()
  # `generate` returns host arrays: the device work is done at `generated`.
  timing = {
      "timing/generate": generated - start,
      "timing/reward": scored - generated,
  }
  return generation, completions, rewards, timing


def _row_width(prompts, options: sampling.SamplingOptions, width: int) -> int:
  """W, the rollout's token columns (`rollout`'s `width`), checked.

  Raises:
    ValueError: G < 2, or a prompt longer than `width` allows.
  """
  g = options.num_samples
  if g < 2:
    raise ValueError(f"num_generations={g}: a group needs at least 2")
  length = options.max_new_tokens
  longest = max(len(p) for p in prompts)
  width = width or longest + length
  if longest + length > width:
    raise ValueError(
        f"a prompt of {longest} tokens + {length} completion tokens does not "
        f"fit the rollout width {width}"
    )
  return width


def _completions(generation, n: int) -> list[tuple[int, ...]]:
  """The N generated id tuples, each cut at its length."""
  lengths = np.asarray(generation.lengths, np.int32)
  return [tuple(map(int, generation.ids[r, : lengths[r]])) for r in range(n)]


def _assemble(
    prompts,
    completions,
    generation,
    rewards: rewards_lib.Rewards,
    adv: np.ndarray,
    options: sampling.SamplingOptions,
    width: int,
    overlong_filtering: bool,
) -> Rollout:
  """The Rollout of scored completions: their rows, masks and statistics
  (`masked/overlong_frac` the share overlong filtering took)."""
  g = options.num_samples
  length = options.max_new_tokens
  n = len(completions)
  lengths = np.asarray(generation.lengths, np.int32)
  tokens = np.full((n, width), sampling.PAD_ID, np.int32)
  prompt_lengths = np.zeros((n,), np.int32)
  for r, completion in enumerate(completions):
    prompt = list(prompts[r // g])
    row = prompt + list(completion)
    tokens[r, : len(row)] = row
    prompt_lengths[r] = len(prompt)
  mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
  stop_ids = set(options.stop_ids)
  ends_with_stop = np.array(
      [bool(c) and c[-1] in stop_ids for c in completions]
  )
  clipped = (lengths >= length) & ~ends_with_stop
  sequence_mask = np.ones((n,), np.float32)
  if overlong_filtering:
    sequence_mask[clipped] = 0.0
  return Rollout(
      prompts=[list(p) for p in prompts],
      completions=completions,
      tokens=tokens,
      prompt_lengths=prompt_lengths,
      completion_lengths=lengths,
      mask=mask,
      old_log_probs=np.asarray(generation.log_probs, np.float32) * mask,
      rewards=rewards,
      advantages=adv,
      stats=rollout_stats(rewards, lengths, clipped, g, overlong_filtering),
      sequence_mask=sequence_mask,
      decode_steps=(
          generation.decode_steps
          if isinstance(generation, paged_decoder.EngineGeneration)
          else int(np.max(lengths))
      ),
  )


def micro_batches(result: Rollout, num_micro_batches: int) -> list[dict]:
  """The rollout as the engine's K micro-batches (consecutive rows).

  The rollout's statistics are host values and stay out of them (the step
  puts them straight into its record).

  Args:
    result: the step's rollout (N rows).
    num_micro_batches: K, dividing N.

  Returns:
    K dicts, the `train_loss.loss_fn` micro-batch layout (with
    "sequence_mask", "token_normaliser" and "sequence_normaliser"; without
    the reference's log-probabilities, which the step adds on the devices).

  Raises:
    ValueError: K does not divide N.
  """
  n = len(result.completions)
  if num_micro_batches < 1 or n % num_micro_batches:
    raise ValueError(
        f"gradient_accumulation_steps={num_micro_batches} must divide the "
        f"rollout's {n} completions"
    )
  sequence_mask = (
      np.ones((n,), np.float32)
      if result.sequence_mask is None
      else np.asarray(result.sequence_mask, np.float32)
  )
  counted_tokens = float(np.sum(result.mask * sequence_mask[:, None]))
  counted_sequences = float(np.sum(sequence_mask))
  per_micro_batch = 1.0 / num_micro_batches
  whole = {
      "tokens": result.tokens,
      "prompt_lengths": result.prompt_lengths,
      "mask": result.mask,
      "old_log_probs": result.old_log_probs,
      "advantages": result.advantages.astype(np.float32),
      "sequence_mask": sequence_mask,
      # The step's denominators over K: each micro-batch's sum over them,
      # averaged by the engine over the K, is the step's mean.
      "token_normaliser": np.full(
          (n,), max(counted_tokens, 1.0) * per_micro_batch, np.float32
      ),
      "sequence_normaliser": np.full(
          (n,), max(counted_sequences, 1.0) * per_micro_batch, np.float32
      ),
  }
  rows = n // num_micro_batches
  return [
      {name: x[k * rows : (k + 1) * rows] for name, x in whole.items()}
      for k in range(num_micro_batches)
  ]
