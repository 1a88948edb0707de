"""A rollout's decoder, as the config picks: the paged engine or the static.

`grpo_decoder` picks how a GRPO run generates, and the choice holds for all
of the run's generation: the training rollouts and the held-out evaluation
alike. The paged engine (`paged_decoder`) keeps a fixed number of slots and
the pages the sequences use; the static decoder (`decoder`) holds one batch
row per completion over a dense cache of the longest length, so its memory
grows with every completion of the call at once. Both draw the same ids and
log-probabilities for the same prompts, options and parameters.
"""

from typing import Any, Optional, Sequence, Union

import jax

from maxtext.generation import decoder
from maxtext.generation import paged_decoder
from maxtext.generation import sampling
from maxtext.model import model_config


def generate(
    params: Any,
    config: model_config.ModelConfig,
    prompts: Sequence[Sequence[int]],
    options: sampling.SamplingOptions,
    *,
    engine: Optional[paged_decoder.EngineOptions],
    allowed_vocab: int = 0,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> Union[decoder.Generation, paged_decoder.EngineGeneration]:
  """Continues each prompt `options.num_samples` times.

  Args:
    params, config, prompts, options, allowed_vocab, mesh: as
      `decoder.generate`.
    engine: the paged engine's slots and pages; None = the static decoder.

  Returns:
    The generation: `ids`, `log_probs` and `lengths`, one row per sample,
    the samples of a prompt together.
  """
  if engine is None:
    return decoder.generate(
        params,
        config,
        prompts,
        options,
        allowed_vocab=allowed_vocab,
        mesh=mesh,
    )
  return paged_decoder.generate(
      params,
      config,
      prompts,
      options,
      engine=engine,
      allowed_vocab=allowed_vocab,
      mesh=mesh,
  )
