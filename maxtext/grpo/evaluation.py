"""Held-out evaluation of a policy: pass@1 and pass@k on fixed prompts.

Each held-out prompt is continued k times with the eval's sampling options;
a completion passes when `is_correct(prompt, completion)` says so. pass@1
is the mean over prompts of the share of passing samples, pass@k the
unbiased estimate of at least one of k passing (`pass_rate`), which with k
samples drawn is exactly the grouped pass@k: the share of prompts of which
any sample passes (MLPerf qwen35_397b_grpo's eval_accuracy, k = 4). Both
are higher-is-better metrics (`eval_metrics.Direction.HIGHER_IS_BETTER`).
"""

from typing import Any, Callable, Optional, Sequence

import jax

from maxtext.generation import paged_decoder
from maxtext.generation import rollout_decoder
from maxtext.grpo.rewards import pass_rate
from maxtext.generation import sampling


def evaluate(
    params: Any,
    model_config: Any,
    prompts: Sequence[Sequence[int]],
    options: sampling.SamplingOptions,
    is_correct: Callable[[Sequence[int], Sequence[int]], float],
    *,
    engine: Optional[paged_decoder.EngineOptions] = None,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> dict[str, float]:
  """pass@1 and pass@k (k = options.num_samples) over `prompts`, generated
  by the run's decoder (`engine`: `rollout_decoder.generate`).

  Returns:
    {"pass@1": ..., "pass@k": ...} (one key when k = 1), each in [0, 1].
  """
  k = options.num_samples
  generation = rollout_decoder.generate(
      params, model_config, prompts, options, engine=engine, mesh=mesh
  )
  correct = []
  for index, prompt in enumerate(prompts):
    row = []
    for sample in range(k):
      r = index * k + sample
      completion = tuple(map(int, generation.ids[r, : generation.lengths[r]]))
      row.append(bool(is_correct(tuple(prompt), completion)))
    correct.append(row)
  out = {"pass@1": pass_rate.mean_pass_at_k(correct, 1)}
  if k > 1:
    out[f"pass@{k}"] = pass_rate.mean_pass_at_k(correct, k)
  return out
