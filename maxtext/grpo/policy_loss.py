"""The GRPO policy loss over completion tokens, and the metrics it reports.

Per completion token t of sequence b, with the policy's log-probability
`logp`, the behaviour policy's `old_logp` (the parameters that sampled the
rollout) and the sequence's advantage A_b:

    ratio  = exp(logp - old_logp)
    pg     = max(-A ratio, -A clip(ratio, 1 - epsilon, 1 + epsilon_high))
    loss   = aggregate(pg) + beta x aggregate(kl(logp, ref_logp))

The clip stops the gradient of a token once the ratio has moved past the
trust region in the direction its advantage pushes: with A > 0 above
1 + epsilon_high, with A < 0 below 1 - epsilon (`pg_clipfrac_upper`,
`pg_clipfrac_lower`). The KL term pulls towards a frozen reference policy
with the per-token estimators of KL(policy || reference), d = ref - logp:

* "k1": -d (unbiased, can be negative per token);
* "k3": exp(d) - d - 1 (unbiased under the policy's samples, >= 0).

With beta = 0 no reference is needed and `kl` is reported as 0.

Aggregations (masked tokens count for nothing):

* "token_mean": the sum over tokens / the number of tokens;
* "sequence_mean_token_mean": each sequence's token mean, then the mean over
  the sequences (the original GRPO);
* "dr_grpo": the sum over tokens / (sequences x max_completion_length), a
  constant normaliser, so a sequence's length does not scale its tokens'
  weight (Dr.GRPO).

Each is computed within one micro-batch; the engine averages the
micro-batches' losses and gradients, so "token_mean" is the mean of the
micro-batches' token means. Every reported metric is a scalar of the
micro-batch and the recorder's step value is their mean over the
micro-batches (for `is_ratio/max` and `/min`: the mean of the micro-batches'
extremes).
"""

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

# maxtext.core.choices.GRPO_KL_ESTIMATORS and GRPO_LOSS_AGGREGATIONS.
KL_ESTIMATORS = ("k1", "k3")
AGGREGATIONS = ("token_mean", "sequence_mean_token_mean", "dr_grpo")


@dataclasses.dataclass(frozen=True)
class LossOptions:
  """The loss's hyperparameters (config fields `grpo_*`).

  Attributes:
    epsilon: the lower clip: ratios below 1 - epsilon are clipped (> 0).
    epsilon_high: the upper clip, 1 + epsilon_high; None = epsilon.
    beta: the weight of the KL term; 0 = no reference policy.
    kl_estimator: one of KL_ESTIMATORS.
    aggregation: one of AGGREGATIONS.
    max_completion_length: the "dr_grpo" aggregation's constant (tokens).
  """

  epsilon: float = 0.2
  epsilon_high: Optional[float] = None
  beta: float = 0.0
  kl_estimator: str = "k3"
  aggregation: str = "token_mean"
  max_completion_length: int = 0

  def __post_init__(self):
    if not self.epsilon > 0:
      raise ValueError(f"epsilon={self.epsilon!r}: must be > 0")
    if self.epsilon_high is not None and not self.epsilon_high > 0:
      raise ValueError(f"epsilon_high={self.epsilon_high!r}: must be > 0")
    if not self.beta >= 0:
      raise ValueError(f"beta={self.beta!r}: must be >= 0")
    if self.kl_estimator not in KL_ESTIMATORS:
      raise ValueError(
          f"kl_estimator={self.kl_estimator!r}: must be one of "
          f"{list(KL_ESTIMATORS)}"
      )
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(
          f"aggregation={self.aggregation!r}: must be one of "
          f"{list(AGGREGATIONS)}"
      )
    if self.aggregation == "dr_grpo" and self.max_completion_length < 1:
      raise ValueError(
          f"max_completion_length={self.max_completion_length!r}: the "
          "'dr_grpo' aggregation needs it >= 1"
      )

  @property
  def upper(self) -> float:
    """The upper clip's epsilon."""
    return self.epsilon if self.epsilon_high is None else self.epsilon_high


def kl_per_token(logp: jax.Array, ref_logp: jax.Array, estimator: str):
  """The per-token estimate of KL(policy || reference).

  Args:
    logp: float [B, T]: the policy's log-probabilities of the sampled tokens.
    ref_logp: float [B, T]: the reference policy's, of the same tokens.
    estimator: one of KL_ESTIMATORS.
  """
  d = ref_logp - logp
  if estimator == "k1":
    return -d
  if estimator == "k3":
    return jnp.exp(d) - d - 1.0
  raise ValueError(
      f"kl_estimator={estimator!r}: must be one of {list(KL_ESTIMATORS)}"
  )


def aggregate(
    values: jax.Array,
    mask: jax.Array,
    mode: str,
    max_completion_length: int = 0,
) -> jax.Array:
  """One number from per-token values, masked tokens left out.

  Args:
    values: float [B, T].
    mask: [B, T], 1 on completion tokens, 0 elsewhere.
    mode: one of AGGREGATIONS.
    max_completion_length: the "dr_grpo" constant.

  Returns:
    A float32 scalar (0 when the mask is all 0).
  """
  mask = mask.astype(jnp.float32)
  masked = values.astype(jnp.float32) * mask
  if mode == "token_mean":
    return jnp.sum(masked) / jnp.maximum(jnp.sum(mask), 1.0)
  if mode == "sequence_mean_token_mean":
    per_sequence = jnp.sum(masked, axis=1) / jnp.maximum(
        jnp.sum(mask, axis=1), 1.0
    )
    return jnp.mean(per_sequence)
  if mode == "dr_grpo":
    if max_completion_length < 1:
      raise ValueError(
          f"max_completion_length={max_completion_length!r}: the 'dr_grpo' "
          "aggregation needs it >= 1"
      )
    return jnp.sum(masked) / (values.shape[0] * max_completion_length)
  raise ValueError(f"aggregation={mode!r}: must be one of {list(AGGREGATIONS)}")


def _masked_mean(values, mask):
  mask = mask.astype(jnp.float32)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _masked_extreme(values, mask, fn, fill):
  """max or min over the masked-in entries; 0 when none is."""
  mask = mask.astype(bool)
  out = fn(jnp.where(mask, values, fill))
  return jnp.where(jnp.any(mask), out, 0.0)


def advantage_metrics(advantages: jax.Array) -> dict[str, jax.Array]:
  """advantage/{mean,abs_mean,max,min,nonzero_frac} over the sequences.

  Args:
    advantages: float [B]: one advantage per sequence.
  """
  a = advantages.astype(jnp.float32)
  return {
      "mean": jnp.mean(a),
      "abs_mean": jnp.mean(jnp.abs(a)),
      "max": jnp.max(a),
      "min": jnp.min(a),
      "nonzero_frac": jnp.mean((a != 0).astype(jnp.float32)),
  }


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    options: LossOptions,
    ref_logp: Optional[jax.Array] = None,
    entropy: Optional[jax.Array] = None,
) -> tuple[jax.Array, dict]:
  """The clipped policy-gradient loss plus beta x KL, with its metrics.

  Args:
    logp: float [B, T]: the policy's log-probabilities of the completion
      tokens (differentiated).
    old_logp: float [B, T]: the behaviour policy's (no gradient flows).
    advantages: float [B]: one advantage per sequence.
    mask: [B, T]: 1 on completion tokens, 0 on the prompt and padding.
    options: the loss's hyperparameters.
    ref_logp: float [B, T]: the reference policy's; required when
      options.beta > 0, ignored otherwise.
    entropy: float [B, T]: the policy's per-token entropy, reported (not
      differentiated); None = reported as 0.

  Returns:
    (loss, metrics): loss a float32 scalar; metrics a nested dict of float32
    scalars: pg_loss, kl, kl_loss, pg_clipfrac, pg_clipfrac_lower,
    pg_clipfrac_upper, ppo_kl, entropy, is_ratio/{mean,max,min},
    advantage/{mean,abs_mean,max,min,nonzero_frac}.

  Raises:
    ValueError: beta > 0 and no ref_logp.
  """
  mask = mask.astype(jnp.float32)
  logp = logp.astype(jnp.float32)
  old_logp = jax.lax.stop_gradient(old_logp.astype(jnp.float32))
  adv = jax.lax.stop_gradient(advantages.astype(jnp.float32))[:, None]
  log_ratio = logp - old_logp
  ratio = jnp.exp(log_ratio)
  clipped_ratio = jnp.clip(ratio, 1.0 - options.epsilon, 1.0 + options.upper)
  unclipped = -adv * ratio
  clipped = -adv * clipped_ratio
  per_token = jnp.maximum(unclipped, clipped)

  def agg(values):
    return aggregate(
        values, mask, options.aggregation, options.max_completion_length
    )

  pg_loss = agg(per_token)
  if options.beta > 0:
    if ref_logp is None:
      raise ValueError("beta > 0 needs the reference log-probabilities")
    kl = agg(
        kl_per_token(
            logp, jax.lax.stop_gradient(ref_logp), options.kl_estimator
        )
    )
  else:
    kl = jnp.zeros((), jnp.float32)
  kl_loss = options.beta * kl
  loss = pg_loss + kl_loss

  # The clip is active where the clipped term is the larger (its gradient,
  # zero, is then the one taken).
  active = (clipped > unclipped).astype(jnp.float32)
  lower = active * (adv < 0)
  upper = active * (adv > 0)
  ratio_sg = jax.lax.stop_gradient(ratio)
  metrics = {
      "pg_loss": pg_loss,
      "kl": kl,
      "kl_loss": kl_loss,
      "pg_clipfrac": _masked_mean(active, mask),
      "pg_clipfrac_lower": _masked_mean(lower, mask),
      "pg_clipfrac_upper": _masked_mean(upper, mask),
      "ppo_kl": _masked_mean(jax.lax.stop_gradient(-log_ratio), mask),
      "entropy": (
          jnp.zeros((), jnp.float32)
          if entropy is None
          else _masked_mean(jax.lax.stop_gradient(entropy), mask)
      ),
      "is_ratio": {
          "mean": _masked_mean(ratio_sg, mask),
          "max": _masked_extreme(ratio_sg, mask, jnp.max, -jnp.inf),
          "min": _masked_extreme(ratio_sg, mask, jnp.min, jnp.inf),
      },
      "advantage": advantage_metrics(advantages),
  }
  return loss, metrics
