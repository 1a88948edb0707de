"""A recurrence over a row whose tokens are split over the context axis.

With context parallelism each device holds two chunks of every row in the
zig-zag layout (`zigzag`): chunks d and 2C - 1 - d of the row's 2C on
device d. Attention gathers the keys it needs; a recurrent layer (the Gated
DeltaNet) needs, for each of its chunks, what came before it in the
original order: the last few inputs of the chunk before (a causal
convolution's halo) and the recurrent state at the chunk's start.

The state at a chunk's start is found without running the chunks one after
another. A linear recurrence's state after a chunk is affine in the state
before it: S_end = T S_start + B, where B is the state the chunk reaches
from zero and T the chunk's transition (the product of its tokens' state
maps). Each device computes T and B for its two chunks in parallel, the
pairs are all-gathered over the context axis (2C matrices per row and
head), and every device composes them in order,
  S_start(0) = 0,  S_start(c + 1) = T_c keep_c S_start(c) + B_c,
2C small matmuls, then runs its chunks from their true start states.
keep_c is 0 where a packed sequence starts exactly at chunk c's first token
(the state is not carried into it) and 1 otherwise.

These functions run inside `shard_map` over the context axis
(`mesh.CONTEXT_AXIS`), on a device's local [B, 2L, ...] share of a row
(its two chunks, L tokens each, in the layout's order).
"""

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.model import zigzag
from maxtext.runtime import mesh as mesh_lib


def pieces(x: jax.Array) -> jax.Array:
  """A device's [B, 2L, ...] share -> [B, 2, L, ...], its two chunks."""
  b, two_l = x.shape[:2]
  return x.reshape((b, 2, two_l // 2) + x.shape[2:])


def my_chunks(context: int) -> jax.Array:
  """int32 [2]: the original chunk numbers of this device's two chunks."""
  d = jax.lax.axis_index(mesh_lib.CONTEXT_AXIS)
  return jnp.stack([d, 2 * context - 1 - d]).astype(jnp.int32)


def _gather_in_order(x: jax.Array, context: int) -> jax.Array:
  """Per-chunk values [B, 2, ...] of every device -> [B, 2C, ...] in the
  original chunk order."""
  whole = jax.lax.all_gather(x, mesh_lib.CONTEXT_AXIS, axis=1, tiled=True)
  return jnp.take(whole, np.argsort(zigzag.chunk_order(context)), axis=1)


def halo(x: jax.Array, width: int, context: int) -> jax.Array:
  """The `width` items before each of this device's chunks.

  Args:
    x: [B, 2, L, ...] the device's chunks (`pieces`), L >= width.
    width: how many items before each chunk (a kernel K's K - 1).
    context: C, the context axis's size.

  Returns:
    [B, 2, width, ...]: for chunk c, the last `width` items of chunk c - 1
    of the original row; zeros before chunk 0.
  """
  tails = _gather_in_order(x[:, :, x.shape[2] - width :], context)
  before = jnp.concatenate([jnp.zeros_like(tails[:, :1]), tails[:, :-1]], 1)
  return jnp.take(before, my_chunks(context), axis=1)


def start_states(
    transition: jax.Array,
    from_zero: jax.Array,
    keep: jax.Array,
    context: int,
) -> jax.Array:
  """The recurrent state at the start of each of this device's chunks.

  Args:
    transition: [B, 2, ..., D, D] each local chunk's T.
    from_zero: [B, 2, ..., D, E] each local chunk's B (its end state from a
      zero start state).
    keep: [B, 2] 1.0 where the chunk continues the state before it, 0.0
      where a sequence starts at its first token.
    context: C.

  Returns:
    [B, 2, ..., D, E] float32, keep x S_start of the device's two chunks:
    the state each starts from.
  """
  f32 = jnp.float32
  transition = _gather_in_order(transition.astype(f32), context)
  from_zero = _gather_in_order(from_zero.astype(f32), context)
  keep = _gather_in_order(keep.astype(f32), context)
  keep = keep.reshape(keep.shape + (1,) * (from_zero.ndim - keep.ndim))

  def chunk(state, xs):
    t, b, k = xs
    state = k * state  # The state chunk c starts from.
    return jnp.einsum("b...de,b...ef->b...df", t, state) + b, state

  xs = tuple(jnp.moveaxis(a, 1, 0) for a in (transition, from_zero, keep))
  _, starts = jax.lax.scan(chunk, jnp.zeros_like(from_zero[:, 0]), xs)
  return jnp.take(jnp.moveaxis(starts, 0, 1), my_chunks(context), axis=1)
