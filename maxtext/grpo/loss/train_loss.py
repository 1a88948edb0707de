"""The GRPO step's `loss_fn(params, micro_batch)` for the engine.

One teacher-forced pass of the model over each row (prompt, then completion,
right-padded) gives the policy's log-probability and entropy at every
completion token; `policy_loss.policy_loss` turns them, with the rollout's
behaviour log-probabilities and advantages, into the loss and its metrics.
Its metrics ride the engine's packed array; the rollout's statistics
(rewards, lengths, timings) are host values that go straight into the
step's record (`rollout_batches.RolloutBatches.complete`), never through
the devices.

Log-probabilities and entropy are of the temperature-scaled distribution
softmax(logits / `options.temperature`), the rollout's, as the decoder's
behaviour log-probabilities are: the policy trained is the one the samples
came from (top-k / top-p filtering is not applied to either).

The micro-batch carries the step's normalisers, one float32 value per row
(the same in every row): the step's counted completion tokens / K and
counted sequences / K (`rollout.micro_batches`), so that "token_mean" is a
mean over the whole step's tokens whatever K is; and `sequence_mask`, 0 for
a sequence that trains nothing (overlong filtering).
"""

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from maxtext.generation import scoring
from maxtext.grpo.loss import frozen_router
from maxtext.grpo.loss import policy_loss
from maxtext.metrics import buffer
from maxtext.model import model_config


def completion_log_probs_and_entropy(
    params: Any,
    micro_batch: dict,
    config: model_config.ModelConfig,
    temperature: float,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> tuple[jax.Array, jax.Array]:
  """The policy's log-probability and entropy at each completion column of
  a micro-batch (`loss_fn`'s layout, packed or not), float32 [B, L] each."""
  if "completion_at" in micro_batch:  # Packed rows (`packed_batches`).
    return scoring.packed_completion_log_probs_and_entropy(
        params,
        micro_batch["tokens"],
        micro_batch["segment_ids"],
        micro_batch["positions"],
        micro_batch["completion_at"],
        config,
        mesh,
        temperature,
    )
  return scoring.completion_log_probs_and_entropy(
      params,
      micro_batch["tokens"],
      micro_batch["prompt_lengths"],
      micro_batch["mask"].shape[1],
      config,
      mesh,
      temperature,
  )


def loss_fn(
    params: Any,
    micro_batch: dict,
    config: model_config.ModelConfig,
    options: policy_loss.LossOptions,
    mesh: Optional[jax.sharding.Mesh] = None,
    freeze_router: bool = False,
) -> tuple[jax.Array, dict]:
  """The engine's loss for one micro-batch of a rollout.

  Args:
    params: the policy's parameters.
    micro_batch: "tokens" int32 [B, W], "prompt_lengths" int32 [B],
      "mask" float32 [B, L] (1 on completion tokens), "old_log_probs"
      float32 [B, L], "advantages" float32 [B], "ref_log_probs" float32
      [B, L] (only when options.beta > 0); optional "sequence_mask",
      "token_normaliser" and "sequence_normaliser", float32 [B] each (module
      docstring; left out, every sequence counts and the normalisers are the
      micro-batch's own), and, with a log-prob-error threshold, the gate's
      "logprob_error_mask" and "counted_sequence_normaliser"
      (`logprob_gate`). A packed micro-batch (`packed_batches`) has
      "tokens" of its packed rows and "segment_ids", "positions" and
      "completion_at" beside them.
    config: the model's config.
    options: the loss's hyperparameters.
    mesh: as `transformer.apply`.
    freeze_router: the MoE router's parameters get no gradient
      (`frozen_router`; the optimizer's decay mask must leave them too).

  Returns:
    (loss, metrics): `policy_loss`'s, plus "completion_tokens" (a sum over
    the micro-batches).
  """
  mask = micro_batch["mask"]
  if freeze_router:
    params = frozen_router.stop_gradients(params)
  log_probs, entropy = completion_log_probs_and_entropy(
      params, micro_batch, config, options.temperature, mesh
  )

  per_step = functools.partial(_per_step, micro_batch)
  loss, metrics = policy_loss.policy_loss(
      log_probs,
      micro_batch["old_log_probs"],
      micro_batch["advantages"],
      mask,
      options,
      ref_logp=micro_batch.get("ref_log_probs"),
      entropy=entropy,
      sequence_mask=micro_batch.get("sequence_mask"),
      token_normaliser=per_step("token_normaliser"),
      sequence_normaliser=per_step("sequence_normaliser"),
      logprob_error_mask=micro_batch.get("logprob_error_mask"),
      counted_sequence_normaliser=per_step("counted_sequence_normaliser"),
  )
  metrics["completion_tokens"] = buffer.SummedMetric(jnp.sum(mask))
  return loss, metrics


def _per_step(micro_batch: dict, name: str) -> Optional[jax.Array]:
  """The micro-batch's step-wide value `name` (one value repeated in every
  row, as rows may be split over devices), or None without it."""
  values = micro_batch.get(name)
  return None if values is None else jnp.mean(values)


# The step's reduction of the extremes among loss_fn's metrics: the caller
# sets them as the flushed record's aggregation_fns (every other metric is
# the mean over the micro-batches, which the normalisers make the step's).
STEP_AGGREGATIONS = policy_loss.STEP_AGGREGATIONS
