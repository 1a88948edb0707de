"""The GRPO policy loss over completion tokens, and the metrics it reports.

Per completion token t of sequence b, with the policy's log-probability
`logp`, the generator's `old_logp` (the parameters that sampled the rollout,
at the sampling temperature) and the sequence's advantage A_b:

    ratio  = exp(logp - old_logp)
    pg     = max(-A ratio, -A clip(ratio, 1 - epsilon, 1 + epsilon_high))
    loss   = aggregate(w x pg) + beta x aggregate(kl(logp, ref_logp))

with w = 1 unless the reference's options below are on. The clip stops the
gradient of a token once the ratio has moved past the trust region in the
direction its advantage pushes: with A > 0 above 1 + epsilon_high, with
A < 0 below 1 - epsilon (`pg_clipfrac_upper`, `pg_clipfrac_lower`). The KL
term pulls towards a frozen reference policy with the per-token estimators
of KL(policy || reference), d = ref - logp:

* "k1": -d (unbiased, can be negative per token);
* "k3": exp(d) - d - 1 (unbiased under the policy's samples, >= 0).

With beta = 0 no reference is needed and `kl` is reported as 0.

MLPerf qwen35_397b_grpo's reference loss (NeMo-RL's ClippedPGLossFn as the
benchmark configures it; docs/grpo.md names the version followed). With
`prev` = stop_gradient(logp), the trained policy's log-probabilities of the
step (one update per rollout, so they are those at the step's start):

* `force_on_policy_ratio`: ratio = exp(logp - prev), 1 in value, so the clip
  never acts, and each token is weighted by the importance ratio
  w = exp(prev - old_logp) = pi_train / pi_generator (no gradient through w).
* Sequence-mask truncated importance sampling (`tis_ratio_min`,
  `tis_ratio_max`, needs the forced ratio): a sequence whose geometric-mean
  ratio exp(mean over its tokens of (prev - old_logp)) lies outside
  [min, max] gets w = 0 on every token (`masked/tis_frac`); kept sequences
  keep their untruncated token weights.
* Log-probability-error masking (`logprob_error_threshold`): a sequence
  whose error, the mean over its tokens of exp(|old_logp - prev|)
  (`sequence_logprob_error`), exceeds the threshold trains nothing and
  leaves the normalisers, as the reference removes it from its sample mask
  before the loss (`masked/logprob_error_frac`, `logprob_error/{mean,max}`,
  over the sequences counted before this gate).
* The importance weights and the log-ratios of the geometric mean pass
  through nan_to_num (NaN and +-inf become 0), as the reference's do: a
  non-finite generator log-probability masks its token, not the step.

The TIS gate acts inside the loss: its sequences keep their tokens in the
normaliser (the reference's in-loss mask). The log-prob-error gate needs
the step's normalisers without its sequences, so with gradient
accumulation it is decided before the loss, over the whole step
(`logprob_gate`), and comes in as `logprob_error_mask` with `sequence_mask`
and the normalisers already without those sequences; a call given neither
normaliser is the whole step and gates itself. Overlong filtering and any
other mask known before the loss come in as `sequence_mask` and leave the
normalisers too.

Aggregations (masked tokens count for nothing):

* "token_mean": the sum over tokens / the number of tokens;
* "sequence_mean_token_mean": each sequence's token mean, then the mean over
  the sequences (the original GRPO);
* "dr_grpo": the sum over tokens / (sequences x max_completion_length), a
  constant normaliser, so a sequence's length does not scale its tokens'
  weight (Dr.GRPO).

With gradient accumulation the engine averages its K micro-batches' losses.
So that "token_mean" is the mean over the whole step's tokens (a token's
weight not depending on its micro-batch), the caller passes the step's
normalisers divided by K (`token_normaliser`, `sequence_normaliser`): each
micro-batch's sum over them, averaged over K, is the step's mean. Every
token-level metric (`pg_loss`, `kl`, `pg_clipfrac*`, `ppo_kl`, `entropy`,
`is_ratio/mean`, `sampling_is_ratio/mean`) is normalised the same way, so
the mean over the micro-batches is the step's value. The extremes
(`*/max`, `*/min`) are each micro-batch's; `STEP_AGGREGATIONS` reduces them
to the step's true extremes (a micro-batch without tokens reports
-/+ EMPTY, which the reduction ignores).
"""

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import choices
from maxtext.grpo.loss import registry

# The KL estimators by name: each maps (logp, ref_logp), float [B, T], to the
# per-token estimate of KL(policy || reference). A new one is one function
# registered under a name of maxtext.core.choices.GRPO_KL_ESTIMATORS.
_KL_ESTIMATORS = registry.Registry(
    "grpo_kl_estimator", choices.GRPO_KL_ESTIMATORS
)
# The aggregations by name: each maps the masked per-token values and the
# mask, float32 [B, T], with the keyword arguments max_completion_length,
# token_normaliser and sequence_normaliser (as `aggregate` takes them), to a
# float32 scalar. A new one is one function registered under a name of
# maxtext.core.choices.GRPO_LOSS_AGGREGATIONS.
_AGGREGATIONS = registry.Registry(
    "grpo_loss_aggregation", choices.GRPO_LOSS_AGGREGATIONS
)

# What an extreme reports when its micro-batch has no token (or sequence) to
# take it over: -EMPTY for a max, +EMPTY for a min (finite, so no step is
# flagged for it); STEP_AGGREGATIONS skips these.
EMPTY = 3.4028234663852886e38  # float32's largest finite value.


def _step_max(values) -> float:
  """The step's max of per-micro-batch maxima; 0 when none had a value."""
  values = np.asarray(values, np.float64)
  values = values[values > -EMPTY]
  return float(values.max()) if values.size else 0.0


def _step_min(values) -> float:
  """The step's min of per-micro-batch minima; 0 when none had a value."""
  values = np.asarray(values, np.float64)
  values = values[values < EMPTY]
  return float(values.min()) if values.size else 0.0


# The step's reduction of the extremes `policy_loss` reports per micro-batch
# (the recorder's aggregation_fns; every other metric is the mean).
STEP_AGGREGATIONS = {
    **{
        f"{name}/max": _step_max
        for name in (
            "is_ratio",
            "sampling_is_ratio",
            "advantage",
            "logprob_error",
            "tis_geo_mean",
        )
    },
    **{
        f"{name}/min": _step_min
        for name in (
            "is_ratio",
            "sampling_is_ratio",
            "advantage",
            "tis_geo_mean",
        )
    },
}


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
    temperature: the rollout's sampling temperature: the trained policy is
      softmax(logits / temperature), the distribution the samples came
      from (> 0).
    force_on_policy_ratio: the ratio is exp(logp - stop_gradient(logp)) and
      each token is weighted by pi_train / pi_generator (module docstring).
    tis_ratio_min, tis_ratio_max: sequence-mask truncated importance
      sampling's bounds on a sequence's geometric-mean ratio; None = off
      (both or neither; needs force_on_policy_ratio).
    logprob_error_threshold: mask a sequence whose mean exp(|old_logp -
      logp|) exceeds it (> 1); None = off.
  """

  epsilon: float = 0.2
  epsilon_high: Optional[float] = None
  beta: float = 0.0
  kl_estimator: str = "k3"
  aggregation: str = "token_mean"
  max_completion_length: int = 0
  temperature: float = 1.0
  force_on_policy_ratio: bool = False
  tis_ratio_min: Optional[float] = None
  tis_ratio_max: Optional[float] = None
  logprob_error_threshold: Optional[float] = None

  def __post_init__(self):
    if not self.epsilon > 0:
      raise ValueError(f"epsilon={self.epsilon!r}: must be > 0")
    if self.epsilon_high is not None and not self.epsilon_high > 0:
      raise ValueError(f"epsilon_high={self.epsilon_high!r}: must be > 0")
    if not self.beta >= 0:
      raise ValueError(f"beta={self.beta!r}: must be >= 0")
    _KL_ESTIMATORS.check(self.kl_estimator)
    _AGGREGATIONS.check(self.aggregation)
    if self.aggregation == "dr_grpo" and self.max_completion_length < 1:
      raise ValueError(
          f"max_completion_length={self.max_completion_length!r}: the "
          "'dr_grpo' aggregation needs it >= 1"
      )
    if not self.temperature > 0:
      raise ValueError(f"temperature={self.temperature!r}: must be > 0")
    if (self.tis_ratio_min is None) != (self.tis_ratio_max is None):
      raise ValueError(
          f"tis_ratio_min={self.tis_ratio_min!r}, tis_ratio_max="
          f"{self.tis_ratio_max!r}: set both or neither"
      )
    if self.tis_ratio_min is not None:
      if not 0 <= self.tis_ratio_min <= 1 <= self.tis_ratio_max:
        raise ValueError(
            f"tis_ratio_min={self.tis_ratio_min!r}, tis_ratio_max="
            f"{self.tis_ratio_max!r}: need 0 <= min <= 1 <= max"
        )
      if not self.force_on_policy_ratio:
        raise ValueError(
            f"tis_ratio_min={self.tis_ratio_min!r}: truncated importance "
            "sampling needs force_on_policy_ratio (the importance weights "
            "it truncates)"
        )
    if (
        self.logprob_error_threshold is not None
        and not self.logprob_error_threshold > 1
    ):
      raise ValueError(
          f"logprob_error_threshold={self.logprob_error_threshold!r}: must "
          "be > 1 (the error exp(|difference|) is >= 1)"
      )

  @property
  def upper(self) -> float:
    """The upper clip's epsilon."""
    return self.epsilon if self.epsilon_high is None else self.epsilon_high

  @property
  def tis(self) -> bool:
    """Whether sequence-mask truncated importance sampling is on."""
    return self.tis_ratio_min is not None


def kl_per_token(logp: jax.Array, ref_logp: jax.Array, estimator: str):
  """The per-token estimate of KL(policy || reference).

  Args:
    logp: float [B, T]: the policy's log-probabilities of the sampled tokens.
    ref_logp: float [B, T]: the reference policy's, of the same tokens.
    estimator: one of KL_ESTIMATORS.
  """
  return _KL_ESTIMATORS[estimator](logp, ref_logp)


@_KL_ESTIMATORS.register("k1")
def _k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """-d, d = ref_logp - logp."""
  return -(ref_logp - logp)


@_KL_ESTIMATORS.register("k3")
def _k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """exp(d) - d - 1, d = ref_logp - logp."""
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0


def aggregate(
    values: jax.Array,
    mask: jax.Array,
    mode: str,
    max_completion_length: int = 0,
    *,
    token_normaliser: Optional[jax.Array] = None,
    sequence_normaliser: Optional[jax.Array] = None,
) -> jax.Array:
  """One number from per-token values, masked tokens left out.

  Args:
    values: float [B, T].
    mask: [B, T], 1 on the completion tokens that count, 0 elsewhere.
    mode: one of AGGREGATIONS.
    max_completion_length: the "dr_grpo" constant.
    token_normaliser: "token_mean"'s denominator (a scalar); None = the
      mask's tokens (at least 1).
    sequence_normaliser: "sequence_mean_token_mean"'s denominator (a
      scalar); None = B.

  Returns:
    A float32 scalar (0 when the mask is all 0).
  """
  function = _AGGREGATIONS[mode]
  mask = mask.astype(jnp.float32)
  return function(
      values.astype(jnp.float32) * mask,
      mask,
      max_completion_length=max_completion_length,
      token_normaliser=token_normaliser,
      sequence_normaliser=sequence_normaliser,
  )


@_AGGREGATIONS.register("token_mean")
def _token_mean(masked, mask, *, token_normaliser, **_):
  """The sum over tokens / the tokens (or token_normaliser)."""
  if token_normaliser is None:
    token_normaliser = jnp.maximum(jnp.sum(mask), 1.0)
  return jnp.sum(masked) / token_normaliser


@_AGGREGATIONS.register("sequence_mean_token_mean")
def _sequence_mean_token_mean(masked, mask, *, sequence_normaliser, **_):
  """Each sequence's token mean, summed / B (or sequence_normaliser)."""
  per_sequence = jnp.sum(masked, axis=1) / jnp.maximum(
      jnp.sum(mask, axis=1), 1.0
  )
  if sequence_normaliser is None:
    sequence_normaliser = float(masked.shape[0])
  return jnp.sum(per_sequence) / sequence_normaliser


@_AGGREGATIONS.register("dr_grpo")
def _dr_grpo(masked, mask, *, max_completion_length, **_):
  """The sum over tokens / (B x max_completion_length)."""
  del mask
  if max_completion_length < 1:
    raise ValueError(
        f"max_completion_length={max_completion_length!r}: the 'dr_grpo' "
        "aggregation needs it >= 1"
    )
  return jnp.sum(masked) / (masked.shape[0] * max_completion_length)


_KL_ESTIMATORS.complete()
_AGGREGATIONS.complete()
# The names (maxtext.core.choices.GRPO_KL_ESTIMATORS and
# GRPO_LOSS_AGGREGATIONS).
KL_ESTIMATORS = _KL_ESTIMATORS.names
AGGREGATIONS = _AGGREGATIONS.names


def _masked_extreme(values, mask, fn, fill):
  """max or min over the masked-in entries; `fill` when none is."""
  mask = mask.astype(bool)
  return fn(jnp.where(mask, values, fill))


def _extremes(values, mask) -> dict:
  return {
      "max": _masked_extreme(values, mask, jnp.max, -EMPTY),
      "min": _masked_extreme(values, mask, jnp.min, EMPTY),
  }


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


def sequence_logprob_error(
    old_logp: jax.Array, logp: jax.Array, mask: jax.Array
) -> jax.Array:
  """Each row's log-probability error: the mean over its masked-in tokens of
  exp(|old_logp - logp|) (>= 1; 0 for a row without tokens).

  Args:
    old_logp, logp: float [B, T]: the generator's and the trained policy's.
    mask: [B, T].
  """
  return sequence_mean(jnp.exp(jnp.abs(old_logp - logp)), mask)


def sequence_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Each row's mean over its masked-in tokens (0 for a row without any).

  Args:
    values: float [B, T].
    mask: [B, T].
  """
  mask = mask.astype(jnp.float32)
  return jnp.sum(values * mask, axis=1) / jnp.maximum(
      jnp.sum(mask, axis=1), 1.0
  )


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    options: LossOptions,
    ref_logp: Optional[jax.Array] = None,
    entropy: Optional[jax.Array] = None,
    *,
    sequence_mask: Optional[jax.Array] = None,
    token_normaliser: Optional[jax.Array] = None,
    sequence_normaliser: Optional[jax.Array] = None,
    logprob_error_mask: Optional[jax.Array] = None,
    counted_sequence_normaliser: Optional[jax.Array] = None,
) -> tuple[jax.Array, dict]:
  """The policy-gradient loss plus beta x KL, with its metrics.

  Args:
    logp: float [B, T]: the policy's log-probabilities of the completion
      tokens (differentiated).
    old_logp: float [B, T]: the generator's (no gradient flows).
    advantages: float [B]: one advantage per sequence.
    mask: [B, T]: 1 on completion tokens, 0 on the prompt and padding.
    options: the loss's hyperparameters.
    ref_logp: float [B, T]: the reference policy's; required when
      options.beta > 0, ignored otherwise.
    entropy: float [B, T]: the policy's per-token entropy, reported (not
      differentiated); None = reported as 0.
    sequence_mask, token_normaliser, sequence_normaliser, logprob_error_mask,
      counted_sequence_normaliser: what the step decided before the loss
      (`_Masks`; module docstring); each None = this call's own.

  Returns:
    (loss, metrics): loss a float32 scalar; metrics a nested dict of float32
    scalars (`_metrics`).

  Raises:
    ValueError: beta > 0 and no ref_logp; a log-prob-error threshold with
      the step's normalisers but not the gate's mask.
  """
  logp = logp.astype(jnp.float32)
  old_logp = jax.lax.stop_gradient(old_logp.astype(jnp.float32))
  masks = _masks(
      jax.lax.stop_gradient(logp),
      old_logp,
      mask,
      options,
      sequence_mask=sequence_mask,
      token_normaliser=token_normaliser,
      sequence_normaliser=sequence_normaliser,
      logprob_error_mask=logprob_error_mask,
      counted_sequence_normaliser=counted_sequence_normaliser,
  )
  terms = _surrogate(logp, old_logp, advantages, masks, options)
  pg_loss = masks.aggregate(terms.weights * terms.per_token, options)
  kl = _kl(logp, ref_logp, masks, options)
  kl_loss = options.beta * kl
  loss = pg_loss + kl_loss
  losses = {"pg_loss": pg_loss, "kl": kl, "kl_loss": kl_loss}
  return loss, _metrics(losses, terms, masks, advantages, entropy)


@dataclasses.dataclass(frozen=True)
class _Masks:
  """Which tokens and sequences count, and the denominators (no gradient).

  Attributes:
    token_mask: float [B, T]: the completion tokens (`mask`).
    sequence_mask: float [B]: the trained sequences: the given
      `sequence_mask` (None = all 1) without those the log-prob-error gate
      took when this call gates itself.
    mask: float [B, T]: token_mask x sequence_mask, the tokens that train.
    counted_rows: float [B]: the sequences counted before the
      log-prob-error gate.
    error: float [B]: each sequence's `sequence_logprob_error`.
    error_masked: float [B]: 1 where the log-prob-error gate took it.
    token_normaliser: "token_mean"'s and every token metric's denominator
      (given: the step's trained tokens / K; else this call's).
    sequence_normaliser: "sequence_mean_token_mean"'s and the TIS share's
      (given: the step's trained sequences / K; else this call's).
    counted_sequence_normaliser: the log-prob-error metrics' (given: the
      step's sequences counted before that gate / K; else this call's).
  """

  token_mask: jax.Array
  sequence_mask: jax.Array
  mask: jax.Array
  counted_rows: jax.Array
  error: jax.Array
  error_masked: jax.Array
  token_normaliser: jax.Array
  sequence_normaliser: jax.Array
  counted_sequence_normaliser: jax.Array

  def aggregate(self, values: jax.Array, options: LossOptions) -> jax.Array:
    """`aggregate` of per-token values over the trained tokens."""
    return aggregate(
        values,
        self.mask,
        options.aggregation,
        options.max_completion_length,
        token_normaliser=self.token_normaliser,
        sequence_normaliser=self.sequence_normaliser,
    )

  def token_mean(self, values: jax.Array) -> jax.Array:
    """A token metric: the sum over the trained tokens / token_normaliser."""
    return jnp.sum(values * self.mask) / self.token_normaliser

  def sequence_share(self, values: jax.Array) -> jax.Array:
    """A sequence metric over the trained sequences."""
    return jnp.sum(values * self.sequence_mask) / self.sequence_normaliser

  def counted_share(self, values: jax.Array) -> jax.Array:
    """A sequence metric over the sequences counted before the gate."""
    return (
        jnp.sum(values * self.counted_rows) / self.counted_sequence_normaliser
    )


def _constant(value) -> jax.Array:
  """A float32 array without gradient."""
  return jax.lax.stop_gradient(jnp.asarray(value, jnp.float32))


def _masks(
    prev,
    old_logp,
    mask,
    options,
    *,
    sequence_mask,
    token_normaliser,
    sequence_normaliser,
    logprob_error_mask,
    counted_sequence_normaliser,
) -> _Masks:
  """The masks and denominators of `policy_loss`'s call.

  `prev` is stop_gradient(logp); the rest are `policy_loss`'s arguments:
  `sequence_mask` [B] is 0 for a sequence that trains nothing and leaves the
  normalisers (overlong filtering, the log-prob-error gate decided before
  the loss); `logprob_error_mask` [B] is 1 for a sequence that gate
  (`logprob_gate`) took, needed with a threshold and the step's
  normalisers; with neither normaliser given, the call is the whole step
  and gates itself.
  """
  token_mask = mask.astype(jnp.float32)
  if sequence_mask is None:
    sequence_mask = jnp.ones((prev.shape[0],), jnp.float32)
  sequence_mask = jax.lax.stop_gradient(sequence_mask.astype(jnp.float32))
  error = sequence_logprob_error(old_logp, prev, token_mask)
  sequence_mask, error_masked, counted_rows = _logprob_error_gate(
      options,
      error,
      sequence_mask,
      logprob_error_mask,
      given_normalisers=(
          token_normaliser is not None or sequence_normaliser is not None
      ),
  )
  if counted_sequence_normaliser is None:
    counted_sequence_normaliser = jnp.maximum(jnp.sum(counted_rows), 1.0)
  trained = token_mask * sequence_mask[:, None]
  if token_normaliser is None:
    token_normaliser = jnp.maximum(jnp.sum(trained), 1.0)
  if sequence_normaliser is None:
    sequence_normaliser = jnp.maximum(jnp.sum(sequence_mask), 1.0)
  return _Masks(
      token_mask=token_mask,
      sequence_mask=sequence_mask,
      mask=trained,
      counted_rows=counted_rows,
      error=error,
      error_masked=error_masked,
      token_normaliser=_constant(token_normaliser),
      sequence_normaliser=_constant(sequence_normaliser),
      counted_sequence_normaliser=_constant(counted_sequence_normaliser),
  )


@dataclasses.dataclass(frozen=True)
class _Surrogate:
  """The clipped surrogate's per-token terms.

  Attributes:
    advantages: float [B, 1], no gradient.
    log_ratio, ratio: float [B, T]: the ratio the clip acts on.
    weights: float [B, T]: each token's weight (1, or pi_train /
      pi_generator with the forced ratio), 0 on TIS-masked sequences.
    unclipped, clipped: float [B, T]: -A ratio and -A clip(ratio).
    sampling_ratio: float [B, T]: pi_train / pi_generator (finite).
    geo_mean: float [B]: each sequence's geometric-mean sampling ratio.
    tis_masked: float [B]: 1 where the TIS gate masked the sequence.
  """

  advantages: jax.Array
  log_ratio: jax.Array
  ratio: jax.Array
  weights: jax.Array
  unclipped: jax.Array
  clipped: jax.Array
  sampling_ratio: jax.Array
  geo_mean: jax.Array
  tis_masked: jax.Array

  @property
  def per_token(self) -> jax.Array:
    """max(-A ratio, -A clip(ratio)), before the weights."""
    return jnp.maximum(self.unclipped, self.clipped)

  @property
  def clip_active(self) -> jax.Array:
    """1 where the clipped term is the larger (its gradient, zero, is then
    the one taken)."""
    return (self.clipped > self.unclipped).astype(jnp.float32)


def _surrogate(logp, old_logp, advantages, masks, options) -> _Surrogate:
  """The ratios, their clip and the token weights (module docstring)."""
  prev = jax.lax.stop_gradient(logp)
  adv = jax.lax.stop_gradient(advantages.astype(jnp.float32))[:, None]
  # pi_train / pi_generator per token (the sampling mismatch); a non-finite
  # one is 0, as the reference's nan_to_num makes it.
  sampling_log_ratio = _finite_or_zero(prev - old_logp)
  sampling_ratio = _finite_or_zero(jnp.exp(prev - old_logp))
  if options.force_on_policy_ratio:
    log_ratio = logp - prev
    weights = sampling_ratio
  else:
    log_ratio = logp - old_logp
    weights = jnp.ones_like(logp)
  ratio = jnp.exp(log_ratio)
  clipped_ratio = jnp.clip(ratio, 1.0 - options.epsilon, 1.0 + options.upper)
  # The TIS gate, over each sequence's completion tokens.
  geo_mean = jnp.exp(sequence_mean(sampling_log_ratio, masks.token_mask))
  tis_masked = jnp.zeros((logp.shape[0],), jnp.float32)
  if options.tis:
    inside = (geo_mean >= options.tis_ratio_min) & (
        geo_mean <= options.tis_ratio_max
    )
    tis_masked = 1.0 - inside.astype(jnp.float32)
  return _Surrogate(
      advantages=adv,
      log_ratio=log_ratio,
      ratio=ratio,
      weights=weights * (1.0 - tis_masked)[:, None],
      unclipped=-adv * ratio,
      clipped=-adv * clipped_ratio,
      sampling_ratio=sampling_ratio,
      geo_mean=geo_mean,
      tis_masked=tis_masked,
  )


def _kl(logp, ref_logp, masks: _Masks, options: LossOptions) -> jax.Array:
  """The aggregated KL to the reference; 0 with beta = 0.

  Raises:
    ValueError: beta > 0 and no ref_logp.
  """
  if not options.beta > 0:
    return jnp.zeros((), jnp.float32)
  if ref_logp is None:
    raise ValueError("beta > 0 needs the reference log-probabilities")
  per_token = kl_per_token(
      logp, jax.lax.stop_gradient(ref_logp), options.kl_estimator
  )
  return masks.aggregate(per_token, options)


def _metrics(losses, terms: _Surrogate, masks: _Masks, advantages, entropy):
  """`policy_loss`'s metrics: `losses` (pg_loss, kl, kl_loss), pg_clipfrac
  and its _lower and _upper, ppo_kl, entropy, is_ratio/{mean,max,min},
  sampling_is_ratio/{mean,max,min} (pi_train / pi_generator per token),
  tis_geo_mean/{max,min}, logprob_error/{mean,max} (per sequence),
  masked/{tis_frac,logprob_error_frac}, trained_token_frac,
  advantage/{mean,abs_mean,max,min,nonzero_frac}."""
  active = terms.clip_active
  ratio = jax.lax.stop_gradient(terms.ratio)
  mask = masks.mask
  return {
      **losses,
      "pg_clipfrac": masks.token_mean(active),
      "pg_clipfrac_lower": masks.token_mean(active * (terms.advantages < 0)),
      "pg_clipfrac_upper": masks.token_mean(active * (terms.advantages > 0)),
      "ppo_kl": masks.token_mean(jax.lax.stop_gradient(-terms.log_ratio)),
      "entropy": (
          jnp.zeros((), jnp.float32)
          if entropy is None
          else masks.token_mean(jax.lax.stop_gradient(entropy))
      ),
      "is_ratio": {"mean": masks.token_mean(ratio), **_extremes(ratio, mask)},
      "sampling_is_ratio": {
          "mean": masks.token_mean(terms.sampling_ratio),
          **_extremes(terms.sampling_ratio, mask),
      },
      "tis_geo_mean": _extremes(terms.geo_mean, masks.sequence_mask > 0),
      "logprob_error": {
          "mean": masks.counted_share(masks.error),
          "max": _masked_extreme(
              masks.error, masks.counted_rows > 0, jnp.max, -EMPTY
          ),
      },
      "masked": {
          "tis_frac": masks.sequence_share(terms.tis_masked),
          "logprob_error_frac": masks.counted_share(masks.error_masked),
      },
      # The share of the counted tokens whose weight is not 0.
      "trained_token_frac": masks.token_mean(
          (terms.weights > 0).astype(jnp.float32)
      ),
      "advantage": advantage_metrics(advantages),
  }


def _finite_or_zero(values: jax.Array) -> jax.Array:
  """NaN and +-inf as 0 (the reference's nan_to_num(nan=0, posinf=0,
  neginf=0))."""
  return jnp.where(jnp.isfinite(values), values, 0.0)


def _logprob_error_gate(
    options, error, sequence_mask, logprob_error_mask, given_normalisers
):
  """(the trained sequence mask, the gated sequences, the sequences counted
  before the gate), each float [B] (module docstring).

  Raises:
    ValueError: a threshold, the step's normalisers and no gate mask.
  """
  if options.logprob_error_threshold is None:
    return sequence_mask, jnp.zeros_like(sequence_mask), sequence_mask
  if logprob_error_mask is not None:
    gated = jax.lax.stop_gradient(logprob_error_mask.astype(jnp.float32))
    return sequence_mask, gated, sequence_mask + gated
  if given_normalisers:
    raise ValueError(
        "logprob_error_threshold with the step's normalisers needs the "
        "log-prob-error gate decided before the loss (logprob_error_mask: "
        "logprob_gate), so that its sequences leave the normalisers"
    )
  gated = (error > options.logprob_error_threshold).astype(
      jnp.float32
  ) * sequence_mask
  return sequence_mask * (1.0 - gated), gated, sequence_mask
