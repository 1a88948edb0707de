"""Multi-head latent attention (MLA), the attention of DeepSeek-V2 and V3.

Keys and values are not projected per head from the residual stream: one
low-rank latent c_kv = RMSNorm(x W_kv_a) of width `kv_lora_rank` is shared by
all heads, and each head's key part k_nope and its value are projected up from
it (W_kv_b). Position enters through a separate rotary part: the queries have
a per-head rotary part q_rope, the keys one rotary vector k_rope per position,
projected straight from x and shared by every head. Queries come from the
residual stream directly (`q_lora_rank` 0) or through their own normalised
low-rank bottleneck of width `q_lora_rank`.

Per head h (nope = `qk_nope_head_dim`, rope = `qk_rope_head_dim`):
  q_h = [q_nope_h, RoPE(q_rope_h)]           width nope + rope
  k_h = [k_nope_h, RoPE(k_rope)]             width nope + rope
  v_h                                        width `v_head_dim`
  out = sum_h causal_softmax(q_h k_h^T / sqrt(nope + rope)) v_h W_o,h

The attention itself is `maxtext.layers.attend`, so every implementation of
`config.attention` serves MLA (the fused kernels get v zero-padded to the
query/key width). Keys are materialised per head, as the training-time form
of DeepSeek-V3 does; the absorbed form that attends in the latent space is an
inference optimisation and not implemented. A decoder's cache holds only
what `latent_keys` returns and expands it with `expand_keys_values`.

The rotary part takes the model's rotary scaling (`layers.rope_scaling`;
DeepSeek-V3's is YaRN, whose softmax-scale correction `layers.attend`
applies).

Parameter shapes of a stack of L layers (E emb_dim, H num_heads, Q
q_lora_rank, C kv_lora_rank, N qk_nope_head_dim, R qk_rope_head_dim,
D v_head_dim):
  wq_a     [L, E, Q]           (Q > 0)
  q_norm   [L, Q]              (Q > 0)
  wq_b     [L, Q, H, N + R]    (Q > 0)
  wq       [L, E, H, N + R]    (Q = 0, instead of the three above)
  wkv_a    [L, E, C + R]       the last R columns give the shared k_rope
  kv_norm  [L, C]
  wkv_b    [L, C, H, N + D]    the first N columns of a head give k_nope
  wo       [L, H, D, E]
"""

from typing import Callable, Mapping, Optional

import jax
import jax.numpy as jnp

from maxtext.model import layers
from maxtext.model import model_config

# Logical axis names of the MLA parameters (one per dimension).
LOGICAL_AXES = {
    "wq_a": ("layers", "embed", "q_lora"),
    "q_norm": ("layers", "norm"),
    "wq_b": ("layers", "q_lora", "heads", "head_dim"),
    "wq": ("layers", "embed", "heads", "head_dim"),
    "wkv_a": ("layers", "embed", "kv_lora"),
    "kv_norm": ("layers", "norm"),
    "wkv_b": ("layers", "kv_lora", "heads", "head_dim"),
    "wo": ("layers", "heads", "head_dim", "embed"),
}
# The query parameters of each choice of q_lora_rank.
_LOW_RANK_QUERY = ("wq_a", "q_norm", "wq_b")
_FULL_RANK_QUERY = ("wq",)


def qk_head_dim(config: model_config.ModelConfig) -> int:
  """Width of one head's queries and keys: nope + rope."""
  return config.qk_nope_head_dim + config.qk_rope_head_dim


def logical_axes(low_rank_query: bool) -> dict[str, tuple[str, ...]]:
  """Logical axes of one stack's MLA parameters.

  Args:
    low_rank_query: whether the queries have the low-rank bottleneck
      (`q_lora_rank` > 0: wq_a, q_norm, wq_b) or not (wq).
  """
  query = _LOW_RANK_QUERY if low_rank_query else _FULL_RANK_QUERY
  return {
      name: names
      for name, names in LOGICAL_AXES.items()
      if name in query or name not in _LOW_RANK_QUERY + _FULL_RANK_QUERY
  }


def init_params(
    config: model_config.ModelConfig,
    num_layers: int,
    normal: Callable[[tuple[int, ...], int], jax.Array],
    dtype,
) -> dict[str, jax.Array]:
  """The MLA parameters of `num_layers` stacked layers.

  Matrices come from `normal(shape, fan_in)` (draws in the order wq_a, wq_b
  or wq, then wkv_a, wkv_b, wo); the norm scales start at 1.

  Args:
    config: the model's config (`emb_dim`, `num_heads` and the MLA
      fields).
    num_layers: layers in the stack.
    normal: `normal(shape, fan_in)` draws a scaled truncated normal.
    dtype: dtype of the norm scales (the matrices' is `normal`'s).

  Returns:
    name -> array, the shapes in the module docstring.
  """
  l, e, h = num_layers, config.emb_dim, config.num_heads
  q_rank, kv_rank = config.q_lora_rank, config.kv_lora_rank
  rope_dim, v_dim = config.qk_rope_head_dim, config.v_head_dim
  qk = qk_head_dim(config)
  params = {}
  if q_rank:
    params["wq_a"] = normal((l, e, q_rank), e)
    params["q_norm"] = jnp.ones((l, q_rank), dtype)
    params["wq_b"] = normal((l, q_rank, h, qk), q_rank)
  else:
    params["wq"] = normal((l, e, h, qk), e)
  params["wkv_a"] = normal((l, e, kv_rank + rope_dim), e)
  params["kv_norm"] = jnp.ones((l, kv_rank), dtype)
  params["wkv_b"] = normal(
      (l, kv_rank, h, config.qk_nope_head_dim + v_dim), kv_rank
  )
  params["wo"] = normal((l, h, v_dim, e), h * v_dim)
  return params


def queries(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    positions: jax.Array,
) -> jax.Array:
  """Per-head queries [q_nope, RoPE(q_rope)]: [B, S, E] -> [B, S, H, N + R].

  Args:
    x: [B, S, E] normalised input, in the compute dtype.
    layer: one layer's parameters.
    config: the model's config.
    positions: int [B, S] (or [1, S]) positions of x's tokens.
  """
  cdt = x.dtype
  nope = config.qk_nope_head_dim
  if "wq_a" in layer:
    q_latent = jnp.einsum("bse,eq->bsq", x, layer["wq_a"].astype(cdt))
    q_latent = layers.rms_norm(q_latent, layer["q_norm"], config.norm_epsilon)
    q = jnp.einsum("bsq,qhd->bshd", q_latent, layer["wq_b"].astype(cdt))
  else:
    q = jnp.einsum("bse,ehd->bshd", x, layer["wq"].astype(cdt))
  q_rope = layers.rope(
      q[..., nope:], positions, config.rope_theta, layers.rope_scaling(config)
  )
  return jnp.concatenate([q[..., :nope], q_rope], axis=-1)


def latent_keys(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    positions: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """What MLA keeps per position: the normalised latent and the rotary key.

  A decoder's cache holds exactly these (C + R numbers per token and
  layer); `expand_keys_values` turns them into per-head keys and values.

  Args: as `queries`.

  Returns:
    (kv_latent [B, S, C], k_rope [B, S, R]) in x's dtype, k_rope rotated.
  """
  cdt = x.dtype
  kv_rank = config.kv_lora_rank
  kv_a = jnp.einsum("bse,ec->bsc", x, layer["wkv_a"].astype(cdt))
  kv_latent = layers.rms_norm(
      kv_a[..., :kv_rank], layer["kv_norm"], config.norm_epsilon
  )
  k_rope = layers.rope(
      kv_a[:, :, None, kv_rank:],
      positions,
      config.rope_theta,
      layers.rope_scaling(config),
  )[:, :, 0]
  return kv_latent, k_rope


def expand_keys_values(
    kv_latent: jax.Array,
    k_rope: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
) -> tuple[jax.Array, jax.Array]:
  """Per-head keys and values from the latent and the shared rotary key.

  Args:
    kv_latent: [B, T, C] normalised latent.
    k_rope: [B, T, R] rotated key part, shared by the heads.
    layer: one layer's parameters.
    config: the model's config.

  Returns:
    (k [B, T, H, N + R], v [B, T, H, Dv]) in kv_latent's dtype.
  """
  b, t, _ = kv_latent.shape
  h, nope = config.num_heads, config.qk_nope_head_dim
  kv = jnp.einsum(
      "bsc,chd->bshd", kv_latent, layer["wkv_b"].astype(kv_latent.dtype)
  )
  k = jnp.concatenate(
      [
          kv[..., :nope],
          jnp.broadcast_to(
              k_rope[:, :, None, :], (b, t, h, config.qk_rope_head_dim)
          ),
      ],
      axis=-1,
  )
  return k, kv[..., nope:]


def attention(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    implementation: str,
    mesh: Optional[jax.sharding.Mesh] = None,
    positions: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
) -> jax.Array:
  """Causal multi-head latent attention of one layer.

  The intermediates carry the `checkpoint_name` tags of the grouped-query
  attention ("query", "key", "value", "context", "attn_out"), so the remat
  policies keep the same things.

  Args:
    x: [B, S, E] normalised input, in the compute dtype.
    layer: one layer's parameters (the module docstring's, without L).
    config: the model's config (`num_heads`, the MLA fields,
      `rope_theta`, `norm_epsilon`).
    implementation: a resolved attention implementation
      (`maxtext.layers.KERNELS`).
    mesh: the mesh the program is compiled for, or None (`layers.attend`).
    positions: int [B, S] (or [1, S]) positions; None = 0..S-1.
    segment_ids: int [B, S] ids of packed sequences, or None
      (`layers.attend`).

  Returns:
    [B, S, E] in x's dtype.
  """
  cdt = x.dtype
  tag = jax.ad_checkpoint.checkpoint_name
  if positions is None:
    positions = layers.positions_from_zero(x.shape[1])
  q = queries(x, layer, config, positions)
  k, v = expand_keys_values(
      *latent_keys(x, layer, config, positions), layer, config
  )
  q, k, v = tag(q, "query"), tag(k, "key"), tag(v, "value")
  out = layers.attend(
      q,
      k,
      v,
      implementation,
      mesh,
      layers.rope_scaling(config),
      segment_ids,
  )
  return tag(
      jnp.einsum("bshd,hde->bse", out, layer["wo"].astype(cdt)), "attn_out"
  )
