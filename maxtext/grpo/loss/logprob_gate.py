"""The log-prob-error gate, decided over a whole step before its loss.

MLPerf qwen35_397b_grpo's reference (NeMo-RL's GRPO with
`seq_logprob_error_threshold`) computes the trained policy's
log-probabilities of a rollout in a pass before training (`prev`) and
removes from its sample mask each sequence whose error, the mean over its
tokens of exp(|generator's - prev|) (`policy_loss.sequence_logprob_error`),
exceeds the threshold: the sequence trains nothing and leaves the step's
token and sequence counts, which normalise the loss. Those counts are the
whole step's, so with K micro-batches the gate must be known before the
first of them. `Gate` runs the policy's forward pass over each micro-batch
(one program, called K times: the memory of one micro-batch's forward
pass), then one program rewrites the K micro-batches:

* "sequence_mask": 0 also for the gated sequences;
* "token_normaliser", "sequence_normaliser": the step's trained tokens and
  sequences / K;
* "logprob_error_mask": 1 for a gated sequence;
* "counted_sequence_normaliser": the step's sequences counted before the
  gate / K (the denominator of the loss's `masked/logprob_error_frac` and
  `logprob_error/mean`).

The pass must read the parameters the update starts from, so the
micro-batches are gated on first use (`LazilyGated`): a rollout drawn one
step ahead (grpo_max_age 1) is drawn before the update before it, and
gated when its own update starts. It costs one forward pass over each
rollout, as the reference's pass does; with no threshold nothing runs.
"""

import collections.abc
import functools
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp

from maxtext.generation import decoder
from maxtext.grpo.loss import policy_loss
from maxtext.grpo.loss import train_loss
from maxtext.model import model_config

# The fields the gate adds to every micro-batch (float32 [B] each).
ADDED = ("logprob_error_mask", "counted_sequence_normaliser")


def _gated_sequences(
    params,
    micro_batch,
    temperature,
    threshold,
    config: model_config.ModelConfig,
    mesh,
):
  """float32 [B]: 1 where a counted sequence's error exceeds the threshold."""
  log_probs = train_loss.completion_log_probs_and_entropy(
      params, micro_batch, config, temperature, mesh
  )[0]
  error = policy_loss.sequence_logprob_error(
      micro_batch["old_log_probs"].astype(jnp.float32),
      log_probs,
      micro_batch["mask"],
  )
  counted = micro_batch["sequence_mask"].astype(jnp.float32)
  return (error > threshold).astype(jnp.float32) * counted


def _rewritten(batches, gated):
  """The K micro-batches with the gate applied (module docstring)."""
  k = len(batches)
  kept = [b["sequence_mask"] * (1.0 - g) for b, g in zip(batches, gated)]
  tokens = sum(jnp.sum(b["mask"] * m[:, None]) for b, m in zip(batches, kept))
  sequences = sum(jnp.sum(m) for m in kept)
  counted = sum(jnp.sum(b["sequence_mask"]) for b in batches)

  def per_row(like, total):
    return jnp.full_like(like, jnp.maximum(total, 1.0) / k)

  return [
      dict(
          b,
          sequence_mask=m,
          token_normaliser=per_row(b["token_normaliser"], tokens),
          sequence_normaliser=per_row(b["sequence_normaliser"], sequences),
          logprob_error_mask=g,
          counted_sequence_normaliser=per_row(
              b["sequence_normaliser"], counted
          ),
      )
      for b, m, g in zip(batches, kept, gated)
  ]


class Gate:
  """Gates a step's K micro-batches with given parameters.

  Args:
    threshold: the error above which a sequence is masked (> 1).
    model: the model's config.
    mesh: the engine's mesh (the micro-batches are split by rows over it),
      or None for one device.
  """

  def __init__(
      self,
      threshold: float,
      model: model_config.ModelConfig,
      mesh: Optional[jax.sharding.Mesh] = None,
  ):
    self._mesh = mesh
    self._gated = jax.jit(
        functools.partial(
            _gated_sequences,
            threshold=threshold,
            config=model,
            mesh=mesh,
        )
    )
    self._rewrites = {}  # Field names and ranks -> the rewriting program.

  def __call__(
      self, params: Any, batches: Sequence[dict], temperature: float
  ) -> list[dict]:
    """The micro-batches gated with `params` at the rollout's temperature
    (left on the devices)."""
    gated = [self._gated(params, b, jnp.float32(temperature)) for b in batches]
    return self._rewrite(batches)(list(batches), gated)

  def _rewrite(self, batches):
    """The rewriting program for micro-batches of these fields (one compile
    per field set; on a mesh, every output split by rows)."""
    ranks = {name: x.ndim for name, x in batches[0].items()}
    ranks.update({name: 1 for name in ADDED})
    key = tuple(sorted(ranks.items()))
    if key not in self._rewrites:
      out = None
      if self._mesh is not None:
        out = [
            {n: decoder.batch_sharding(self._mesh, r) for n, r in ranks.items()}
        ] * len(batches)
      self._rewrites[key] = jax.jit(_rewritten, out_shardings=out)
    return self._rewrites[key]


class LazilyGated(collections.abc.Sequence):
  """A step's micro-batches, gated on first use (module docstring).

  Args:
    batches: the K micro-batches, not gated.
    gate: batches -> the gated batches, called once, at the first item
      read (iterating reads them).
  """

  def __init__(
      self, batches: Sequence[dict], gate: Callable[[Sequence[dict]], list]
  ):
    self._batches = list(batches)
    self._gate = gate
    self._gated: Optional[list[dict]] = None

  def __len__(self) -> int:
    return len(self._batches)

  def __getitem__(self, index):
    if self._gated is None:
      self._gated = self._gate(self._batches)
    return self._gated[index]
