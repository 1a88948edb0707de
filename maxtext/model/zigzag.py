"""The zig-zag layout of a row's tokens over C context-parallel devices.

Under causal attention the token at position t attends to t + 1 keys, so a
row cut into C contiguous pieces gives the last device about 2C - 1 times
the first one's attention work. The zig-zag layout cuts the row into 2C
equal chunks and gives device i the chunks i and 2C - 1 - i: each device
then holds one early and one late chunk, and every device's queries see
the same number of keys, (2C + 1) / (2C) of a row's half on average, so the
devices finish together.

The layout is a permutation of the row's positions: slot j of the laid-out
row (device j // (S / C)) holds the token of original position
`order(S, C)[j]`. The model lays out the tokens, their positions and
segment ids and the loss's targets and weights with `to_zigzag` (a
[B, S, ...] array's axis 1, device-major), so each device's share of the
sequence axis is its two chunks, and lays the hidden states back with
`from_zigzag` where the original order is needed (the logits).
"""

import jax
import jax.numpy as jnp
import numpy as np


def chunk_order(context: int) -> np.ndarray:
  """int [2C]: the original chunk at each chunk slot of the layout:
  0, 2C - 1, 1, 2C - 2, ..., C - 1, C."""
  pairs = [(i, 2 * context - 1 - i) for i in range(context)]
  return np.asarray([chunk for pair in pairs for chunk in pair], np.int32)


def order(seq_len: int, context: int) -> np.ndarray:
  """int32 [S]: the original position of the token at each slot.

  Raises:
    ValueError: 2C does not divide S.
  """
  if seq_len % (2 * context):
    raise ValueError(
        f"sequence length {seq_len} is not divisible by 2 x "
        f"context_parallelism={context}"
    )
  chunk = seq_len // (2 * context)
  return (
      (chunk_order(context)[:, None] * chunk + np.arange(chunk)[None, :])
      .reshape(-1)
      .astype(np.int32)
  )


def _chunks(x: jax.Array, context: int, slots: np.ndarray) -> jax.Array:
  """x's axis 1 cut into 2C chunks, taken in `slots` order."""
  b, s = x.shape[:2]
  chunked = x.reshape((b, 2 * context, s // (2 * context)) + x.shape[2:])
  return jnp.take(chunked, slots, axis=1).reshape(x.shape)


def to_zigzag(x: jax.Array, context: int) -> jax.Array:
  """[B, S, ...] in the original order -> the zig-zag layout (axis 1)."""
  if context == 1:
    return x
  order(x.shape[1], context)  # Checks the length.
  return _chunks(x, context, chunk_order(context))


def from_zigzag(x: jax.Array, context: int) -> jax.Array:
  """[B, S, ...] in the zig-zag layout -> the original order (axis 1)."""
  if context == 1:
    return x
  order(x.shape[1], context)
  return _chunks(x, context, np.argsort(chunk_order(context)))
