"""The key/value cache of a decoder: what each layer keeps of past tokens.

The cache is a pytree shaped like the parameters: one entry per block stack
(`layers`, and `moe_layers` for a model with experts), each leaf stacked
along a leading layers axis, so the decoder scans the cache with the
parameters. Slot j of a row holds position j of that row's sequence.

What a layer keeps depends on `config.attention_type`:
  gqa: "k" [L, B, T, K, D] and "v" [L, B, T, K, D], keys already rotated.
  mla: "kv_latent" [L, B, T, C] (the normalised latent) and "k_rope"
       [L, B, T, R] (the rotated key part every head shares): C + R numbers
       per token and layer instead of H * (N + R + Dv) for the expanded
       keys and values; `maxtext.mla.expand_keys_values` rebuilds those at
       attention time.
(L layers of the stack, B rows, T cache length, K kv heads, D head_dim, C
kv_lora_rank, R qk_rope_head_dim, H heads, N qk_nope_head_dim, Dv
v_head_dim.) Entries are in the compute dtype.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Cache = dict[str, dict[str, jax.Array]]


def _stack_sizes(config) -> dict[str, int]:
  """Layers of each block stack, named as the parameter tree names them."""
  if not config.num_experts:
    return {"layers": config.num_layers}
  sizes = {"moe_layers": config.num_layers - config.num_dense_layers}
  if config.num_dense_layers:
    sizes["layers"] = config.num_dense_layers
  return sizes


def entry_shapes(config) -> dict[str, tuple[int, ...]]:
  """The per-token, per-layer shape of each cache entry."""
  if config.attention_type == "mla":
    return {
        "kv_latent": (config.kv_lora_rank,),
        "k_rope": (config.qk_rope_head_dim,),
    }
  kv = (config.num_kv_heads, config.head_dim)
  return {"k": kv, "v": kv}


def init(config, batch: int, length: int) -> Cache:
  """A zero cache of `batch` rows and `length` positions.

  Raises:
    ValueError: a model with Gated DeltaNet layers, whose recurrent state
      the cache does not hold.
  """
  if config.full_attention_interval:
    raise ValueError(
        f"config.full_attention_interval={config.full_attention_interval}: "
        "the cached decoder does not carry the Gated DeltaNet state yet"
    )
  dtype = jnp.dtype(config.compute_dtype)
  return {
      stack: {
          name: jnp.zeros((layers, batch, length) + shape, dtype)
          for name, shape in entry_shapes(config).items()
      }
      for stack, layers in _stack_sizes(config).items()
  }


def bytes_per_token(config) -> int:
  """Cache bytes one token of one row takes, over all layers."""
  per_layer = sum(int(np.prod(s)) for s in entry_shapes(config).values())
  return (
      per_layer * config.num_layers * jnp.dtype(config.compute_dtype).itemsize
  )


def expanded_bytes_per_token(config) -> int:
  """What caching MLA's expanded keys and values would take per token: the
  grouped-query cache of the same width (one key/value head per query head,
  keys N + R wide, values Dv wide). For a gqa config, `bytes_per_token`."""
  if config.attention_type != "mla":
    return bytes_per_token(config)
  per_layer = config.num_heads * (
      config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim
  )
  return (
      per_layer * config.num_layers * jnp.dtype(config.compute_dtype).itemsize
  )


def total_bytes(cache: Any) -> int:
  """Bytes the cache's arrays hold."""
  return int(
      sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(cache))
  )
