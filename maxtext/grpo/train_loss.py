"""The GRPO step's `loss_fn(params, micro_batch)` for the engine.

One teacher-forced pass of the model over each row (prompt, then completion,
right-padded) gives the policy's log-probability and entropy at every
completion token; `policy_loss.policy_loss` turns them, with the rollout's
behaviour log-probabilities and advantages, into the loss and its metrics.
The rollout's statistics (rewards, lengths, timings) come in as micro-batch
inputs, one float32 value per row, and go out as the mean over the rows, so
every metric of a GRPO step rides the engine's packed array.

Log-probabilities are of the model's own logits (temperature 1), as the
decoder's behaviour log-probabilities are: the sampling temperature and
filters choose which tokens are drawn, not the probabilities trained on.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp

from maxtext.generation import scoring
from maxtext.grpo import policy_loss
from maxtext.metrics import buffer


def loss_fn(
    params: Any,
    micro_batch: dict,
    config,
    options: policy_loss.LossOptions,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> tuple[jax.Array, dict]:
  """The engine's loss for one micro-batch of a rollout.

  Args:
    params: the policy's parameters.
    micro_batch: "tokens" int32 [B, W], "prompt_lengths" int32 [B],
      "mask" float32 [B, L] (1 on completion tokens), "old_log_probs"
      float32 [B, L], "advantages" float32 [B], "ref_log_probs" float32
      [B, L] (only when options.beta > 0).
    config: the model's config.
    options: the loss's hyperparameters.
    mesh: as `transformer.apply`.

  Returns:
    (loss, metrics): `policy_loss`'s, plus "completion_tokens" (a sum over
    the micro-batches).
  """
  mask = micro_batch["mask"]
  log_probs, entropy = scoring.completion_log_probs_and_entropy(
      params,
      micro_batch["tokens"],
      micro_batch["prompt_lengths"],
      mask.shape[1],
      config,
      mesh,
  )
  loss, metrics = policy_loss.policy_loss(
      log_probs,
      micro_batch["old_log_probs"],
      micro_batch["advantages"],
      mask,
      options,
      ref_logp=micro_batch.get("ref_log_probs"),
      entropy=entropy,
  )
  metrics["completion_tokens"] = buffer.SummedMetric(jnp.sum(mask))
  return loss, metrics
