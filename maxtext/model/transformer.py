"""Decoder-only transformer in plain JAX: parameters, forward pass, loss.

The model is a stack of pre-norm blocks: RMSNorm, causal self-attention with
rotary position embeddings, RMSNorm, SwiGLU MLP. The attention is
`config.attention_type`: "gqa" (grouped key/value heads, below) or "mla"
(DeepSeek-V2/V3 multi-head latent attention, `maxtext.mla`). Parameters are
a nested dict of arrays (a pytree); the blocks' parameters are stacked along
a leading `layers` axis and applied with `jax.lax.scan`, so the compile time
does not grow with the depth.

Parameters are stored in `config.weight_dtype` and cast to
`config.compute_dtype` where they are used; normalisation statistics, softmax,
logits and the loss are computed in float32.

Four config fields trade speed and memory without changing the parameters
or (beyond float32 rounding) the results: `attention` (einsum reference,
XLA or cuDNN `dot_product_attention`, Pallas splash; `maxtext.layers`),
`remat_policy` (what the scanned block keeps for the backward pass),
`mlp_chunks` (the dense MLP's hidden activations a group of positions at a
time) and `loss_chunk_size` (the cross entropy a sequence chunk at a time,
so the float32 logits never exist whole).

Parameter shapes (L layers, E emb_dim, H heads, K kv heads, D head_dim,
M mlp_dim, V vocab_size):
  embedding          [V, E]
  layers/attn_norm   [L, E]
  layers/wq          [L, E, H, D]     (gqa)
  layers/wk, wv      [L, E, K, D]     (gqa)
  layers/wo          [L, H, D, E]     (gqa)
  layers/q_norm, k_norm [L, D]        (gqa with qk_norm)
  layers/mlp_norm    [L, E]
  layers/w_gate, w_up [L, E, M]
  layers/w_down      [L, M, E]
  final_norm         [E]
  unembedding        [E, V]

With attention_type "mla" the gqa rows are replaced by (Q q_lora_rank,
C kv_lora_rank, N qk_nope_head_dim, R qk_rope_head_dim, Dv v_head_dim;
`maxtext.mla` says what each is):
  layers/wq_a        [L, E, Q]          (Q > 0)
  layers/q_norm      [L, Q]             (Q > 0)
  layers/wq_b        [L, Q, H, N + R]   (Q > 0)
  layers/wq          [L, E, H, N + R]   (Q = 0)
  layers/wkv_a       [L, E, C + R]
  layers/kv_norm     [L, C]
  layers/wkv_b       [L, C, H, N + Dv]
  layers/wo          [L, H, Dv, E]

With `num_experts` > 0 the feed-forward layers after the first
`num_dense_layers` are mixture-of-experts layers (`maxtext.moe`). Dense and
MoE blocks have different parameters, so they are two stacks scanned one
after the other: `layers` (the num_dense_layers dense blocks; absent when
that is 0) and `moe_layers` (the rest: the attention parameters above plus
the MoE layer's, with a leading axis of num_layers - num_dense_layers). A
dense model (num_experts 0) has exactly the tree above.

Qwen3.5's hybrid layer pattern (`full_attention_interval` n > 0): of every
n consecutive layers the first n - 1 are Gated DeltaNet linear-attention
layers (`maxtext.model.gated_deltanet`) and the last one is full
attention; every layer has the MoE feed-forward layer. The two kinds are
two stacks: `moe_layers` (the num_layers / n attention layers: the
attention parameters above plus the MoE layer's) and `linear_layers` (the
num_layers (n - 1) / n DeltaNet layers: attn_norm, mlp_norm, the DeltaNet
parameters and the MoE layer's), in layer order within each. The forward
pass scans over the num_layers / n groups; a group scans its n - 1
DeltaNet layers (the stack viewed as [num_layers / n, n - 1, ...]) and
then runs its attention layer, so the layers run in their order and the
compile time does not grow with the depth.

Further Qwen3.5 choices, each a config field: `norm_zero_centered` (norm
scales w stored zero-centred, applied as 1 + w: layer, final and q/k norms,
never the DeltaNet output norm), `attention_output_gate` (a sigmoid gate
per head and channel on the attention output, parameter
wq_gate [L, E, H, D]), `partial_rotary_factor` (the rotary embedding on
the first fraction of each head's dimensions) and the MoE layer's gated
shared expert (`maxtext.moe`).
"""

import functools
import math
from typing import Any, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import choices
from maxtext.core import eval_metrics
from maxtext.model import param_statistics
from maxtext.metrics import buffer as metrics_buffer
from maxtext.model import gated_deltanet
from maxtext.model import layers
from maxtext.model import mla
from maxtext.model import model_config
from maxtext.model import moe
from maxtext.model import vocab_loss
from maxtext.model import zigzag
from maxtext.runtime import axis_rules
from maxtext.runtime import mesh as mesh_lib

Params = dict[str, Any]

# Intermediates the block tags with `checkpoint_name` (the context by
# `layers.attend`: with the splash kernel, the kernel's output and
# log-sum-exp); "save_named" keeps exactly these and recomputes the rest
# (norms, scores, the MLP hidden layer).
SAVED_NAMES = (
    "query",
    "key",
    "value",
    layers.CONTEXT_NAME,
    "attn_out",
    "mlp_out",
)

# Logical axis names of every parameter, one name per dimension. The mesh code
# maps them to mesh axes (`maxtext.runtime.axis_rules`).
# A stack's attention axes are `_GQA_AXES` or `mla.LOGICAL_AXES`.
_NORM_AXES = {
    "attn_norm": ("layers", "norm"),
    "mlp_norm": ("layers", "norm"),
}
_GQA_AXES = {
    "wq": ("layers", "embed", "heads", "head_dim"),
    "wk": ("layers", "embed", "kv_heads", "head_dim"),
    "wv": ("layers", "embed", "kv_heads", "head_dim"),
    "wo": ("layers", "heads", "head_dim", "embed"),
}
# gqa with `qk_norm`: a scale per head dimension, shared by the heads.
_QK_NORM_AXES = {
    "q_norm": ("layers", "head_dim"),
    "k_norm": ("layers", "head_dim"),
}
# gqa with `attention_output_gate`.
_GATE_AXES = {"wq_gate": ("layers", "embed", "heads", "head_dim")}
_MLP_AXES = {
    "w_gate": ("layers", "embed", "mlp"),
    "w_up": ("layers", "embed", "mlp"),
    "w_down": ("layers", "mlp", "embed"),
}
_OUTER_AXES = {
    "embedding": ("vocab", "embed"),
    "final_norm": ("norm",),
    "unembedding": ("embed", "vocab"),
}
# The experts' dimension: sharded over the mesh's expert axis, never by FSDP
# (`axis_rules.PARAMETERS`).
EXPERT_LOGICAL_AXIS = "experts"


def _dtype(name: str) -> jnp.dtype:
  return jnp.dtype(name)


def _truncated_normal_init(rng: jax.Array, count: int, dtype):
  """`normal(shape, fan_in)`: the next of `count` keys split from `rng`,
  truncated at 2 standard deviations of 1 / sqrt(fan_in), in `dtype`."""
  keys = iter(jax.random.split(rng, count))

  def normal(shape, fan_in):
    std = 1.0 / math.sqrt(fan_in)
    x = jax.random.truncated_normal(next(keys), -2.0, 2.0, shape, jnp.float32)
    return (x * std).astype(dtype)

  return normal


def init_params(config: model_config.ModelConfig, rng: jax.Array) -> Params:
  """Initialises the parameters.

  Matrices are drawn from a truncated normal with standard deviation
  1/sqrt(fan_in); norm scales start at 1. The output projection's
  1/sqrt(emb_dim) gives logits of standard deviation about 1 (the final
  norm's output has norm sqrt(emb_dim)), so the first loss on random
  tokens is about ln(vocab_size). An untied embedding is only looked up
  and is drawn with standard deviation 1; a tied one is also the output
  projection and is drawn as that (`_embedding_fan_in`). Every array is
  drawn whole (no Python loop over layers or experts), so
  `jax.eval_shape` of this is cheap at any size.

  Args:
    config: the model's config.
    rng: a JAX PRNG key.

  Returns:
    The parameter pytree, every leaf in `config.weight_dtype`.

  Raises:
    ValueError: unknown `config.attention_type`.
  """
  # A caller holding a run's config may pass it: `of` makes it the model's
  # config and checks it (model_config.check).
  config = model_config.of(config)
  if config.num_experts:
    return _init_moe_params(config, rng)
  v, e, l, m = (
      config.vocab_size,
      config.emb_dim,
      config.num_layers,
      config.mlp_dim,
  )
  dtype = _dtype(config.weight_dtype)
  # 9 keys for grouped-query attention: the draws (and so the values) of a
  # dense gqa model are those of the code before MLA, so its checkpoints and
  # seeds keep their meaning.
  count = 9 if config.attention_type == "gqa" else 16
  normal = _truncated_normal_init(rng, count, dtype)
  embedding = normal((v, e), _embedding_fan_in(config))
  stack = _attention_params(config, l, normal, dtype)
  stack["w_gate"] = normal((l, e, m), e)
  stack["w_up"] = normal((l, e, m), e)
  stack["w_down"] = normal((l, m, e), m)
  params = {
      "embedding": embedding,
      "layers": stack,
      "final_norm": jnp.ones((e,), dtype),
      "unembedding": normal((e, v), e),
  }
  return _untie(params, config)


def _embedding_fan_in(config: model_config.ModelConfig) -> int:
  """The fan-in the embedding's initial standard deviation is 1/sqrt of.

  Tied, the embedding is also the [E, V] output projection: emb_dim, so
  that, as an untied unembedding, it gives logits of standard deviation
  about 1 (the transposed embedding of standard deviation 1 would give
  sqrt(emb_dim), a first loss many times ln(vocab_size)). Untied: 1.
  """
  return config.emb_dim if config.tie_word_embeddings else 1


def abstract_params(
    config: model_config.ModelConfig,
    sharding: Optional[jax.sharding.Sharding] = None,
) -> Params:
  """The parameters' shapes and dtypes (`init_params` traced, nothing
  allocated), each placed on `sharding` when one is given: what a
  checkpoint restore takes."""
  shapes = jax.eval_shape(
      lambda key: init_params(config, key), jax.random.PRNGKey(0)
  )
  if sharding is None:
    return shapes
  return jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
      shapes,
  )


def _untie(params: Params, config: model_config.ModelConfig) -> Params:
  """`params` without "unembedding" when `config.tie_word_embeddings`."""
  if config.tie_word_embeddings:
    del params["unembedding"]
  return params


def output_projection(params: Params) -> jax.Array:
  """The [E, V] output projection: "unembedding", or the embedding
  transposed when the model ties them (no "unembedding" parameter)."""
  projection, vocab_major = stored_output_projection(params)
  return projection.T if vocab_major else projection


def stored_output_projection(params: Params) -> tuple[jax.Array, bool]:
  """The output projection as it is stored, and whether it is vocabulary-
  major: ("unembedding" [E, V], False), or ("embedding" [V, E], True) when
  the model ties them. Products that name their axes
  (`vocab_loss.token_sums`) take it without `output_projection`'s
  transpose, which a TPU program makes as a copy of the whole matrix."""
  if "unembedding" in params:
    return params["unembedding"], False
  return params["embedding"], True


def num_linear_layers(config: model_config.ModelConfig) -> int:
  """Gated DeltaNet layers of the model (0 without a layer pattern)."""
  n = config.full_attention_interval
  return config.num_layers - config.num_layers // n if n else 0


def norm(
    x: jax.Array, scale: jax.Array, config: model_config.ModelConfig
) -> jax.Array:
  """RMSNorm of x with a layer, final or q/k norm's `scale`: applied as
  1 + scale (in float32) with `norm_zero_centered`, else as it is."""
  if config.norm_zero_centered:
    scale = 1.0 + scale.astype(jnp.float32)
  return layers.rms_norm(x, scale, config.norm_epsilon)


def _norm_init(shape, config: model_config.ModelConfig, dtype) -> jax.Array:
  """Norm scales that start as the identity: zeros when zero-centred."""
  if config.norm_zero_centered:
    return jnp.zeros(shape, dtype)
  return jnp.ones(shape, dtype)


def _attention_params(
    config: model_config.ModelConfig, l: int, normal, dtype
) -> Params:
  """A stack's norm scales and attention parameters (of `attention_type`)."""
  e, h = config.emb_dim, config.num_heads
  params = {
      "attn_norm": _norm_init((l, e), config, dtype),
      "mlp_norm": _norm_init((l, e), config, dtype),
  }
  if config.attention_type == "mla":
    params.update(mla.init_params(config, l, normal, dtype))
    return params
  k, d = config.num_kv_heads, config.head_dim
  params["wq"] = normal((l, e, h, d), e)
  params["wk"] = normal((l, e, k, d), e)
  params["wv"] = normal((l, e, k, d), e)
  params["wo"] = normal((l, h, d, e), h * d)
  if config.qk_norm:
    params["q_norm"] = _norm_init((l, d), config, dtype)
    params["k_norm"] = _norm_init((l, d), config, dtype)
  if config.attention_output_gate:
    params["wq_gate"] = normal((l, e, h, d), e)
  return params


def _init_moe_params(
    config: model_config.ModelConfig, rng: jax.Array
) -> Params:
  """`init_params` of a model with experts: a dense and an MoE stack."""
  v, e, m = config.vocab_size, config.emb_dim, config.mlp_dim
  dtype = _dtype(config.weight_dtype)
  # 32 keys, so the models before the layer pattern keep their draws; a
  # hybrid model draws more arrays (two stacks, DeltaNet's ten).
  normal = _truncated_normal_init(
      rng, 48 if config.full_attention_interval else 32, dtype
  )
  params = {"embedding": normal((v, e), _embedding_fan_in(config))}
  dense = config.num_dense_layers
  if dense:
    params["layers"] = {
        **_attention_params(config, dense, normal, dtype),
        "w_gate": normal((dense, e, m), e),
        "w_up": normal((dense, e, m), e),
        "w_down": normal((dense, m, e), m),
    }
  linear = num_linear_layers(config)
  if linear:
    params["linear_layers"] = {
        "attn_norm": _norm_init((linear, e), config, dtype),
        "mlp_norm": _norm_init((linear, e), config, dtype),
        **gated_deltanet.init_params(config, linear, normal, dtype),
        **moe.init_params(config, linear, normal),
    }
  sparse = config.num_layers - dense - linear
  params["moe_layers"] = {
      **_attention_params(config, sparse, normal, dtype),
      **moe.init_params(config, sparse, normal),
  }
  params["final_norm"] = _norm_init((e,), config, dtype)
  params["unembedding"] = normal((e, v), e)
  return _untie(params, config)


def _cuda_capability() -> float:
  """Compute capability of the first GPU, 0 when it is not an NVIDIA GPU."""
  try:
    return float(getattr(jax.devices()[0], "compute_capability", "0"))
  except ValueError:  # e.g. "gfx90a" on ROCm.
    return 0.0


def attention_implementation(
    config: model_config.ModelConfig, mesh: Optional[jax.sharding.Mesh] = None
) -> str:
  """The attention implementation a run uses: `config.attention` resolved.

  "auto" picks for the platform the program is compiled for (the mesh's
  devices, else the default backend; `layers.target_platform`): on a TPU
  "splash" (the Pallas splash kernel: flash attention, no [S, S] scores in
  memory, per device in `shard_map`); on a GPU of compute capability 8.0 or
  newer "cudnn" (fused flash attention) when the compute dtype is
  bfloat16/float16, the kernel's head width (`_kernel_head_width`) is a
  multiple of 8 up to 128, rows are not packed (`config.packing`: the
  fused kernel takes no segment mask) and the mesh has no context axis,
  otherwise "dot_product" (XLA);
  "einsum" on the CPU, where it is as fast and is the reference. Every
  implementation serves both attention types.

  Args:
    config: the model's config (`attention`, `compute_dtype`, `head_dim`
      or the MLA head widths).
    mesh: the mesh the program is compiled for, or None.

  Returns:
    One of "einsum", "dot_product", "cudnn", "splash".

  Raises:
    ValueError: unknown `config.attention`, or "cudnn" with float32 compute
      (cuDNN's fused kernel takes bfloat16/float16 only; casting silently
      would change the run's numerics), off a GPU, or with `packing`.
  """
  name = config.attention
  if name not in choices.ATTENTION_IMPLEMENTATIONS:
    raise ValueError(
        f"config.attention={name!r}: must be one of "
        f"{list(choices.ATTENTION_IMPLEMENTATIONS)}"
    )
  backend = layers.target_platform(mesh)
  half = config.compute_dtype in ("bfloat16", "float16")
  if name == "cudnn":
    if not half:
      raise ValueError(
          f"config.attention='cudnn' needs compute_dtype "
          f"bfloat16 or float16, got {config.compute_dtype!r}"
      )
    if backend != "gpu":
      raise ValueError(
          f"config.attention='cudnn' needs a GPU backend, " f"got {backend!r}"
      )
    if getattr(config, "packing", False):
      raise ValueError(
          "config.attention='cudnn' takes no segment mask: with "
          "config.packing=True use 'dot_product' or 'auto'"
      )
  if name != "auto":
    return name
  if backend == "gpu":
    width = _kernel_head_width(config)
    fused = half and _cuda_capability() >= 8.0 and width % 8 == 0
    # cuDNN's kernel takes no segment mask, nor the context axis's
    # zig-zag mask (`layers.attend`).
    plain = not getattr(config, "packing", False)
    if fused and width <= 128 and plain and mesh_lib.context_size(mesh) == 1:
      return "cudnn"
    return "dot_product"
  if backend == "tpu":
    return "splash"
  return "einsum"


def _kernel_head_width(config: model_config.ModelConfig) -> int:
  """Head width the fused kernels see: head_dim, or for MLA the wider of the
  query/key and value widths (`layers.attend` pads to it)."""
  if config.attention_type == "mla":
    return max(mla.qk_head_dim(config), config.v_head_dim)
  return config.head_dim


def gqa_projections(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    positions: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Grouped-query attention's q [B, S, H, D], k and v [B, S, K, D] of the
  normalised input x [B, S, E]; with `config.qk_norm` each query and key
  head RMS-normalised (scales q_norm, k_norm [D]); then rotary embeddings
  at int `positions` ([B, S] or [1, S]) applied to q and k."""
  cdt = x.dtype
  q = jnp.einsum("bse,ehd->bshd", x, layer["wq"].astype(cdt))
  k = jnp.einsum("bse,ekd->bskd", x, layer["wk"].astype(cdt))
  v = jnp.einsum("bse,ekd->bskd", x, layer["wv"].astype(cdt))
  if config.qk_norm:
    q = norm(q, layer["q_norm"], config)
    k = norm(k, layer["k_norm"], config)
  return _rotary(q, positions, config), _rotary(k, positions, config), v


def _rotary(
    x: jax.Array, positions: jax.Array, config: model_config.ModelConfig
) -> jax.Array:
  """`layers.rope` on the first head_dim x partial_rotary_factor dimensions
  of each head of x [B, S, N, D] (with that part's own frequencies, its
  halves rotated together, as transformers' partial rotary does); the rest
  unchanged."""
  scaling = layers.rope_scaling(config)
  rotary = int(x.shape[-1] * config.partial_rotary_factor)
  if rotary == x.shape[-1]:
    return layers.rope(x, positions, config.rope_theta, scaling)
  turned = layers.rope(x[..., :rotary], positions, config.rope_theta, scaling)
  return jnp.concatenate([turned, x[..., rotary:]], axis=-1)


def output_gate(
    out: jax.Array, x: jax.Array, layer: Mapping[str, jax.Array]
) -> jax.Array:
  """The attention context out [B, S, H, D] times sigmoid(x wq_gate), x
  [B, S, E] the normalised layer input, when the layer has that gate."""
  if "wq_gate" not in layer:
    return out
  gate = jnp.einsum("bse,ehd->bshd", x, layer["wq_gate"].astype(x.dtype))
  return out * jax.nn.sigmoid(gate)


def _attention(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    mesh: Optional[jax.sharding.Mesh],
    rows: "Rows",
) -> jax.Array:
  """Causal self-attention of `config.attention_type`. [B, S, E] -> same."""
  implementation = attention_implementation(config, mesh)
  positions = rows.positions
  if positions is None:
    positions = layers.positions_from_zero(x.shape[1])
  if config.attention_type == "mla":
    return mla.attention(
        x, layer, config, implementation, mesh, positions, rows.segment_ids
    )
  cdt = x.dtype
  tag = jax.ad_checkpoint.checkpoint_name
  q, k, v = gqa_projections(x, layer, config, positions)
  scaling = layers.rope_scaling(config)
  q, k, v = tag(q, "query"), tag(k, "key"), tag(v, "value")
  out = layers.attend(
      q, k, v, implementation, mesh, scaling, segment_ids=rows.segment_ids
  )
  out = output_gate(out, x, layer)
  return tag(
      jnp.einsum("bshd,hde->bse", out, layer["wo"].astype(cdt)), "attn_out"
  )


class Rows(NamedTuple):
  """How the tokens of a [B, S] batch form sequences.

  Attributes:
    segment_ids: int32 [B, S] or None. A packed row holds several sequences
      one after another, each a run of equal ids (padding is a run of its
      own); attention sees only the token's own sequence. None: each row
      is one sequence.
    positions: int32 [B, S] or None: each token's position in its sequence
      (restarting at 0 where a sequence starts), for the rotary
      embeddings. None: 0..S-1.
  """

  segment_ids: Optional[jax.Array] = None
  positions: Optional[jax.Array] = None

  @classmethod
  def of(cls, batch: Mapping[str, jax.Array]) -> "Rows":
    """The batch's "segment_ids" and "positions", when it has them."""
    return cls(batch.get("segment_ids"), batch.get("positions"))


def mlp(
    x: jax.Array, layer: Mapping[str, jax.Array], chunks: int = 1
) -> jax.Array:
  """SwiGLU MLP. x: [B, S, E] -> [B, S, E].

  With `chunks` > 1 (and S > 1) the [B, S, M] hidden activations exist one
  group of positions at a time, forward and backward: the positions are
  split into `chunks` strided groups (position t in group t mod `chunks`; S
  is padded with zero rows to a multiple of `chunks`), mapped over one after
  another, each rematerialised in the backward pass. The MLP acts on each
  position alone, so the outputs are the same; the weights' gradients are
  summed over the groups. Strided groups keep a sequence split over devices
  (context parallelism) split the same way in every group.
  """
  cdt = x.dtype
  w_gate, w_up, w_down = (
      layer[name].astype(cdt) for name in ("w_gate", "w_up", "w_down")
  )

  def swiglu(x):
    gate = jnp.einsum("bse,em->bsm", x, w_gate)
    up = jnp.einsum("bse,em->bsm", x, w_up)
    return jnp.einsum("bsm,me->bse", jax.nn.silu(gate) * up, w_down)

  if chunks > 1 and x.shape[1] > 1:
    b, s, e = x.shape
    padded = -(-s // chunks) * chunks
    grouped = jnp.pad(x, ((0, 0), (0, padded - s), (0, 0)))
    # [B, S', E] -> [chunks, B, S' / chunks, E]: group j holds the positions
    # j, j + chunks, j + 2 chunks, ...
    grouped = grouped.reshape(b, padded // chunks, chunks, e)
    grouped = jnp.moveaxis(grouped, 2, 0)
    out = jax.lax.map(jax.checkpoint(swiglu, prevent_cse=False), grouped)
    out = jnp.moveaxis(out, 0, 2).reshape(b, padded, e)[:, :s]
  else:
    out = swiglu(x)
  return jax.ad_checkpoint.checkpoint_name(out, "mlp_out")


def _remat(block, policy: str):
  """Wraps the scanned block in `jax.checkpoint` as `config.remat_policy` says.

  "none" keeps every intermediate for the backward pass; "full" keeps only
  the block's input and recomputes the rest; "save_dots" keeps the matmul
  outputs that have no batch dimension (the projections, not the [S, S]
  attention scores); "save_named" keeps the values named in `SAVED_NAMES`;
  "save_context" keeps only the attention's context (`layers.CONTEXT_NAME`:
  with the splash kernel its output and log-sum-exp, so the backward pass
  runs the kernel's backward and not its forward again) and recomputes the
  rest as "full" does, for about one [B, S, H, D] array a layer more.

  Raises:
    ValueError: unknown policy.
  """
  policies = {
      "full": None,
      "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
      "save_named": jax.checkpoint_policies.save_only_these_names(*SAVED_NAMES),
      "save_context": jax.checkpoint_policies.save_only_these_names(
          layers.CONTEXT_NAME
      ),
  }
  if policy == "none":
    return block
  if policy not in policies:
    raise ValueError(
        f"config.remat_policy={policy!r}: must be one of "
        f"{list(choices.REMAT_POLICIES)}"
    )
  # Inside scan, CSE cannot merge the recomputation into the forward pass,
  # so the CSE barrier is only a cost.
  return jax.checkpoint(block, policy=policies[policy], prevent_cse=False)


def _final_hidden(
    params: Params,
    tokens: jax.Array,
    config: model_config.ModelConfig,
    mesh: Optional[jax.sharding.Mesh] = None,
    rows: Rows = Rows(),
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Embedding, blocks and final norm.

  Args:
    params: the parameter pytree.
    tokens: int32 [B, S].
    config: the model's config.
    mesh: the mesh the program is compiled for, or None (see `loss_fn`).
    rows: the rows' sequences (`Rows`).

  Returns:
    (x, moe_stats): x [B, S, E] in the compute dtype, in the zig-zag
    layout (`zigzag`) on a mesh with a context axis (`context_layout`);
    moe_stats the MoE layers' statistics reduced over layers
    (`moe.summarize`), {} for a dense model.
  """
  cdt = _dtype(config.compute_dtype)
  tokens, rows = context_layout(tokens, rows, mesh)
  x = _split_tokens(
      jnp.take(params["embedding"], tokens, axis=0).astype(cdt), mesh
  )

  blocks = _Blocks(config, mesh, rows)
  if "layers" in params:
    x, _ = jax.lax.scan(
        _remat(blocks.block, config.remat_policy), x, params["layers"]
    )
  stats = {}
  if "linear_layers" in params:
    x, stats = _hybrid_stack(blocks, x, params, config)
  elif "moe_layers" in params:
    x, per_layer = jax.lax.scan(
        _remat(blocks.moe_block, config.remat_policy), x, params["moe_layers"]
    )
    stats = moe.summarize(per_layer)
  return norm(x, params["final_norm"], config), stats


class _Blocks:
  """The layer kinds of `_final_hidden`, over one call's mesh and rows."""

  def __init__(
      self,
      config: model_config.ModelConfig,
      mesh: Optional[jax.sharding.Mesh],
      rows: "Rows",
  ):
    self._config = config
    self._mesh = mesh
    self._rows = rows

  def block(self, x, layer):
    """A dense layer: attention, then the MLP, both residual."""
    config, mesh = self._config, self._mesh
    x = x + _attention(
        norm(x, layer["attn_norm"], config), layer, config, mesh, self._rows
    )
    x = x + mlp(norm(x, layer["mlp_norm"], config), layer, config.mlp_chunks)
    return _split_tokens(x, mesh), None

  def moe_ffn(self, x, layer):
    """A MoE layer's residual expert MLP; returns its statistics too."""
    config, mesh = self._config, self._mesh
    out, stats = moe.moe_mlp(
        norm(x, layer["mlp_norm"], config), layer, config, mesh
    )
    x = x + jax.ad_checkpoint.checkpoint_name(out, "mlp_out")
    return _split_tokens(x, mesh), stats

  def moe_block(self, x, layer):
    """A MoE layer: attention, then `moe_ffn`."""
    config = self._config
    x = x + _attention(
        norm(x, layer["attn_norm"], config),
        layer,
        config,
        self._mesh,
        self._rows,
    )
    return self.moe_ffn(x, layer)

  def linear_block(self, x, layer):
    """A Gated DeltaNet layer, then `moe_ffn`."""
    out, _ = gated_deltanet.apply(
        norm(x, layer["attn_norm"], self._config),
        layer,
        self._config,
        segment_ids=self._rows.segment_ids,
        mesh=self._mesh,
    )
    return self.moe_ffn(x + out, layer)


def _hybrid_stack(
    blocks: _Blocks, x, params: Params, config: model_config.ModelConfig
):
  """The hybrid model's layers: each group's DeltaNet layers, then its
  attention layer, scanned over the groups.

  Returns:
    (x, the MoE statistics of every layer, summarized).
  """
  linear_block = _remat(blocks.linear_block, config.remat_policy)
  attention_block = _remat(blocks.moe_block, config.remat_policy)

  def group(x, inputs):
    linear, attention = inputs
    x, linear_stats = jax.lax.scan(linear_block, x, linear)
    x, attention_stats = attention_block(x, attention)
    return x, (linear_stats, attention_stats)

  x, (linear_stats, attention_stats) = jax.lax.scan(
      group,
      x,
      (grouped_linear_layers(params, config), params["moe_layers"]),
  )
  stats = moe.summarize(
      jax.tree_util.tree_map(
          lambda a, b: jnp.concatenate([a.reshape((-1,) + a.shape[2:]), b]),
          linear_stats,
          attention_stats,
      )
  )
  return x, stats


def context_layout(
    tokens: jax.Array, rows: "Rows", mesh: Optional[jax.sharding.Mesh]
) -> tuple[jax.Array, "Rows"]:
  """`tokens` [B, S] and `rows` in the zig-zag layout of the mesh's context
  axis (`zigzag`; unchanged without one), positions made explicit: each
  token keeps its position (the rotary embeddings), its sequence (the
  packing masks) and, through the same layout of the targets and weights
  (`loss_fn`), its loss."""
  context = mesh_lib.context_size(mesh)
  if context == 1:
    return tokens, rows
  positions = rows.positions
  if positions is None:
    positions = layers.positions_from_zero(tokens.shape[1])
  segment_ids = rows.segment_ids
  if segment_ids is not None:
    segment_ids = zigzag.to_zigzag(segment_ids, context)
  return zigzag.to_zigzag(tokens, context), Rows(
      segment_ids, zigzag.to_zigzag(positions, context)
  )


# Logical axes of the [B, S, E] hidden states (`axis_rules.activation_spec`).
_HIDDEN_AXES = ("activation_batch", "activation_length", None)


def _split_tokens(x: jax.Array, mesh: Optional[jax.sharding.Mesh]) -> jax.Array:
  """x [B, S, E] constrained to its rows over the batch axes and its tokens
  over the context axis, on a mesh with one (else unchanged)."""
  if mesh_lib.context_size(mesh) == 1:
    return x
  spec = axis_rules.activation_spec(_HIDDEN_AXES, dict(mesh.shape))
  return jax.lax.with_sharding_constraint(
      x, jax.sharding.NamedSharding(mesh, spec)
  )


def grouped_linear_layers(
    params: Params, config: model_config.ModelConfig
) -> Params:
  """The `linear_layers` stack viewed as [groups, n - 1, ...] (n the
  full_attention_interval): the DeltaNet layers before each attention
  layer, group g's attention layer being moe_layers[g]."""
  n = config.full_attention_interval
  return jax.tree_util.tree_map(
      lambda a: a.reshape((-1, n - 1) + a.shape[1:]), params["linear_layers"]
  )


# [B, S, E] hidden states -> float32 [B, S, V] logits.
unembed = vocab_loss.unembed


def apply(
    params: Params,
    tokens: jax.Array,
    config: model_config.ModelConfig,
    mesh: Optional[jax.sharding.Mesh] = None,
    rows: Rows = Rows(),
) -> jax.Array:
  """Runs the model.

  Args:
    params: the parameter pytree from `init_params`.
    tokens: int32 [B, S] token ids, S <= config.max_sequence_length.
    config: the model's config.
    mesh: as in `loss_fn`.
    rows: packed sequences' segment ids and positions (`Rows`); the
      default is one sequence per row.

  Returns:
    float32 [B, S, vocab_size] logits; position t predicts token t + 1.
  """
  x, _ = _final_hidden(params, tokens, config, mesh, rows)
  return unembed(
      zigzag.from_zigzag(x, mesh_lib.context_size(mesh)),
      output_projection(params),
  )


def next_token_log_probs(
    params: Params,
    tokens: jax.Array,
    config: model_config.ModelConfig,
    mesh: Optional[jax.sharding.Mesh] = None,
    rows: "Rows" = Rows(),
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Per position t, the log-probability of tokens[:, t + 1] and the
  entropy, under softmax(logits_t / temperature).

  With `config.loss_chunk_size` > 0 (and below S) the logits exist
  `loss_chunk_size` positions at a time, forward and backward (each chunk
  rematerialised), as in `loss_fn`: a 65,536-token row of a 248,320-entry
  vocabulary would otherwise hold 60 GiB of float32 logits. On a mesh with
  a context axis the positions are scored in its layout and put back in
  order.

  Args:
    params: the parameter pytree.
    tokens: int32 [B, S].
    config: the model's config.
    mesh: as in `loss_fn`.
    rows: as in `apply`.
    temperature: > 0.

  Returns:
    (log_probs, entropy), float32 [B, S] each; position S - 1, which has
    no next token, scores id 0 (the caller masks it).
  """
  x, _ = _final_hidden(params, tokens, config, mesh, rows)
  context = mesh_lib.context_size(mesh)
  following = jnp.concatenate(
      [tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1
  )
  following = zigzag.to_zigzag(following, context)
  unembedding = output_projection(params)

  def score(x_c, following_c):
    scaled = jax.nn.log_softmax(
        unembed(x_c, unembedding).astype(jnp.float32) / temperature, axis=-1
    )
    picked = jnp.take_along_axis(scaled, following_c[..., None], axis=-1)
    return picked[..., 0], -jnp.sum(jnp.exp(scaled) * scaled, axis=-1)

  chunk = config.loss_chunk_size
  if 0 < chunk < tokens.shape[1]:
    b, s = tokens.shape
    scored = jax.lax.map(
        lambda inputs: jax.checkpoint(score, prevent_cse=False)(*inputs),
        (
            vocab_loss.position_chunks(x, chunk),
            vocab_loss.position_chunks(following, chunk),
        ),
    )
    log_probs, entropy = (
        jnp.swapaxes(a, 0, 1).reshape(b, -1)[:, :s] for a in scored
    )
  else:
    log_probs, entropy = score(x, following)
  return (
      zigzag.from_zigzag(log_probs, context),
      zigzag.from_zigzag(entropy, context),
  )


# What `eval_fn` returns: each eval metric's name and the way it improves.
EVAL_DIRECTIONS = eval_metrics.LOSS_DIRECTIONS


def eval_fn(
    params: Params,
    batch: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
) -> dict[str, jax.Array]:
  """The eval metrics of one batch, named as `EVAL_DIRECTIONS` names them.

  Args:
    params: the parameter pytree.
    batch: as for `loss_fn`.
    config: the model's config.

  Returns:
    {"loss": the weighted mean cross entropy in nats per token (float32
    scalar, 0 when every weight is 0)}: `loss_fn`'s loss without the
    mixture-of-experts load-balancing term, which is a training objective,
    not a measure of the model.
  """
  _, aux = loss_fn(params, batch, config)
  num_tokens = aux["num_tokens"]
  loss = jnp.where(
      num_tokens > 0, aux["loss_sum"] / jnp.maximum(num_tokens, 1e-8), 0.0
  )
  return {eval_metrics.LOSS: loss}


def loss_fn(
    params: Params,
    batch: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean next-token cross entropy.

  With `config.loss_chunk_size` > 0, the logits are computed and reduced
  that many sequence positions at a time, so the full float32 [B, S, V]
  logits never exist (above S: one chunk), and their gradients are computed
  in the forward pass (`vocab_loss`: three vocabulary-sized products a chunk,
  not four); the loss is the same up to float32 summation order. With 0 the
  loss is differentiated as written, the reference. The logits are written
  in `config.logits_dtype` and reduced in float32.

  Args:
    params: the parameter pytree.
    batch: "inputs" int32 [B, S], "targets" int32 [B, S] (targets[:, t] is the
      token after inputs[:, t]), optional "weights" [B, S] (0 masks a
      position), optional "segment_ids" and "positions" int32 [B, S] of
      packed rows (`Rows`; the last token of a sequence has weight 0).
    config: the model's config.
    mesh: the mesh the program is compiled for (its batch split over every
      axis), or None for one device of the default backend: what "auto"
      choices resolve for, and where per-device kernels run.

  Returns:
    (loss, aux): loss is the weighted mean cross entropy in nats per token
    (float32 scalar, 0 when every weight is 0). aux holds float32 scalars:
    "loss_sum" (weighted sum of cross entropies), "num_tokens" (sum of
    weights), "num_correct" (weighted count of positions whose target has
    the largest logit) and "accuracy" (num_correct / num_tokens), so
    micro-batch results combine exactly by summing the sums.

  Raises:
    ValueError: `config.loss_chunk_size` < 0.
  """
  chunk = config.loss_chunk_size
  if chunk < 0:
    raise ValueError(
        f"config.loss_chunk_size={chunk!r}: must be >= 0 " f"(0 = unchunked)"
    )
  x, moe_stats = _final_hidden(
      params, batch["inputs"], config, mesh, Rows.of(batch)
  )
  targets = batch["targets"]
  weights = batch.get("weights")
  if weights is None:
    weights = jnp.ones(targets.shape, jnp.float32)
  else:
    weights = weights.astype(jnp.float32)
  # x is in the context axis's layout (`context_layout`); the sums are over
  # every position, so the targets and weights follow it.
  context = mesh_lib.context_size(mesh)
  targets = zigzag.to_zigzag(targets, context)
  weights = zigzag.to_zigzag(weights, context)
  loss_sum, num_correct = _token_sums(params, x, targets, weights, config)
  num_tokens = jnp.sum(weights)
  denom = jnp.maximum(num_tokens, 1e-8)
  loss = jnp.where(num_tokens > 0, loss_sum / denom, 0.0)
  aux = {
      "loss_sum": loss_sum,
      "num_tokens": num_tokens,
      "num_correct": num_correct,
      "accuracy": jnp.where(num_tokens > 0, num_correct / denom, 0.0),
  }
  if moe_stats:
    loss = loss + config.load_balance_loss_weight * moe_stats["aux_loss"]
    aux["moe"] = _moe_metrics(moe_stats)
    if statistic_rules(config):
      aux[param_statistics.KEY] = {ROUTER_BIAS: moe_stats["expert_load"]}
  return loss, aux


def _token_sums(
    params: Params,
    x: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    config: model_config.ModelConfig,
) -> tuple[jax.Array, jax.Array]:
  """The weighted sums of cross entropy and of hits over [B, S] positions
  of the final hidden states `x`: `loss_chunk_size` positions at a time
  (`vocab_loss.token_sums`), or all at once when it is 0, the logits in
  `logits_dtype`."""
  if config.loss_chunk_size > 0:
    projection, vocab_major = stored_output_projection(params)
    return vocab_loss.token_sums(
        x,
        projection,
        targets,
        weights,
        config.loss_chunk_size,
        vocab_major,
        config.logits_dtype,
    )
  return vocab_loss.token_sums_of_logits(
      unembed(x, output_projection(params), False, config.logits_dtype),
      targets,
      weights,
  )


# The router correction bias's path in the parameter tree.
ROUTER_BIAS = "moe_layers/router_bias"


def statistic_rules(
    config: model_config.ModelConfig,
) -> dict[str, param_statistics.Rule]:
  """The parameters the engine moves by statistics (param_statistics):
  the router bias, by `moe.update_router_bias` at
  `router_bias_update_rate`, when that rate is > 0; else none."""
  rate = config.router_bias_update_rate
  if not (config.num_experts and config.router_bias and rate > 0):
    return {}
  return {
      ROUTER_BIAS: functools.partial(moe.update_router_bias, rate=rate),
  }


# The `moe/<name>` metrics a model with experts reports every micro-batch:
# moe.STAT_NAMES, the dropped assignments named for what they count.
MOE_METRICS = tuple(
    "dropped_tokens" if name == "dropped" else name for name in moe.STAT_NAMES
)


def _moe_metrics(stats: Mapping[str, jax.Array]) -> dict[str, Any]:
  """The `moe/...` metrics of one micro-batch (docs/models.md, "MoE metrics").

  The dropped-assignment count is a `SummedMetric`: a step reports the sum
  over its micro-batches; the other statistics, their mean.
  """
  metrics = {name: stats[name] for name in moe.STAT_NAMES if name != "dropped"}
  metrics["dropped_tokens"] = metrics_buffer.SummedMetric(stats["dropped"])
  return metrics


def num_params(params: Params) -> int:
  """Total number of parameter elements."""
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def param_logical_axes(params: Params) -> Params:
  """Logical axis names of every parameter, a pytree like `params`.

  Each leaf is a tuple with one name per dimension, e.g. ("layers", "embed",
  "mlp") for layers/w_up.

  Raises:
    ValueError: if `params` does not have the structure of `init_params`.
  """

  def is_axes(x):
    return isinstance(x, tuple)

  axes = dict(_OUTER_AXES)
  if "unembedding" not in params:
    del axes["unembedding"]  # Tied embeddings.
  if "layers" in params or "moe_layers" not in params:
    axes["layers"] = _stack_axes(params.get("layers"), _MLP_AXES)
  if "moe_layers" in params:
    axes["moe_layers"] = _stack_axes(
        params["moe_layers"], _moe_axes(params["moe_layers"])
    )
  if "linear_layers" in params:
    axes["linear_layers"] = {
        **_NORM_AXES,
        **gated_deltanet.LOGICAL_AXES,
        **_moe_axes(params["linear_layers"]),
    }
  expected = jax.tree_util.tree_structure(axes, is_leaf=is_axes)
  actual = jax.tree_util.tree_structure(params)
  if expected != actual:
    raise ValueError(f"params structure {actual} is not the model's {expected}")
  return jax.tree_util.tree_map(lambda a: a, axes, is_leaf=is_axes)


def _moe_axes(stack) -> Params:
  """The MoE layer's axes of a stack; the shared experts, their gate and
  the router's bias are optional: named only where the stack has them."""
  present = stack if isinstance(stack, Mapping) else {}
  return {
      name: names
      for name, names in moe.LOGICAL_AXES.items()
      if name in present
      or not (name.startswith("shared_") or name == "router_bias")
  }


def _stack_axes(stack, ffn_axes: Params) -> Params:
  """Logical axes of a block stack: norms, attention (its type read from
  the stack's names) and the feed-forward layer's `ffn_axes`."""
  if not isinstance(stack, Mapping):
    return {}  # Cannot match: param_logical_axes reports the structure.
  if "wkv_a" in stack:
    attention = mla.logical_axes(low_rank_query="wq_a" in stack)
  elif "q_norm" in stack:
    attention = {**_GQA_AXES, **_QK_NORM_AXES}
  else:
    attention = _GQA_AXES
  if "wq_gate" in stack:
    attention = {**attention, **_GATE_AXES}
  return {**_NORM_AXES, **attention, **ffn_axes}


def weight_decay_mask(params: Params) -> Params:
  """True for the parameters weight decay applies to: the matrices.

  A parameter is a matrix when it has two or more dimensions besides the
  stacked "layers" one: projections, experts and embeddings are; norm
  scales, which the layer stack makes [layers, embed], are not.
  """
  return _axes_mask(params, _is_matrix)


def compute_dtype_mask(params: Params) -> Params:
  """True for the parameters the model reads only in its compute dtype.

  Every matrix (`weight_decay_mask`) is cast to the compute dtype where the
  model multiplies by it, except the Gated DeltaNet's short convolution
  kernels (the "conv_kernel" axis), which it applies in float32, as it does
  its norm scales, router biases and decay parameters. A copy of the
  parameters with these leaves in the compute dtype therefore gives the
  same outputs as the parameters in `weight_dtype` (what a decoder reads:
  `generation.decode_weights`).
  """
  return _axes_mask(params, _read_in_compute_dtype)


def _read_in_compute_dtype(names: tuple) -> bool:
  """`compute_dtype_mask`'s rule, by a parameter's logical axes."""
  return _is_matrix(names) and "conv_kernel" not in names


def gradient_copy_mask(params: Params) -> Params:
  """True for the parameters whose gradient the model computes in its
  compute dtype: the layer stacks' matrices of `compute_dtype_mask`.

  Each is read once a layer, cast to the compute dtype where the model
  multiplies by it, so its gradient in `weight_dtype` is that cast's
  compute-dtype cotangent, converted. Not the embedding (its gathered
  rows' gradients are summed per token, and a tied one is read by the loss
  too), the output projection (whose gradient the loss sums over chunks in
  float32) or what has an `EXPERT_LOGICAL_AXIS` (the routed experts, whose
  gradients the MoE dispatch sums, and the router): their gradients are
  finer than the compute dtype (`gradient_copy_test.GradientCopyTest` checks
  each model kind).
  """
  return _axes_mask(
      params,
      lambda names: "layers" in names
      and _read_in_compute_dtype(names)
      and EXPERT_LOGICAL_AXIS not in names,
  )


def gradient_copy(params: Params, config: model_config.ModelConfig) -> Params:
  """`params` with the `gradient_copy_mask` leaves cast to the compute dtype
  where it is narrower: the parameters the loss is differentiated in.

  The loss of this copy is the loss of `params`, and its gradient is the
  same values, the masked leaves' in the compute dtype (half the bytes of
  float32 ones for the step to write and the update to read;
  `gradient_copy_test.GradientCopyTest` holds them equal for each model
  kind).
  """
  cdt = _dtype(config.compute_dtype)

  def cast(p, masked):
    narrower = jnp.finfo(cdt).bits < jnp.finfo(p.dtype).bits
    return p.astype(cdt) if masked and narrower else p

  return jax.tree.map(cast, params, gradient_copy_mask(params))


def _is_matrix(names: tuple) -> bool:
  """Whether a parameter with these logical axes is a matrix: two or more
  dimensions besides the stacked "layers" one."""
  return sum(name != "layers" for name in names) >= 2


def _axes_mask(params: Params, predicate) -> Params:
  """A pytree like `params` of `predicate(logical axes)` for each leaf."""
  return jax.tree_util.tree_map(
      predicate,
      param_logical_axes(params),
      is_leaf=lambda x: isinstance(x, tuple),
  )


def param_fsdp_axis(params: Params, fsdp_size: int) -> Params:
  """Which dimension of each parameter to shard over an FSDP mesh axis
  alone (a mesh of "data" and "fsdp").

  The largest dimension divisible by `fsdp_size` is chosen (the first of
  equals), never the stacked "layers" dimension, which `lax.scan` slices,
  nor the "experts" dimension, which the expert mesh axis shards
  (`axis_rules.PARAMETERS`). A parameter with no such dimension, or
  `fsdp_size` 1, is replicated.

  Args:
    params: the parameter pytree (arrays or anything with `.shape`).
    fsdp_size: number of devices on the FSDP mesh axis (>= 1).

  Returns:
    A pytree like `params` whose leaves are an int dimension or None.

  Raises:
    ValueError: if fsdp_size < 1.
  """
  if not isinstance(fsdp_size, int) or fsdp_size < 1:
    raise ValueError(f"fsdp_size must be a positive int, got {fsdp_size!r}")
  never = axis_rules.PARAMETERS.never
  return jax.tree_util.tree_map(
      lambda x, names: axis_rules.largest_dividing(
          x.shape, names, fsdp_size, never
      ),
      params,
      param_logical_axes(params),
      is_leaf=lambda x: isinstance(x, tuple),
  )


def param_partition_specs(
    params: Params,
    fsdp_size: int,
    *,
    expert_size: int = 1,
    tensor_size: int = 1,
    context_size: int = 1,
    rules: axis_rules.Rules = axis_rules.PARAMETERS,
) -> Params:
  """`jax.sharding.PartitionSpec` per parameter: the logical-axis `rules`
  (`maxtext.runtime.axis_rules`) on a mesh of `fsdp_size` x `expert_size`.

  With the default rules, on a mesh with an expert axis, the "experts"
  dimension of the routed experts and the router is split over "expert"
  and their largest other dimension over "fsdp"; every other parameter's
  largest dimension is split over fsdp x expert (("fsdp", "expert")), so no
  expert group holds a copy of another's. Without an expert axis every
  parameter is split over "fsdp" alone (`param_fsdp_axis`).

  Args:
    params: the parameter pytree (arrays or anything with `.shape`).
    fsdp_size: number of devices on the "fsdp" mesh axis.
    expert_size: number of devices on the "expert" mesh axis.
    tensor_size: number of devices on the "tensor" mesh axis: the heads
      and hidden widths are split over it (`axis_rules.PARAMETERS`).
    context_size: number of devices on the "context" mesh axis: an FSDP
      axis for parameters (`axis_rules.PARAMETERS`).
    rules: the layout (`axis_rules.FSDP_ONLY` is the one before non-expert
      weights were split over the expert axis).

  Returns:
    A pytree like `params` of PartitionSpecs.

  Raises:
    ValueError: fsdp_size or expert_size < 1, or expert_size does not
      divide the number of experts.
  """
  sizes = {
      mesh_lib.FSDP_AXIS: fsdp_size,
      mesh_lib.EXPERT_AXIS: expert_size,
      mesh_lib.TENSOR_AXIS: tensor_size,
      mesh_lib.CONTEXT_AXIS: context_size,
  }
  for axis, size in sizes.items():
    if not isinstance(size, int) or size < 1:
      raise ValueError(f"{axis}_size must be a positive int, got {size!r}")
  return jax.tree_util.tree_map(
      lambda x, names: axis_rules.partition_spec(x.shape, names, sizes, rules),
      params,
      param_logical_axes(params),
      is_leaf=lambda x: isinstance(x, tuple),
  )
