"""Layer primitives the attention layouts share: RMSNorm, RoPE, causal kernels.

`maxtext.model` (grouped-query attention) and `maxtext.mla` (multi-head
latent attention) both build their queries, keys and values with these and
hand them to `attend`, so every attention implementation serves both. The
module imports neither of them, so neither import is a cycle.
"""

import dataclasses
import functools
import math
from typing import Optional

import jax
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash_kernel,
)
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as splash_mask,
)
import jax.numpy as jnp

from maxtext.core import choices
from maxtext.model import model_config
from maxtext.model import zigzag
from maxtext.runtime import mesh as mesh_lib

# Implementations `attend` runs ("auto" is resolved before, by
# `maxtext.model.attention_implementation`).
KERNELS = ("einsum", "dot_product", "cudnn", "splash")

# The `checkpoint_name` of attention's output, the context vectors: a remat
# policy that keeps this name keeps them for the backward pass. The splash
# kernel gives the name to its own output and log-sum-exp, the residuals its
# backward kernels read, so keeping it also spares the backward pass a rerun
# of the kernel's forward pass.
CONTEXT_NAME = "context"

# Splash kernel block length: its blocks must be multiples of 128 lanes.
_SPLASH_BLOCK = 128
# The longest block the splash kernel takes: each query block against each
# key block of 1,024 positions.
_SPLASH_LONGEST_BLOCK = 1024
# The forward kernel's longest key step inside a key block: a query block's
# float32 scores against 512 keys at a time.
_SPLASH_LONGEST_FORWARD_STEP = 512
# The most key blocks for which the splash kernel's backward pass is one
# fused kernel (`_splash_blocks`): its query gradient is one partial sum a
# key block, so its memory grows with the keys' length.
_FUSED_MOST_KEY_BLOCKS = 2


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis, statistics in float32, result in x's dtype."""
  x32 = x.astype(jnp.float32)
  mean_square = jnp.mean(x32 * x32, axis=-1, keepdims=True)
  normed = x32 * jax.lax.rsqrt(mean_square + eps)
  return (normed * scale.astype(jnp.float32)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class Llama3Scaling:
  """Llama 3.1's rescaled rotary frequencies (Hugging Face's rope_type
  "llama3"), which stretch a model trained on `original_max_position`
  tokens to a longer context.

  A frequency f has the wavelength w = 2 pi / f. With L =
  `original_max_position`: where w < L / high_freq_factor (high frequencies,
  many turns within the original context) f is kept; where w > L /
  low_freq_factor (low frequencies) it is divided by `factor`; between the
  two it moves linearly, in L / w, from f / factor to f:
  f' = (1 - a) f / factor + a f with a = (L / w - low_freq_factor) /
  (high_freq_factor - low_freq_factor).
  """

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position: int

  # Llama 3.1's scaling changes only the frequencies.
  magnitude = 1.0
  softmax_factor = 1.0

  def apply(self, inv_freq: jax.Array, theta: float) -> jax.Array:
    """The rescaled frequencies of float32 `inv_freq` (base `theta`)."""
    del theta  # The wavelengths say which frequencies move.
    original = float(self.original_max_position)
    wavelength = 2.0 * math.pi / inv_freq
    low, high = self.low_freq_factor, self.high_freq_factor
    stretched = jnp.where(
        wavelength > original / low, inv_freq / self.factor, inv_freq
    )
    a = (original / wavelength - low) / (high - low)
    smoothed = (1.0 - a) * inv_freq / self.factor + a * inv_freq
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return jnp.where(medium, smoothed, stretched)


def _yarn_mscale(factor: float, mscale: float) -> float:
  """YaRN's attention-temperature term 0.1 * mscale * ln(factor) + 1 (1 for
  factor <= 1)."""
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclasses.dataclass(frozen=True)
class YarnScaling:
  """YaRN's rotary scaling (Hugging Face's rope_type "yarn"; DeepSeek-V3's
  rotary part), which stretches a model trained on `original_max_position`
  tokens by `factor`.

  With D rotary dimensions, base theta and L = `original_max_position`, the
  dimension pair that turns r times within L is
  d(r) = D ln(L / (2 pi r)) / (2 ln theta). Pairs below floor(d(beta_fast))
  turn fast and keep their frequency f (extrapolation); pairs above
  ceil(d(beta_slow)) turn slowly and take f / factor (interpolation); in
  between a linear ramp over the pair index mixes the two. Cosines and sines
  are multiplied by `magnitude`:
  m(factor, mscale) / m(factor, mscale_all_dim) with
  m(s, c) = 0.1 c ln s + 1, or m(factor, 1) when either is 0; and with
  mscale_all_dim > 0 the softmax scale is multiplied by
  m(factor, mscale_all_dim)^2 (`softmax_factor`, DeepSeek-V3's attention
  correction: 1.3689^2 at factor 40).
  """

  factor: float
  original_max_position: int
  beta_fast: float
  beta_slow: float
  mscale: float
  mscale_all_dim: float

  @property
  def magnitude(self) -> float:
    if self.mscale and self.mscale_all_dim:
      return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(
          self.factor, self.mscale_all_dim
      )
    return _yarn_mscale(self.factor, 1.0)

  @property
  def softmax_factor(self) -> float:
    if not self.mscale_all_dim:
      return 1.0
    return _yarn_mscale(self.factor, self.mscale_all_dim) ** 2

  def apply(self, inv_freq: jax.Array, theta: float) -> jax.Array:
    """The rescaled frequencies of float32 `inv_freq` (base `theta`)."""
    pairs = inv_freq.shape[0]
    dim = 2 * pairs

    def pair_turning(rotations):
      return (
          dim
          * math.log(self.original_max_position / (rotations * 2 * math.pi))
          / (2 * math.log(theta))
      )

    low = max(math.floor(pair_turning(self.beta_fast)), 0)
    high = min(math.ceil(pair_turning(self.beta_slow)), dim - 1)
    if low == high:
      high += 0.001  # A ramp of zero width would divide by zero.
    ramp = jnp.clip(
        (jnp.arange(pairs, dtype=jnp.float32) - low) / (high - low), 0.0, 1.0
    )
    return inv_freq / self.factor * ramp + inv_freq * (1.0 - ramp)


RopeScaling = Llama3Scaling | YarnScaling


def rope_scaling(config: model_config.ModelConfig) -> Optional[RopeScaling]:
  """The rotary scaling `config.rope_scaling` names (None for "none").

  Raises:
    ValueError: a name outside `choices.ROPE_SCALINGS`.
  """
  name = config.rope_scaling
  if name == "none":
    return None
  if name == "llama3":
    return Llama3Scaling(
        factor=float(config.rope_scaling_factor),
        low_freq_factor=float(config.rope_low_freq_factor),
        high_freq_factor=float(config.rope_high_freq_factor),
        original_max_position=int(config.rope_original_max_position),
    )
  if name == "yarn":
    return YarnScaling(
        factor=float(config.rope_scaling_factor),
        original_max_position=int(config.rope_original_max_position),
        beta_fast=float(config.rope_yarn_beta_fast),
        beta_slow=float(config.rope_yarn_beta_slow),
        mscale=float(config.rope_yarn_mscale),
        mscale_all_dim=float(config.rope_yarn_mscale_all_dim),
    )
  raise ValueError(
      f"config.rope_scaling={name!r}: must be one of "
      f"{list(choices.ROPE_SCALINGS)}"
  )


def rope(
    x: jax.Array,
    positions: jax.Array,
    theta: float,
    scaling: Optional[RopeScaling] = None,
) -> jax.Array:
  """Applies rotary position embeddings at the given positions.

  Dimension i of the first half of each head is rotated together with
  dimension i of the second half, by the angle position * f_i, f_i =
  `rope_frequencies(D, theta, scaling)[i]`; a scaling's `magnitude`
  multiplies the cosines and sines. Positions are per row, so a
  batch of sequences that start at different offsets (a decoder's cache,
  left- or right-padded prompts) rotates each token by its own position.

  Args:
    x: [B, S, N, D] queries or keys, D even.
    positions: integer [B, S] positions of x's tokens ([1, S] broadcasts
      over the batch).
    theta: frequency base.
    scaling: a rescaling of the frequencies, or None (`rope_scaling`).

  Returns:
    [B, S, N, D] in x's dtype.
  """
  half = x.shape[3] // 2
  inv_freq = rope_frequencies(x.shape[3], theta, scaling)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, S, half]
  magnitude = 1.0 if scaling is None else scaling.magnitude
  sin = (jnp.sin(angles) * magnitude)[:, :, None, :]
  cos = (jnp.cos(angles) * magnitude)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = x32[..., :half], x32[..., half:]
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


def rope_frequencies(
    head_dim: int, theta: float, scaling: Optional[RopeScaling] = None
) -> jax.Array:
  """float32 [head_dim // 2] rotary frequencies theta^(-2i/head_dim),
  rescaled by `scaling` when given: the one place they are made."""
  inv_freq = theta ** (
      -jnp.arange(head_dim // 2, dtype=jnp.float32) * 2.0 / head_dim
  )
  return inv_freq if scaling is None else scaling.apply(inv_freq, theta)


def softmax_scale(
    qk_width: int, scaling: Optional[RopeScaling] = None
) -> float:
  """The attention scores' scale: 1 / sqrt(query width), times the rotary
  scaling's `softmax_factor`: the one place it is made."""
  factor = 1.0 if scaling is None else scaling.softmax_factor
  return factor / math.sqrt(qk_width)


def positions_from_zero(seq_len: int) -> jax.Array:
  """int32 [1, S] positions 0..S-1: sequences that start at position 0 (the
  training batch); the row broadcasts over the batch in `rope`."""
  return jnp.arange(seq_len, dtype=jnp.int32)[None, :]


def target_platform(mesh: Optional[jax.sharding.Mesh]) -> str:
  """The platform a program is compiled for: the mesh's devices' (which may
  be a TPU slice described on a CPU host), else JAX's default backend."""
  if mesh is None:
    return jax.default_backend()
  return mesh.devices.flat[0].platform


def same_segment(segment_ids: jax.Array) -> jax.Array:
  """bool [B, 1, S, S]: query t may see key u (u <= t) of its own sequence.

  A packed row holds several sequences one after another; `segment_ids`
  [B, S] numbers them (any ids, equal within a sequence, different between
  neighbours). Causal and same-segment together are exactly "u is an
  earlier token of t's own sequence".
  """
  s = segment_ids.shape[1]
  causal = jnp.tril(jnp.ones((s, s), jnp.bool_))
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return (same & causal)[:, None]


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    implementation: str,
    mesh: Optional[jax.sharding.Mesh] = None,
    scaling: Optional[RopeScaling] = None,
    segment_ids: Optional[jax.Array] = None,
) -> jax.Array:
  """Causal attention with softmax scale `softmax_scale(query width,
  scaling)`, within each packed sequence when `segment_ids` are given.

  The value width may differ from the query/key width (multi-head latent
  attention). "einsum" takes that as it is; the fused kernels want one head
  width, so q, k and v are zero-padded to the wider of the two (zero
  columns add nothing to a score, and a value's zero columns give output
  columns that are sliced off) and the scale is passed explicitly.

  Args:
    q: [B, S, H, Dqk] queries (rotary embeddings applied).
    k: [B, S, K, Dqk] keys, H a multiple of K.
    v: [B, S, K, Dv] values.
    implementation: one of `KERNELS`.
    mesh: the mesh the program is compiled for (its batch split over every
      mesh axis), or None for one device of the default backend. The splash
      kernel runs per device in `shard_map` over it.
    scaling: the model's rotary scaling (`rope_scaling`), or None.
    segment_ids: int [B, S] packed-sequence ids (`same_segment`), or None
      (each row is one sequence). "einsum" and "dot_product" apply the
      mask; "splash" passes them to the kernel (its `SegmentIds`); "cudnn"
      is refused (the fused kernel of `jax.nn.dot_product_attention` takes
      no mask; `maxtext.model.attention_implementation` resolves "auto" to
      "dot_product" for a packed run on a GPU).

  On a mesh with a "context" axis (context parallelism) the sequence axis
  of q, k, v and `segment_ids` is in the zig-zag layout (`zigzag`) and
  split over it: `_attend_context`.

  Returns:
    [B, S, H, Dv] in q's dtype, named `CONTEXT_NAME` for the remat
    policies (with "splash", the kernel's output and log-sum-exp carry the
    name, and the result is computed from them).

  Raises:
    ValueError: unknown implementation, or "cudnn" with segment ids or
      context parallelism.
  """
  out = _attend(q, k, v, implementation, mesh, scaling, segment_ids)
  if implementation == "splash":
    return out
  return jax.ad_checkpoint.checkpoint_name(out, CONTEXT_NAME)


def _attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    implementation: str,
    mesh: Optional[jax.sharding.Mesh],
    scaling: Optional[RopeScaling],
    segment_ids: Optional[jax.Array],
) -> jax.Array:
  """`attend` without the name: checks, then the implementation's call."""
  if implementation not in KERNELS:
    raise ValueError(
        f"attention implementation {implementation!r}: must be one of "
        f"{list(KERNELS)}"
    )
  if implementation == "cudnn" and segment_ids is not None:
    raise ValueError(
        "attention 'cudnn' takes no segment ids (packed rows): use "
        "config.attention='dot_product' or 'auto' with packing"
    )
  context = mesh_lib.context_size(mesh)
  if implementation == "cudnn" and context > 1:
    raise ValueError(
        "attention 'cudnn' does not run with context_parallelism > 1: use "
        "config.attention='dot_product' or 'auto'"
    )
  qk_width, v_width = q.shape[-1], v.shape[-1]
  scale = softmax_scale(qk_width, scaling)
  if context > 1 and implementation != "splash":
    return _attend_context(q, k, v, implementation, scale, mesh, segment_ids)
  if implementation == "einsum":
    return _attend_einsum(q, k, v, scale, segment_ids)
  width = max(qk_width, v_width)

  def pad(x):
    extra = width - x.shape[-1]
    return jnp.pad(x, [(0, 0)] * 3 + [(0, extra)]) if extra else x

  q, k, v = pad(q), pad(k), pad(v)
  if implementation == "splash" and context > 1:
    out = _attend_context(q, k, v, implementation, scale, mesh, segment_ids)
  elif implementation == "splash":
    out = _attend_splash(q, k, v, scale, mesh, segment_ids)
  else:
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        mask=None if segment_ids is None else same_segment(segment_ids),
        scale=scale,
        is_causal=True,
        implementation="xla" if implementation == "dot_product" else "cudnn",
    )
  return out[..., :v_width]


def _attend_einsum(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    scale: float,
    segment_ids: Optional[jax.Array] = None,
) -> jax.Array:
  """Reference causal attention; scores and softmax in float32.

  Args: as `attend`, plus the softmax scale.

  Returns:
    [B, S, H, Dv] in q's dtype.
  """
  s = q.shape[1]
  if segment_ids is None:
    visible = jnp.tril(jnp.ones((s, s), dtype=jnp.bool_))[None]
  else:
    visible = same_segment(segment_ids)[:, 0]
  return _attend_visible(q, k, v, scale, visible)


def _attend_visible(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    scale: float,
    visible: jax.Array,
) -> jax.Array:
  """Attention of q [B, T, H, D] to k [B, S, K, D], v [B, S, K, Dv] where
  bool `visible` ([B or 1, T, S]) lets a query see a key; scores and
  softmax in float32. Returns [B, T, H, Dv] in q's dtype."""
  b, t, h, d = q.shape
  kv = k.shape[2]
  # Query heads h = kv_head * group + g share key/value head kv_head.
  q = q.reshape(b, t, kv, h // kv, d)
  scores = jnp.einsum("bskgd,btkd->bkgst", q, k).astype(jnp.float32)
  scores = scores * scale
  scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  out = jnp.einsum("bkgst,btkd->bskgd", probs, v)
  return out.reshape(b, t, h, v.shape[-1])


def attend_cached(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_positions: jax.Array,
    scaling: Optional[RopeScaling] = None,
) -> jax.Array:
  """Attention of queries at given positions to a cache of keys and values.

  Slot j of the cache holds the key and value of position j; a query at
  position p sees slots 0..p (what the causal mask of `attend` lets it see
  in a whole sequence). Scores and softmax in float32, as `_attend_einsum`.

  Args:
    q: [B, T, H, Dqk] queries (rotary embeddings applied).
    k: [B, L, K, Dqk] cached keys, H a multiple of K.
    v: [B, L, K, Dv] cached values.
    q_positions: int [B, T] positions of the queries, < L.
    scaling: the model's rotary scaling, as `attend` takes it.

  Returns:
    [B, T, H, Dv] in q's dtype.
  """
  b, t, h, d = q.shape
  length, kv = k.shape[1], k.shape[2]
  q = q.reshape(b, t, kv, h // kv, d)
  scores = jnp.einsum("bskgd,btkd->bkgst", q, k).astype(jnp.float32)
  scores = scores * softmax_scale(d, scaling)
  visible = jnp.arange(length)[None, None, :] <= q_positions[:, :, None]
  scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  out = jnp.einsum("bkgst,btkd->bskgd", probs, v)
  return out.reshape(b, t, h, v.shape[-1])


def _attend_splash(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    scale: float,
    mesh: Optional[jax.sharding.Mesh],
    segment_ids: Optional[jax.Array] = None,
) -> jax.Array:
  """Causal attention with the Pallas splash kernel; q, k, v of one width.

  The sequence is zero-padded to a multiple of the kernel's block: padded
  keys lie after every real query, so the causal mask hides them, and padded
  queries are dropped. Segment ids (packed rows) go to the kernel as its
  `SegmentIds`, padded with the last token's id so no padded query row is
  empty. For a TPU target the kernel is the compiled Mosaic
  kernel; for another platform it runs in Pallas interpret mode (slow; for
  checking numerics on the CPU). On a mesh it runs in `shard_map`: each
  device attends over its own sequences with its heads (all of them, or
  its share on a "tensor" axis), so the custom call is never asked to
  partition.
  """
  _, s, h, _ = q.shape
  padded = -(-s // _SPLASH_BLOCK) * _SPLASH_BLOCK

  def heads_first(x):  # [B, S, N, D] -> [B, N, padded, D]
    x = jnp.pad(x, ((0, 0), (0, padded - s), (0, 0), (0, 0)))
    return jnp.swapaxes(x, 1, 2)

  mask = splash_mask.MultiHeadMask(
      [splash_mask.CausalMask((padded, padded))] * h
  )
  kernel = splash_kernel.make_splash_mha(
      mask,
      block_sizes=_splash_blocks(padded),
      head_shards=1,
      q_seq_shards=1,
      interpret=target_platform(mesh) != "tpu",
      residual_checkpoint_name=CONTEXT_NAME,
  )

  def local(q, k, v, *segments):  # [b, S, N, D] per device
    q = q * jnp.asarray(scale, q.dtype)
    q, k, v = heads_first(q), heads_first(k), heads_first(v)
    if segments:
      ids = jnp.pad(segments[0], ((0, 0), (0, padded - s)), mode="edge")
      out = jax.vmap(
          lambda q, k, v, ids: kernel(
              q, k, v, segment_ids=splash_kernel.SegmentIds(ids, ids)
          )
      )(q, k, v, ids)
    else:
      out = jax.vmap(kernel)(q, k, v)
    return jnp.swapaxes(out, 1, 2)[:, :s]

  args = (q, k, v) if segment_ids is None else (q, k, v, segment_ids)
  if mesh is None:
    return local(*args)
  # The batch is split over every mesh axis but "tensor"
  # (maxtext.runtime.mesh.batch_sharding), the heads over "tensor".
  batch = mesh_lib.batch_axes(mesh)
  heads = (
      mesh_lib.TENSOR_AXIS if mesh_lib.TENSOR_AXIS in mesh.axis_names else None
  )
  spec = jax.sharding.PartitionSpec(batch, None, heads)
  specs = (spec,) * 3 + (jax.sharding.PartitionSpec(batch),) * (len(args) - 3)
  return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=specs,
      out_specs=spec,
      check_vma=False,
  )(*args)


# pylint: disable-next=abstract-method  # As splash's CausalMask: no __bool__.
class _ZigzagCausalMask(splash_mask.CausalMask):
  """Splash's causal mask for queries in the zig-zag layout (`zigzag`)
  against keys in the original order: the kernel reads each query row's
  original position from `q_sequence` (split over the context axis with
  the queries), so "key position <= query position" is the causal mask."""

  def __init__(self, seq_len: int, context: int):
    super().__init__((seq_len, seq_len))
    self.q_sequence = zigzag.order(seq_len, context)


def _splash_blocks(
    length: int, kv_length: Optional[int] = None
) -> "splash_kernel.BlockSizes":
  """The splash kernel's block sizes for queries `length` long against
  keys `kv_length` long (default `length`; multiples of 128): every block
  the longest of 1,024, 512 and 128 positions that divides `length`; the
  forward kernel walks a key block 512 keys at a time at most
  (`block_kv_compute`): on one TPU v5e chip Qwen3-0.6B's 4 x 2,048 step at
  full remat took 0.3638 s against 0.3682 s with 1,024 (docs/PERFORMANCE.md,
  "The splash forward kernel's key steps").

  The backward pass is one fused kernel where the keys span at most
  `_FUSED_MOST_KEY_BLOCKS` blocks, else two kernels (dq; dk and dv), each
  of which recomputes the attention probabilities. The fused kernel
  computes the gradients of the queries, keys and values in one pass, but
  its dq is one bfloat16 partial sum per key block, added after the
  kernel: kv_length / block copies of the queries' gradient (64 for a
  context-parallel 65,536-token row in blocks of 1,024), where two kernels
  write one. On one TPU v5e chip, Qwen3-0.6B at 4 x 2,048 with full
  rematerialisation ran 5.4% faster with the fused kernel than with two
  over blocks of 512, and 7.3% faster with blocks of 1,024
  (docs/PERFORMANCE.md, "The splash kernel's blocks").
  """
  block = next(
      size
      for size in (_SPLASH_LONGEST_BLOCK, 512, _SPLASH_BLOCK)
      if length % size == 0
  )
  sizes = dict(
      block_q=block,
      block_kv=block,
      block_kv_compute=min(block, _SPLASH_LONGEST_FORWARD_STEP),
      block_q_dkv=block,
      block_kv_dkv=block,
      block_kv_dkv_compute=block,
  )
  if (kv_length or length) // block <= _FUSED_MOST_KEY_BLOCKS:
    return splash_kernel.BlockSizes(**sizes, use_fused_bwd_kernel=True)
  return splash_kernel.BlockSizes(**sizes, block_q_dq=block, block_kv_dq=block)


def _attend_context(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    implementation: str,
    scale: float,
    mesh: jax.sharding.Mesh,
    segment_ids: Optional[jax.Array] = None,
) -> jax.Array:
  """Causal attention with the sequence split over the "context" axis.

  q, k, v [B, S, ...] and `segment_ids` are in the zig-zag layout
  (`zigzag`), each device holding its two chunks of every row. In
  `shard_map`, each device all-gathers the keys, values (and segment ids)
  of its rows over the context axis (their gradients come back as one
  reduce-scatter), puts them back in the original order (a static
  permutation of 2C chunks) and attends its local queries to them with the
  mask "key position <= the query's original position" (and the same
  sequence). Every device's queries see the same number of keys in total,
  so the work is balanced. "einsum" and "dot_product" build that mask;
  "splash" runs the kernel with `q_seq_shards` = C on the zig-zag causal
  mask (`_ZigzagCausalMask`), the kernel's mask data split over the axis
  with the queries. The batch is split over the batch axes, the heads over
  "tensor" as in `_attend_splash`.

  Raises:
    ValueError: 2C does not divide S, or (splash) S / C is not a multiple
      of the kernel's 128-long blocks.
  """
  context = mesh_lib.context_size(mesh)
  _, s, h, _ = q.shape
  slots = zigzag.order(s, context)
  axis = mesh_lib.CONTEXT_AXIS
  batch = mesh_lib.batch_axes(mesh)
  heads = (
      mesh_lib.TENSOR_AXIS if mesh_lib.TENSOR_AXIS in mesh.axis_names else None
  )
  P = jax.sharding.PartitionSpec
  spec, ids_spec = P(batch, axis, heads), P(batch, axis)
  if implementation == "splash":
    extra, extra_spec = _zigzag_splash_kernel(s, h, mesh)
  else:
    extra = jnp.asarray(slots)
    extra_spec = P(axis)
  local = functools.partial(
      _attend_context_local,
      implementation=implementation,
      scale=scale,
      seq_len=s,
      context=context,
  )
  args = (q, k, v, extra) + (() if segment_ids is None else (segment_ids,))
  specs = (spec,) * 3 + (extra_spec,) + (ids_spec,) * (len(args) - 4)
  return jax.shard_map(
      local, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False
  )(*args)


def _zigzag_splash_kernel(s: int, h: int, mesh: jax.sharding.Mesh):
  """The splash kernel of `_attend_context` and its sharding spec.

  The zig-zag causal mask of `h` heads of `s`-token rows, its query
  sequence split over the context axis (`q_seq_shards` = C).

  Raises:
    ValueError: S / C is not a multiple of the kernel's 128-long blocks.
  """
  context = mesh_lib.context_size(mesh)
  local_len = s // context
  if local_len % _SPLASH_BLOCK:
    raise ValueError(
        f"attention 'splash' with context_parallelism={context}: each "
        f"device's {local_len} tokens of a {s}-token row must be a "
        f"multiple of {_SPLASH_BLOCK}"
    )
  kernel = splash_kernel.make_splash_mha(
      splash_mask.MultiHeadMask([_ZigzagCausalMask(s, context)] * h),
      block_sizes=_splash_blocks(local_len, s),
      head_shards=1,
      q_seq_shards=context,
      interpret=target_platform(mesh) != "tpu",
      residual_checkpoint_name=CONTEXT_NAME,
  )
  kernel_spec = kernel.manual_sharding_spec(
      jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec(None, mesh_lib.CONTEXT_AXIS)
      )
  )
  return kernel, kernel_spec


def _context_gather(x, context: int):
  """This device's rows, whole, in the original order (`_attend_context`)."""
  whole = jax.lax.all_gather(x, mesh_lib.CONTEXT_AXIS, axis=1, tiled=True)
  return zigzag.from_zigzag(whole, context)


def _attend_context_local(
    q, k, v, extra, *segments, implementation, scale, seq_len, context
):
  """`_attend_context` on one device's blocks: its queries against its
  rows' gathered keys and values. `extra`: the splash kernel, or each
  local position's original one; `segments`: the segment ids' block, if
  rows are packed."""
  k, v = _context_gather(k, context), _context_gather(v, context)
  if implementation == "splash":
    q = jnp.swapaxes(q * jnp.asarray(scale, q.dtype), 1, 2)
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    if segments:
      ids = (segments[0], _context_gather(segments[0], context))
      out = jax.vmap(
          lambda q, k, v, q_ids, kv_ids: extra(
              q, k, v, segment_ids=splash_kernel.SegmentIds(q_ids, kv_ids)
          )
      )(q, k, v, *ids)
    else:
      out = jax.vmap(extra)(q, k, v)
    return jnp.swapaxes(out, 1, 2)
  visible = extra[None, :, None] >= jnp.arange(seq_len)[None, None, :]
  if segments:
    ids = segments[0]
    visible = visible & (
        ids[:, :, None] == _context_gather(ids, context)[:, None, :]
    )
  if implementation == "einsum":
    return _attend_visible(q, k, v, scale, visible)
  return jax.nn.dot_product_attention(
      q, k, v, mask=visible[:, None], scale=scale, implementation="xla"
  )
