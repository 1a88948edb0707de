"""Next-token cross entropy over a large vocabulary, a chunk of positions
at a time.

The output projection of a language model is its largest single product: for
Qwen3-0.6B, [B, S, 1,024] x [1,024, 151,936] at every step. Differentiated by
`jax.grad`, a chunked loss costs four such products a chunk: the logits
forward, the same logits again in the backward pass (a chunk's float32
[B, chunk, V] logits are too large to keep for every chunk, so they are
rematerialised), and the two gradient products (of the hidden states and of
the output projection). Only the last two depend on the loss's cotangent, and
only through one scalar: the loss is a weighted sum over positions, so its
gradient is that sum's gradient times the cotangent.

`token_sums` therefore computes each chunk's gradients in the forward pass,
while the chunk's logits exist, and keeps them (the hidden states' gradient,
[B, S, E], and the projection's, [E, V], both float32) for the backward pass,
which only scales them by the cotangent: three products a chunk, not four, and
no [B, chunk, V] buffer in the backward pass. Without differentiation (an
evaluation) it computes the sums alone.

The gradient products take bfloat16 (the hidden states' dtype) operands with
float32 accumulation, as the projection forward does; the weighted softmax
gradient is rounded to that dtype before them. The values (loss sum, hits)
are computed exactly as `token_sums_of_logits` computes them.

The logits are written in `logits_dtype`: float32 (the reference), or
bfloat16, MaxText's and Megatron-LM's numerics (the product accumulates in
float32 and rounds its output), which halves the loss's traffic over the
vocabulary: the product writes the logits once and the log-sum-exp and the
two gradient products each read them, about 20 GB a step in float32 for
Qwen3-0.6B at 4 x 2,048 positions. The largest and the target's logit are
read in the logits' own dtype (exact there); every sum over them (the
log-sum-exp, the softmax gradient's products) is in float32.

The projection comes in either orientation: [E, V] (an untied output
projection), or [V, E] with `vocab_major` (a tied embedding as it is
stored), whose gradient is then [V, E] too. Each product names its
operands' axes, so neither orientation is transposed: on a TPU, handing the
loss a tied embedding's transpose cost two layout copies of the whole
matrix a step (the bfloat16 projection and its float32 gradient).
"""

import functools

import jax
import jax.numpy as jnp

# The three products' einsum specs by orientation (`vocab_major`): the
# logits, the hidden states' gradient, the projection's gradient.
_SPECS = {
    False: ("bse,ev->bsv", "bsv,ev->bse", "bse,bsv->ev"),
    True: ("bse,ve->bsv", "bsv,ve->bse", "bse,bsv->ve"),
}


def unembed(
    x: jax.Array,
    unembedding: jax.Array,
    vocab_major: bool = False,
    logits_dtype: str = "float32",
) -> jax.Array:
  """[B, S, E] hidden states -> [B, S, V] logits in `logits_dtype` (the
  product accumulated in float32), the projection [E, V] (or [V, E] with
  `vocab_major`)."""
  return jnp.einsum(
      _SPECS[vocab_major][0],
      x,
      unembedding.astype(x.dtype),
      preferred_element_type=jnp.dtype(logits_dtype),
  )


def _per_position(
    logits: jax.Array, targets: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per position of [..., V] logits (reduced in float32): the log of the
  softmax's denominator (log-sum-exp), the cross entropy, and whether the
  target's logit is the largest (a tie counts as a hit).

  Written as passes over the logits that the compiler fuses: the largest logit
  (shared by the log-sum-exp and the hit), the sum of exponentials, and the
  target's logit, a gather; no [..., V] log-probabilities are written out.
  """
  # The largest and the target's logit are exact in the logits' own dtype:
  # taken before the cast, no float32 copy of bfloat16 logits is written.
  top = jax.lax.stop_gradient(jnp.max(logits, axis=-1)).astype(jnp.float32)
  shifted = logits.astype(jnp.float32) - top[..., None]
  lse = top + jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
  picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  picked = picked.astype(jnp.float32)
  return lse, lse - picked, (picked >= top).astype(jnp.float32)


def token_sums_of_logits(
    logits: jax.Array, targets: jax.Array, weights: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Weighted sums of cross entropy and of hits (the target's logit is the
  largest) over [B, S] positions."""
  _, nll, correct = _per_position(logits, targets)
  return jnp.sum(nll * weights), jnp.sum(correct * weights)


def position_chunks(a: jax.Array, chunk: int) -> jax.Array:
  """[B, S, ...] -> [n, B, chunk, ...], S zero-padded to n x chunk."""
  b, s = a.shape[:2]
  n = -(-s // chunk)
  a = jnp.pad(a, [(0, 0), (0, n * chunk - s)] + [(0, 0)] * (a.ndim - 2))
  return jnp.swapaxes(a.reshape(b, n, chunk, *a.shape[2:]), 0, 1)


def _unchunk(a: jax.Array, length: int) -> jax.Array:
  """`position_chunks`' inverse: [n, B, chunk, ...] -> [B, length, ...]."""
  a = jnp.swapaxes(a, 0, 1)
  return a.reshape(a.shape[0], -1, *a.shape[3:])[:, :length]


def _chunk_sums_and_grads(
    x_c, unembedding, targets_c, weights_c, vocab_major: bool, logits_dtype
):
  """One chunk's sums and the gradients of its loss sum.

  Returns:
    (loss_sum, num_correct, dx_c float32 [B, c, E], dunembedding float32
    in `unembedding`'s shape).
  """
  _, dx_spec, du_spec = _SPECS[vocab_major]
  logits = unembed(x_c, unembedding, vocab_major, logits_dtype)
  lse, nll, correct = _per_position(logits, targets_c)
  logits = logits.astype(jnp.float32)
  # d(sum_t w_t * nll_t) / d logits_t = w_t * (softmax_t - onehot(target_t)).
  hot = jax.nn.one_hot(targets_c, logits.shape[-1], dtype=jnp.float32)
  dlogits = (jnp.exp(logits - lse[..., None]) - hot) * weights_c[..., None]
  dlogits = dlogits.astype(x_c.dtype)
  dx_c = jnp.einsum(
      dx_spec,
      dlogits,
      unembedding.astype(x_c.dtype),
      preferred_element_type=jnp.float32,
  )
  dunembedding = jnp.einsum(
      du_spec, x_c, dlogits, preferred_element_type=jnp.float32
  )
  return (
      jnp.sum(nll * weights_c),
      jnp.sum(correct * weights_c),
      dx_c,
      dunembedding,
  )


def _scan_chunks(
    x,
    unembedding,
    targets,
    weights,
    chunk: int,
    vocab_major: bool,
    logits_dtype: str,
    with_grads: bool,
):
  """The sums over every chunk, and with `with_grads` their gradients."""
  zero = jnp.zeros((), jnp.float32)
  chunk = min(chunk, x.shape[1])

  def sums_only(totals, inputs):
    loss_sum, num_correct = token_sums_of_logits(
        unembed(inputs[0], unembedding, vocab_major, logits_dtype),
        *inputs[1:],
    )
    return (totals[0] + loss_sum, totals[1] + num_correct), None

  def sums_and_grads(carry, inputs):
    loss_sum, num_correct, dx_c, du = _chunk_sums_and_grads(
        inputs[0], unembedding, *inputs[1:], vocab_major, logits_dtype
    )
    return (carry[0] + loss_sum, carry[1] + num_correct, carry[2] + du), dx_c

  chunks = tuple(position_chunks(a, chunk) for a in (x, targets, weights))
  if not with_grads:
    totals, _ = jax.lax.scan(sums_only, (zero, zero), chunks)
    return totals
  du = jnp.zeros(unembedding.shape, jnp.float32)
  (loss_sum, num_correct, du), dx = jax.lax.scan(
      sums_and_grads, (zero, zero, du), chunks
  )
  return (loss_sum, num_correct), (_unchunk(dx, x.shape[1]), du)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def token_sums(
    x: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    chunk: int,
    vocab_major: bool = False,
    logits_dtype: str = "float32",
) -> tuple[jax.Array, jax.Array]:
  """`token_sums_of_logits(unembed(x, unembedding, vocab_major,
  logits_dtype), ...)`,
  `chunk` positions at a time, differentiable in `x` and `unembedding`
  (the loss sum; the hits have no gradient, and neither have `targets` and
  `weights`).

  Only one chunk's logits [B, chunk, V] exist at once; the sequence is
  padded to a multiple of `chunk` with weight-0 positions.

  Args:
    x: [B, S, E] final hidden states.
    unembedding: [E, V], or [V, E] with `vocab_major`.
    targets: int32 [B, S].
    weights: float32 [B, S].
    chunk: positions per chunk, >= 1 (above S: one chunk).
    vocab_major: `unembedding` is [V, E] (a tied embedding).
    logits_dtype: "float32" or "bfloat16", the logits' dtype.

  Returns:
    (loss_sum, num_correct), float32 scalars.
  """
  return _scan_chunks(
      x, unembedding, targets, weights, chunk, vocab_major, logits_dtype, False
  )


def _token_sums_fwd(
    x, unembedding, targets, weights, chunk, vocab_major, logits_dtype
):
  sums, grads = _scan_chunks(
      x, unembedding, targets, weights, chunk, vocab_major, logits_dtype, True
  )
  # The dtypes ride along as zero-size arrays: residuals must be arrays.
  dtypes = (jnp.zeros((0,), x.dtype), jnp.zeros((0,), unembedding.dtype))
  return sums, (grads, dtypes)


def _token_sums_bwd(chunk, vocab_major, logits_dtype, residuals, cotangents):
  del chunk, vocab_major, logits_dtype
  (dx, du), (x_dtype, u_dtype) = residuals
  scale = cotangents[0]  # the loss sum's; the hits have none.
  return (
      (dx * scale).astype(x_dtype.dtype),
      (du * scale).astype(u_dtype.dtype),
      None,
      None,
  )


token_sums.defvjp(_token_sums_fwd, _token_sums_bwd)
