"""The key/value cache of a decoder: what each layer keeps of past tokens.

The cache is a pytree shaped like the parameters: one entry per block stack
(`layers`, and `moe_layers` for a model with experts), each leaf stacked
along a leading layers axis, so the decoder scans the cache with the
parameters. Slot j of a row holds position j of that row's sequence.

A hybrid model's Gated DeltaNet layers (`full_attention_interval`, the
`linear_layers` stack) keep no entry per token: each keeps one
`gated_deltanet.State` per row (its convolution windows and its recurrent
state), stacked as "linear_layers" [L, B, ...] beside the attention
layers' entries (`init_states`). Their bytes do not grow with the length.

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

from maxtext.model import gated_deltanet
from maxtext.model import model_config
from maxtext.model import transformer

Cache = dict[str, dict[str, jax.Array]]


def _stack_sizes(config: model_config.ModelConfig) -> dict[str, int]:
  """Attention layers of each block stack, named as the parameter tree
  names them (a hybrid model's Gated DeltaNet layers are not among them)."""
  if not config.num_experts:
    return {"layers": config.num_layers}
  sizes = {
      "moe_layers": config.num_layers
      - config.num_dense_layers
      - transformer.num_linear_layers(config)
  }
  if config.num_dense_layers:
    sizes["layers"] = config.num_dense_layers
  return sizes


def attention_layers(config: model_config.ModelConfig) -> int:
  """Layers that keep keys and values (all but Gated DeltaNet ones)."""
  return sum(_stack_sizes(config).values())


def entry_shapes(
    config: model_config.ModelConfig,
) -> dict[str, tuple[int, ...]]:
  """The per-token, per-layer shape of each cache entry."""
  if config.attention_type == "mla":
    return {
        "kv_latent": (config.kv_lora_rank,),
        "k_rope": (config.qk_rope_head_dim,),
    }
  kv = (config.num_kv_heads, config.head_dim)
  return {"k": kv, "v": kv}


def init_entries(
    config: model_config.ModelConfig, batch: int, length: int
) -> Cache:
  """The attention layers' zero entries: `batch` rows (or pages) of
  `length` positions."""
  dtype = jnp.dtype(config.compute_dtype)
  return {
      stack: {
          name: jnp.zeros((layers, batch, length) + shape, dtype)
          for name, shape in entry_shapes(config).items()
      }
      for stack, layers in _stack_sizes(config).items()
  }


def init_states(config: model_config.ModelConfig, batch: int) -> Cache:
  """The Gated DeltaNet layers' states before any token, `batch` rows:
  {"linear_layers": State of [L, B, ...] leaves}, or {} without them."""
  count = transformer.num_linear_layers(config)
  if not count:
    return {}
  state = gated_deltanet.init_state(
      config, batch, jnp.dtype(config.compute_dtype)
  )
  return {
      "linear_layers": jax.tree_util.tree_map(
          lambda x: jnp.broadcast_to(x, (count,) + x.shape), state
      )
  }


def init(config: model_config.ModelConfig, batch: int, length: int) -> Cache:
  """A zero cache of `batch` rows and `length` positions (with a hybrid
  model's zero recurrent states)."""
  return {**init_entries(config, batch, length), **init_states(config, batch)}


def bytes_per_token(config: model_config.ModelConfig) -> int:
  """Key/value bytes one token of one row takes, over all layers."""
  per_layer = sum(int(np.prod(s)) for s in entry_shapes(config).values())
  return (
      per_layer
      * attention_layers(config)
      * jnp.dtype(config.compute_dtype).itemsize
  )


def state_bytes_per_row(config: model_config.ModelConfig) -> int:
  """Bytes of one row's Gated DeltaNet states over all layers (0 for a
  model without them): fixed, whatever the sequence's length. Arithmetic
  only (no tracing), so a decoder may ask it on every call."""
  count = transformer.num_linear_layers(config)
  if not count:
    return 0
  return count * gated_deltanet.state_bytes(
      config, jnp.dtype(config.compute_dtype)
  )


def expanded_bytes_per_token(config: model_config.ModelConfig) -> int:
  """What caching MLA's expanded keys and values would take per token: the
  grouped-query cache of the same width (one key/value head per query head,
  keys N + R wide, values Dv wide). For a gqa config, `bytes_per_token`."""
  if config.attention_type != "mla":
    return bytes_per_token(config)
  per_layer = config.num_heads * (
      config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim
  )
  return (
      per_layer
      * attention_layers(config)
      * jnp.dtype(config.compute_dtype).itemsize
  )


def total_bytes(cache: Any) -> int:
  """Bytes the cache's arrays hold."""
  return int(
      sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(cache))
  )
