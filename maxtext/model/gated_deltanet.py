"""Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5.

Followed: Hugging Face transformers 5.24.0,
`models/qwen3_5_moe/modeling_qwen3_5_moe.py` (`Qwen3_5MoeGatedDeltaNet`, its
torch fallbacks `torch_chunk_gated_delta_rule`,
`torch_recurrent_gated_delta_rule`, `causal_conv1d_fn`, `l2norm` and
`Qwen3_5MoeRMSNormGated`); Qwen3-Next's layer (`qwen3_next`) has the same
parts but packs q, k, v, z and b, a into two projections grouped per key
head (`in_proj_qkvz`, `in_proj_ba`): only its import would differ (not
tested here).

One layer, for a token x_t (Hk key heads of width Dk, Hv value heads of
width Dv, Hv a multiple of Hk; value head h reads key head h // (Hv / Hk)):
  q, k, v   = SiLU(causal depthwise conv, kernel K, of x W_q, x W_k, x W_v)
  q, k      = q / |q|, k / |k| per head (x rsqrt(sum x^2 + 1e-6)); q / sqrt(Dk)
  g_t       = -exp(a_log) softplus(x W_a + dt_bias)     per value head, <= 0
  beta_t    = sigmoid(x W_b)                            per value head
  S_t       = exp(g_t) S_{t-1}                          [Dk, Dv] per value head
  S_t       = S_t + k_t (beta_t (v_t - S_t^T k_t))^T    the delta rule
  o_t       = S_t^T q_t
  out_t     = sum_h (RMSNorm(o_t,h) * out_norm * SiLU(z_t,h)) W_o,h,
              z = x W_z
The output RMSNorm scales by `out_norm` as it is (initialised to 1), not by
1 + w as Qwen3.5's layer norms and q/k norms do: transformers'
`Qwen3_5MoeRMSNormGated` against `Qwen3_5MoeRMSNorm`.

Two forms of the same function:
* `apply` runs a sequence chunk by chunk (`chunked_delta_rule`), for
  training and prefill. Within a chunk of C tokens the recurrence is a
  unit lower-triangular system (the WY / UT form of the delta rule), solved
  for all chunks at once by its inverse, a product of log2(C) matrix
  polynomials; the chunks are joined by a `lax.scan` over the
  chunk-start states, whose body is three matmuls. Everything outside the
  scan is batched einsums over [chunks, C, C] blocks, so XLA keeps the layer
  in matmuls. `recurrent_delta_rule` is the same recurrence token by token
  (a `lax.scan`): the reference the chunked form is benchmarked against.
* `step` runs one token on a carried `State` (the last K - 1 inputs of each
  convolution and the [Hv, Dk, Dv] recurrent state), for decoding; `apply`
  takes and returns the same state, so a prompt is prefilled in chunks and
  continued token by token.

The delta rule runs in float32 whatever the compute dtype (its state sums
thousands of rank-one updates); projections run in x's dtype.

The transformer places it by `full_attention_interval` (the `linear_layers`
stack, `maxtext.model.transformer`); `maxtext.hf.qwen35` imports and
exports its weights; `maxtext.generation.cached_model` carries one `State`
per layer and sequence beside the attention layers' key/value cache.

Config fields read (as transformers names them, `linear_*`):
  emb_dim, norm_epsilon, linear_num_key_heads (Hk), linear_num_value_heads
  (Hv), linear_key_head_dim (Dk), linear_value_head_dim (Dv),
  linear_conv_kernel_dim (K), linear_chunk_size (C, the chunked form's
  chunk length; any sequence length works, the last chunk is zero-padded).

Parameter shapes of a stack of L layers (E emb_dim):
  wq, wk     [L, E, Hk, Dk]
  wv, wz     [L, E, Hv, Dv]
  wa, wb     [L, E, Hv]
  conv_q     [L, K, Hk, Dk]   conv_*[K - 1] weighs the current token
  conv_k     [L, K, Hk, Dk]
  conv_v     [L, K, Hv, Dv]
  a_log      [L, Hv]
  dt_bias    [L, Hv]
  out_norm   [L, Dv]
  wo         [L, Hv, Dv, E]
"""

import functools
from typing import Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.model import context_recurrence
from maxtext.model import layers
from maxtext.model import model_config
from maxtext.runtime import mesh as mesh_lib

# Logical axis names of the parameters (one per dimension).
LOGICAL_AXES = {
    "wq": ("layers", "embed", "linear_k_heads", "head_dim"),
    "wk": ("layers", "embed", "linear_k_heads", "head_dim"),
    "wv": ("layers", "embed", "linear_v_heads", "head_dim"),
    "wz": ("layers", "embed", "linear_v_heads", "head_dim"),
    "wa": ("layers", "embed", "linear_v_heads"),
    "wb": ("layers", "embed", "linear_v_heads"),
    "conv_q": ("layers", "conv_kernel", "linear_k_heads", "head_dim"),
    "conv_k": ("layers", "conv_kernel", "linear_k_heads", "head_dim"),
    "conv_v": ("layers", "conv_kernel", "linear_v_heads", "head_dim"),
    "a_log": ("layers", "linear_v_heads"),
    "dt_bias": ("layers", "linear_v_heads"),
    "out_norm": ("layers", "norm"),
    "wo": ("layers", "linear_v_heads", "head_dim", "embed"),
}
# transformers' l2norm epsilon (inside the square root).
_L2_EPS = 1e-6


class State(NamedTuple):
  """What a sequence carries from one token to the next.

  conv_q, conv_k: [B, K - 1, Hk, Dk] the last K - 1 projected (unconvolved)
    queries and keys, zeros before the first token; in the compute dtype.
  conv_v: [B, K - 1, Hv, Dv] the same for the values.
  recurrent: float32 [B, Hv, Dk, Dv] the delta rule's state S.
  """

  conv_q: jax.Array
  conv_k: jax.Array
  conv_v: jax.Array
  recurrent: jax.Array


def _dims(config: model_config.ModelConfig) -> tuple[int, int, int, int, int]:
  """(Hk, Hv, Dk, Dv, K), checked.

  Raises:
    ValueError: Hv not a multiple of Hk, or a non-positive size.
  """
  hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
  dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
  kernel = config.linear_conv_kernel_dim
  for name, value in (
      ("linear_num_key_heads", hk),
      ("linear_num_value_heads", hv),
      ("linear_key_head_dim", dk),
      ("linear_value_head_dim", dv),
      ("linear_conv_kernel_dim", kernel),
  ):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"config.{name}={value!r}: must be a positive int")
  if hv % hk:
    raise ValueError(
        f"config.linear_num_value_heads={hv} must be a multiple of "
        f"config.linear_num_key_heads={hk}"
    )
  return hk, hv, dk, dv, kernel


def init_params(
    config: model_config.ModelConfig,
    num_layers: int,
    normal: Callable[[tuple[int, ...], int], jax.Array],
    dtype,
) -> dict[str, jax.Array]:
  """The Gated DeltaNet parameters of `num_layers` stacked layers.

  Matrices and convolution kernels come from `normal(shape, fan_in)` (draws
  in the order wq, wk, wv, wz, wa, wb, conv_q, conv_k, conv_v, wo; a
  kernel's fan-in is K, as a depthwise convolution's). As transformers
  initialises them: dt_bias 1, out_norm 1, and a_log = log A with A spread
  over [1, 16] across the value heads (transformers draws A uniformly from
  [0.01, 16]; evenly spread values need no key and give every layer the
  same range of decay rates).

  Args:
    config: the fields the module docstring lists.
    num_layers: layers in the stack.
    normal: `normal(shape, fan_in)` draws a scaled truncated normal.
    dtype: dtype of the vectors (a_log, dt_bias, out_norm).

  Returns:
    name -> array, the shapes in the module docstring.
  """
  hk, hv, dk, dv, kernel = _dims(config)
  l, e = num_layers, config.emb_dim
  params = {
      "wq": normal((l, e, hk, dk), e),
      "wk": normal((l, e, hk, dk), e),
      "wv": normal((l, e, hv, dv), e),
      "wz": normal((l, e, hv, dv), e),
      "wa": normal((l, e, hv), e),
      "wb": normal((l, e, hv), e),
      "conv_q": normal((l, kernel, hk, dk), kernel),
      "conv_k": normal((l, kernel, hk, dk), kernel),
      "conv_v": normal((l, kernel, hv, dv), kernel),
  }
  params["wo"] = normal((l, hv, dv, e), hv * dv)
  a_log = np.log(np.linspace(1.0, 16.0, hv, dtype=np.float64))
  params["a_log"] = jnp.broadcast_to(jnp.asarray(a_log, dtype), (l, hv))
  params["dt_bias"] = jnp.ones((l, hv), dtype)
  params["out_norm"] = jnp.ones((l, dv), dtype)
  return params


def init_state(config: model_config.ModelConfig, batch: int, dtype) -> State:
  """The state before a sequence's first token: zeros.

  Args:
    config: the fields the module docstring lists.
    batch: B.
    dtype: the compute dtype (the convolution windows'); the recurrent
      state is float32.
  """
  hk, hv, dk, dv, kernel = _dims(config)
  return State(
      conv_q=jnp.zeros((batch, kernel - 1, hk, dk), dtype),
      conv_k=jnp.zeros((batch, kernel - 1, hk, dk), dtype),
      conv_v=jnp.zeros((batch, kernel - 1, hv, dv), dtype),
      recurrent=jnp.zeros((batch, hv, dk, dv), jnp.float32),
  )


def state_bytes(config: model_config.ModelConfig, dtype) -> int:
  """Bytes of one sequence's `State` (`init_state`'s arrays for one row):
  the convolution windows in `dtype`, the recurrent state in float32."""
  hk, hv, dk, dv, kernel = _dims(config)
  windows = (kernel - 1) * (2 * hk * dk + hv * dv) * jnp.dtype(dtype).itemsize
  return windows + hv * dk * dv * jnp.dtype(jnp.float32).itemsize


def _causal_conv(
    x: jax.Array,
    weight: jax.Array,
    window: jax.Array,
    segment_ids: Optional[jax.Array] = None,
    lengths: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array]:
  """SiLU of the depthwise causal convolution, and the next window.

  out_t = SiLU(sum_i weight[i] x_{t - (K - 1) + i}), with the K - 1 inputs
  before x taken from `window`: K shifted multiply-adds, in float32. With
  segment ids an input of another sequence than token t's counts as 0
  (the window continues x's first sequence).

  Args:
    x: [B, S, H, D] inputs.
    weight: [K, H, D] per-channel kernels.
    window: [B, K - 1, H, D] the inputs before x.
    segment_ids: int [B, S] packed-sequence ids (`reset_points`), or None.
    lengths: int [B], how many of each row's inputs are real (the rest is
      padding after them); the next window ends at the last real one.
      None: all S.

  Returns:
    (out [B, S, H, D] in x's dtype, the last K - 1 inputs [B, K - 1, H, D]).
  """
  kernel, seq = weight.shape[0], x.shape[1]
  full = jnp.concatenate([window.astype(x.dtype), x], axis=1)
  full32, w32 = full.astype(jnp.float32), weight.astype(jnp.float32)
  if segment_ids is None:
    out = sum(full32[:, i : i + seq] * w32[i] for i in range(kernel))
  else:
    ids = jnp.concatenate(
        [jnp.repeat(segment_ids[:, :1], kernel - 1, axis=1), segment_ids], 1
    )
    out = sum(
        jnp.where(
            (ids[:, i : i + seq] == segment_ids)[..., None, None],
            full32[:, i : i + seq],
            0.0,
        )
        * w32[i]
        for i in range(kernel)
    )
  if lengths is None:
    new_window = full[:, full.shape[1] - (kernel - 1) :]
  else:
    # Row b's last K - 1 real inputs are full[b, n_b : n_b + K - 1].
    index = lengths[:, None] + jnp.arange(kernel - 1)
    new_window = jnp.take_along_axis(
        full, index.reshape(index.shape + (1,) * (full.ndim - 2)), axis=1
    )
  return jax.nn.silu(out).astype(x.dtype), new_window


def _l2_normalize(x: jax.Array) -> jax.Array:
  """x * rsqrt(sum x^2 + 1e-6) over the last axis, in float32."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _L2_EPS)


def _split_groups(
    v: jax.Array, g: jax.Array, beta: jax.Array, hk: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Value-head arrays with the head axis split (Hv -> [Hk, G]).

  Value head h = key head h // G, group member h % G (transformers'
  `repeat_interleave` of the keys), so the keys need no copy per group.

  Args:
    v: [B, T, Hv, Dv]; g, beta: [B, T, Hv].
    hk: Hk.

  Returns:
    float32 v [B, T, Hk, G, Dv], g and beta [B, T, Hk, G].
  """
  b, t, hv = g.shape
  split = (b, t, hk, hv // hk)
  f32 = jnp.float32
  return (
      v.astype(f32).reshape(split + v.shape[-1:]),
      g.astype(f32).reshape(split),
      beta.astype(f32).reshape(split),
  )


def _grouped_state(state: Optional[jax.Array], shape) -> jax.Array:
  """float32 [B, Hv, Dk, Dv] (None: zeros) -> [B, Hk, G, Dk, Dv]."""
  if state is None:
    return jnp.zeros(shape, jnp.float32)
  return state.astype(jnp.float32).reshape(shape)


def reset_points(segment_ids: jax.Array) -> jax.Array:
  """bool [B, T]: where a packed sequence starts (its id differs from the
  token before's); never at the first token, which continues the state
  passed in. A sequence is a run of equal ids, as `layers.same_segment`
  reads them."""
  return jnp.concatenate(
      [
          jnp.zeros_like(segment_ids[:, :1], jnp.bool_),
          segment_ids[:, 1:] != segment_ids[:, :-1],
      ],
      axis=1,
  )


def _unit_lower_inverse(a: jax.Array) -> jax.Array:
  """(I + a)^-1 of strictly lower triangular [..., C, C] matrices, by matmuls.

  a is nilpotent (a^C = 0), so (I + a)^-1 = sum_{m < C} (-a)^m
  = (I - a)(I + a^2)(I + a^4)...(I + a^(2^(n-1))) with 2^n >= C: 2(n - 1)
  batched matmuls, which XLA keeps on the matrix units. A batched
  triangular solve is a LAPACK call per block on the CPU: with it the
  chunked rule took 1,080 ms instead of 19 ms at 1,024 tokens (64-token
  chunks, 4 value heads of 128) on a loaded 2-core host.
  """
  c = a.shape[-1]
  inverse = jnp.eye(c, dtype=a.dtype) - a
  power = a
  for _ in range(max(c - 1, 1).bit_length() - 1):
    power = power @ power
    inverse = inverse + inverse @ power
  return inverse


def chunked_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    chunk_size: int,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array]:
  """The gated delta rule over a sequence, `chunk_size` tokens at a time.

  Within a chunk (positions i, j; Gc_i the cumulative sum of g from the
  chunk's start to i; S0 the state before the chunk) the tokens' updates
  u_i = beta_i (v_i - (decayed state before i)^T k_i) solve the unit lower
  triangular system
    u_i + sum_{j < i} beta_i exp(Gc_i - Gc_j) (k_i . k_j) u_j
        = beta_i v_i - beta_i exp(Gc_i) S0^T k_i,
  so u = U - W S0 with U, W the solutions for the right-hand sides
  beta v and beta exp(Gc) k, computed for every chunk at once with the
  system's inverse (`_unit_lower_inverse`, matmuls only). The chunks
  are then joined by a scan over S0:
    o_i  = exp(Gc_i) S0^T q_i + sum_{j <= i} exp(Gc_i - Gc_j) (q_i . k_j) u_j
    S0'  = exp(Gc_C) S0 + sum_j exp(Gc_C - Gc_j) k_j u_j^T.
  A sequence that is not a multiple of `chunk_size` is zero-padded at the
  end: a padded token has beta 0 and g 0, so it changes no state.

  Packed rows (`segment_ids`) restart the state at zero where a sequence
  starts (`reset_points`). Within a chunk that is exact masking, not a
  large negative decay (which would cost float32 precision in the
  cumulative sums): exp(Gc_i - Gc_j) is 0 for j of another sequence than i;
  the chunk-start state reaches only the tokens of the sequence it belongs
  to (exp(Gc_i) is 0 after a start in the chunk); a token writes into the
  chunk-end state only when it belongs to the chunk's last sequence.

  Args:
    q: [B, T, Hk, Dk] queries, normalised and scaled.
    k: [B, T, Hk, Dk] keys, normalised.
    v: [B, T, Hv, Dv] values.
    g: [B, T, Hv] log decays (<= 0).
    beta: [B, T, Hv] update strengths in [0, 1].
    chunk_size: C >= 1.
    initial_state: float32 [B, Hv, Dk, Dv] S before the first token; None =
      zeros.
    segment_ids: int [B, T] packed-sequence ids, or None (one sequence).

  Returns:
    (o float32 [B, T, Hv, Dv], the state after the last token float32
    [B, Hv, Dk, Dv]).

  Raises:
    ValueError: a chunk_size below 1.
  """
  if not isinstance(chunk_size, int) or chunk_size < 1:
    raise ValueError(f"chunk_size={chunk_size!r}: must be a positive int")
  b, t, hk, dk = k.shape
  hv, dv = v.shape[-2:]
  c = chunk_size
  f32 = jnp.float32
  v, g, beta = _split_groups(v, g, beta, hk)
  pad = -t % c
  n = (t + pad) // c

  def chunks(x):
    # [B, T, ...] -> [B, N, C, ...], zeros after the last token.
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape((b, n, c) + x.shape[2:])

  q, k = chunks(q.astype(f32)), chunks(k.astype(f32))  # [B,N,C,Hk,Dk]
  v = chunks(v)  # [B, N, C, Hk, G, Dv]
  g, beta = chunks(g), chunks(beta)  # [B, N, C, Hk, G]
  xs = _chunk_terms(q, k, v, g, beta, segment_ids, pad)
  state0 = _grouped_state(initial_state, (b, hk, hv // hk, dk, dv))
  state, out = jax.lax.scan(_join_chunk, state0, xs)
  # [N, B, Hk, G, C, Dv] -> [B, N * C, Hv, Dv], the padding dropped.
  out = jnp.transpose(out, (1, 0, 4, 2, 3, 5)).reshape(b, n * c, hv, dv)
  return out[:, :t], state.reshape(b, hv, dk, dv)


def _chunk_masks(segment_ids, b: int, n: int, c: int, pad: int):
  """Which token pairs and states of `chunked_delta_rule`'s chunks connect.

  Returns:
    (causal: bool, j <= i within a chunk and, with `segment_ids`, of one
    sequence, [C, C] or [B, N, 1, 1, C, C]; carry: the tokens that see the
    state before their chunk; to_end: the tokens that write into the state
    after it). Without `segment_ids`, every token does both.
  """
  causal = np.tril(np.ones((c, c), bool))
  # Which tokens see the state before their chunk (`carry`), and which
  # write into the state after it (`to_end`): all, unless rows are packed.
  carry = to_end = np.ones((c,), bool)
  if segment_ids is not None:
    ids = jnp.pad(segment_ids, [(0, 0), (0, pad)], mode="edge")
    before = jnp.concatenate([ids[:, :1], ids[:, :-1]], axis=1)
    ids = ids.reshape(b, n, c)
    before = before.reshape(b, n, c)[:, :, :1]
    causal = causal & (ids[..., :, None] == ids[..., None, :])[:, :, None, None]
    carry = (ids == before)[:, :, None, None]  # [B, N, 1, 1, C]
    to_end = (ids == ids[..., -1:])[:, :, None, None]
  return causal, carry, to_end


def _chunk_terms(q, k, v, g, beta, segment_ids, pad: int):
  """Every chunk's terms of `chunked_delta_rule`, solved within the chunk.

  Args:
    q, k: float32 [B, N, C, Hk, Dk].
    v: [B, N, C, Hk, G, Dv].
    g, beta: [B, N, C, Hk, G].
    segment_ids: int [B, T] packed-sequence ids, or None.
    pad: the zero tokens after the last (T + pad = N * C).

  Returns:
    The scan's inputs over N (chunks first): U and W (the updates' parts
    without and with the chunk-start state), the queries and keys that
    read and write that state, the chunk's scores, and its whole decay.
  """
  dv = v.shape[-1]
  # Per chunk and head, positions last: [B, N, Hk, G, C].
  cum = jnp.cumsum(jnp.moveaxis(g, 2, -1), axis=-1)
  beta_c = jnp.moveaxis(beta, 2, -1)
  b, n, c = q.shape[:3]
  causal, carry, to_end = _chunk_masks(segment_ids, b, n, c, pad)
  # exp(Gc_i - Gc_j) for j <= i, 0 above the diagonal: [B,N,Hk,G,C,C].
  # The mask goes before the exp, where Gc_i - Gc_j > 0 could overflow.
  decay = jnp.exp(
      jnp.where(causal, cum[..., :, None] - cum[..., None, :], -jnp.inf)
  )
  kk = jnp.einsum("bnihd,bnjhd->bnhij", k, k)[:, :, :, None]
  qk = jnp.einsum("bnihd,bnjhd->bnhij", q, k)[:, :, :, None]
  strictly_lower = np.tril(np.ones((c, c), bool), -1)
  system = jnp.where(strictly_lower, beta_c[..., None] * kk * decay, 0.0)
  scores = qk * decay  # [B, N, Hk, G, C, C]
  # Right-hand sides beta v and beta exp(Gc) k, solved together.
  v_beta = jnp.moveaxis(v, 2, -2) * beta_c[..., None]  # [B,N,Hk,G,C,Dv]
  k_t = jnp.moveaxis(k, 2, -2)[:, :, :, None]  # [B, N, Hk, 1, C, Dk]
  from_start = jnp.where(carry, jnp.exp(cum), 0.0)  # exp(Gc_i), masked
  k_beta = k_t * (beta_c * from_start)[..., None]  # [B,N,Hk,G,C,Dk]
  solved = jnp.einsum(
      "bnhgij,bnhgjd->bnhgid",
      _unit_lower_inverse(system),
      jnp.concatenate([v_beta, k_beta], axis=-1),
  )
  u_part, w_part = solved[..., :dv], solved[..., dv:]
  q_read = jnp.moveaxis(q, 2, -2)[:, :, :, None] * from_start[..., None]
  k_write = (
      k_t * jnp.where(to_end, jnp.exp(cum[..., -1:] - cum), 0.0)[..., None]
  )
  chunk_decay = from_start[..., -1:, None]  # [B, N, Hk, G, 1, 1]
  k_write = jnp.broadcast_to(k_write, w_part.shape)
  return tuple(
      jnp.moveaxis(x, 1, 0)
      for x in (u_part, w_part, q_read, k_write, scores, chunk_decay)
  )


def _join_chunk(state, xs):
  """One chunk of `chunked_delta_rule`'s scan: its outputs and end state
  from the state S0 before it."""
  u_c, w_c, q_c, k_c, scores_c, decay_c = xs
  u = u_c - jnp.einsum("bhgcd,bhgde->bhgce", w_c, state)
  out = jnp.einsum("bhgcd,bhgde->bhgce", q_c, state) + jnp.einsum(
      "bhgij,bhgje->bhgie", scores_c, u
  )
  state = state * decay_c + jnp.einsum("bhgcd,bhgce->bhgde", k_c, u)
  return state, out


def recurrent_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: Optional[jax.Array] = None,
    segment_ids: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array]:
  """The gated delta rule token by token (a `lax.scan` over T).

  S = exp(g_t) S; S = S + k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t;
  with segment ids S is first set to 0 where a sequence starts
  (`reset_points`).

  Args and returns: as `chunked_delta_rule`, without chunk_size.
  """
  b, t, hk, dk = k.shape
  hv, dv = v.shape[-2:]
  f32 = jnp.float32
  v, g, beta = _split_groups(v, g, beta, hk)

  keep = jnp.ones((b, t), f32)
  if segment_ids is not None:
    keep = jnp.where(reset_points(segment_ids), 0.0, 1.0)

  def token(state, xs):
    q_t, k_t, v_t, g_t, beta_t, keep_t = xs
    decay = jnp.exp(g_t) * keep_t[:, None, None]
    state = state * decay[..., None, None]
    predicted = jnp.einsum("bhgde,bhd->bhge", state, k_t)
    delta = (v_t - predicted) * beta_t[..., None]
    state = state + jnp.einsum("bhd,bhge->bhgde", k_t, delta)
    return state, jnp.einsum("bhgde,bhd->bhge", state, q_t)

  xs = tuple(
      jnp.moveaxis(x, 1, 0)
      for x in (q.astype(f32), k.astype(f32), v, g, beta, keep)
  )
  state0 = _grouped_state(initial_state, (b, hk, hv // hk, dk, dv))
  state, out = jax.lax.scan(token, state0, xs)
  out = jnp.moveaxis(out, 0, 1).reshape(b, t, hv, dv)
  return out, state.reshape(b, hv, dk, dv)


def apply(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    state: Optional[State] = None,
    *,
    recurrent: bool = False,
    segment_ids: Optional[jax.Array] = None,
    lengths: Optional[jax.Array] = None,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> tuple[jax.Array, Optional[State]]:
  """One Gated DeltaNet layer over a sequence.

  The intermediates carry the grouped-query attention's `checkpoint_name`
  tags ("query", "key", "value", "context", "attn_out"), so the remat
  policies keep the same things.

  Args:
    x: [B, S, E] normalised input, in the compute dtype.
    layer: one layer's parameters (the module docstring's, without L).
    config: the fields the module docstring lists.
    state: the `State` before x (a prefix already run); None = the start
      of the sequences.
    recurrent: run the delta rule token by token (`recurrent_delta_rule`)
      instead of in chunks of `config.linear_chunk_size`: the same result,
      slower; for comparisons.
    segment_ids: int [B, S] ids of the sequences packed in each row
      (`reset_points`): the convolutions and the recurrent state restart at
      each sequence's start, so each sequence's output is its output alone.
      None: each row is one sequence.
    lengths: int [B]: row b's first lengths[b] tokens are real and the rest
      padding (a decoder's right-padded prompts, its idle slots with 0):
      the returned state is the state after the real tokens (padding has
      decay 0 and strength 0, so it changes no recurrent state, and the
      convolution windows end at the last real token). The outputs at
      padding are not meaningful. None: every token is real.
    mesh: the mesh the program is compiled for, or None. With a "context"
      axis x and `segment_ids` are in its zig-zag layout (`zigzag`) and the
      rule runs across it (`_context_delta_rule`); then `state`, `lengths`
      and `recurrent` must be left out (training starts every row at zero).

  Returns:
    (out [B, S, E] in x's dtype, the `State` after x; None on a mesh with a
    context axis, where no state is carried on).

  Raises:
    ValueError: a context axis with a state, lengths or `recurrent`.
  """
  dk = _dims(config)[2]
  cdt = x.dtype
  tag = jax.ad_checkpoint.checkpoint_name

  def project(name, spec):
    return jnp.einsum(spec, x, layer[name].astype(cdt))

  if mesh_lib.context_size(mesh) > 1:
    if state is not None or lengths is not None or recurrent:
      raise ValueError(
          "gated_deltanet.apply: a state, lengths or recurrent=True with "
          "context parallelism (training only)"
      )
    out = _apply_across_context(project, x, layer, config, mesh, segment_ids)
    return out, None
  if state is None:
    state = init_state(config, x.shape[0], cdt)
  (q, conv_q), (k, conv_k), (v, conv_v) = _convolved(
      project, layer, state, segment_ids, lengths
  )
  q = tag(_l2_normalize(q) * dk**-0.5, "query")
  k = tag(_l2_normalize(k), "key")
  v = tag(v, "value")
  g, beta = _decays(project, layer, lengths, x.shape[1])
  out, recurrent_state = _delta_rule(
      q, k, v, g, beta, state.recurrent, segment_ids, recurrent, config
  )
  out = _output(out, project, layer, config, cdt)
  return out, State(conv_q, conv_k, conv_v, recurrent_state)


def _delta_rule(
    q,
    k,
    v,
    g,
    beta,
    initial_state,
    segment_ids,
    recurrent,
    config: model_config.ModelConfig,
):
  """`recurrent_delta_rule` when `recurrent`, else `chunked_delta_rule` in
  chunks of `config.linear_chunk_size`."""
  if recurrent:
    return recurrent_delta_rule(q, k, v, g, beta, initial_state, segment_ids)
  return chunked_delta_rule(
      q,
      k,
      v,
      g,
      beta,
      int(config.linear_chunk_size),
      initial_state,
      segment_ids,
  )


def _apply_across_context(
    project, x, layer, config: model_config.ModelConfig, mesh, segment_ids
):
  """`apply` with the rows split over the mesh's context axis (no state)."""
  out = _context_delta_rule(
      *_tagged_projections(project),
      *_decays(project, layer, None, x.shape[1]),
      layer,
      config,
      mesh,
      segment_ids,
  )
  return _output(out, project, layer, config, x.dtype)


def _convolved(project, layer, state: State, segment_ids, lengths):
  """((q, its window), (k, ...), (v, ...)): the projections after their
  causal convolutions, each with its convolution window after x."""
  return tuple(
      _causal_conv(
          project(name, "bse,ehd->bshd"),
          layer[conv],
          window,
          segment_ids,
          lengths,
      )
      for name, conv, window in (
          ("wq", "conv_q", state.conv_q),
          ("wk", "conv_k", state.conv_k),
          ("wv", "conv_v", state.conv_v),
      )
  )


def _tagged_projections(project) -> tuple[jax.Array, jax.Array, jax.Array]:
  """q, k, v [B, S, H, D] projected from the input (`project`), before the
  convolutions, with the attention's checkpoint names."""
  tag = jax.ad_checkpoint.checkpoint_name
  return tuple(
      tag(project(name, "bse,ehd->bshd"), tag_name)
      for name, tag_name in (("wq", "query"), ("wk", "key"), ("wv", "value"))
  )


def _decays(project, layer, lengths, seq_len) -> tuple[jax.Array, jax.Array]:
  """float32 (g, beta) [B, S, Hv] from the input's projections `project`;
  zero at padding (`apply`'s lengths)."""
  f32 = jnp.float32
  a = project("wa", "bse,eh->bsh").astype(f32)
  b = project("wb", "bse,eh->bsh").astype(f32)
  g = -jnp.exp(layer["a_log"].astype(f32)) * jax.nn.softplus(
      a + layer["dt_bias"].astype(f32)
  )
  beta = jax.nn.sigmoid(b)
  if lengths is not None:
    real = (jnp.arange(seq_len) < lengths[:, None])[..., None]
    g, beta = jnp.where(real, g, 0.0), jnp.where(real, beta, 0.0)
  return g, beta


def _output(
    out, project, layer, config: model_config.ModelConfig, cdt
) -> jax.Array:
  """The layer's output [B, S, E] from the rule's o [B, S, Hv, Dv]: the
  gated RMSNorm and the output projection."""
  tag = jax.ad_checkpoint.checkpoint_name
  out = tag(out, layers.CONTEXT_NAME)
  z = project("wz", "bse,ehd->bshd").astype(jnp.float32)
  normed = layers.rms_norm(out, layer["out_norm"], config.norm_epsilon)
  gated = (normed * jax.nn.silu(z)).astype(cdt)
  return tag(
      jnp.einsum("bshd,hde->bse", gated, layer["wo"].astype(cdt)), "attn_out"
  )


def _context_delta_rule(
    q, k, v, g, beta, layer, config: model_config.ModelConfig, mesh, segment_ids
) -> jax.Array:
  """The convolutions and the delta rule with each row's tokens split
  over the mesh's context axis (C devices, the zig-zag layout).

  In `shard_map`, each device holds two chunks of L = S / 2C tokens of its
  rows (`context_recurrence`). Each chunk's convolution reads the last
  K - 1 inputs of the chunk before it (`context_recurrence.halo`), so the
  convolved q, k, v equal the whole row's. The delta rule then runs twice
  per chunk: first from a zero state, with K identity columns appended to
  the values' state (their values 0), which gives the chunk's end state B
  and, in the appended columns, its transition T (the columns of a linear
  map's image of the identity); the states at the chunks' starts follow
  from every device's (T, B) (`context_recurrence.start_states`), and the
  second run from them gives the outputs. Against one device the rule's
  work is about 2 + Dk / Dv times, spread over C devices; the bytes moved
  per layer are each chunk's (T, B), 2C x Hv x Dk x (Dk + Dv) float32 per
  row, and 2C x (K - 1) tokens of halo, independent of the row's length.

  Args:
    q, k: [B, S, Hk, Dk] the projections before the convolutions.
    v: [B, S, Hv, Dv] the same.
    g, beta: float32 [B, S, Hv] log decays and strengths.
    layer: the layer's parameters (the convolution kernels).
    config: the fields the module docstring lists.
    mesh: the mesh, with a context axis of C > 1 devices.
    segment_ids: int [B, S] packed-sequence ids, or None.

  Returns:
    float32 o [B, S, Hv, Dv], in the zig-zag layout.

  Raises:
    ValueError: a chunk of a row (S / 2C tokens) shorter than K - 1.
  """
  hk, hv, dk, dv, kernel = _dims(config)
  context = mesh_lib.context_size(mesh)
  seq = q.shape[1]
  if seq % (2 * context) or seq // (2 * context) < kernel - 1:
    raise ValueError(
        f"gated_deltanet with context_parallelism={context}: a {seq}-token "
        f"row must split into {2 * context} equal chunks of at least "
        f"linear_conv_kernel_dim - 1 = {kernel - 1} tokens"
    )
  heads = _context_heads(mesh, hk, hv)
  P = jax.sharding.PartitionSpec
  batch, axis = mesh_lib.batch_axes(mesh), mesh_lib.CONTEXT_AXIS
  spec, row_spec = P(batch, axis, heads), P(batch, axis)
  conv_spec = P(None, heads)
  local = functools.partial(
      _context_local,
      kernel=kernel,
      context=context,
      dk=dk,
      dv=dv,
      chunk_size=int(config.linear_chunk_size),
  )
  args = [q, k, v, g, beta, layer["conv_q"], layer["conv_k"], layer["conv_v"]]
  specs = [spec] * 3 + [spec] * 2 + [conv_spec] * 3
  if segment_ids is not None:
    args.append(segment_ids)
    specs.append(row_spec)
  return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=tuple(specs),
      out_specs=spec,
      check_vma=False,
  )(*args)


def _context_heads(mesh, hk: int, hv: int) -> Optional[str]:
  """The mesh axis the heads split over: the tensor axis where it divides
  both head counts, else none."""
  tensor = mesh_lib.TENSOR_AXIS
  return (
      tensor
      if tensor in mesh.axis_names
      and hk % mesh.shape[tensor] == 0
      and hv % mesh.shape[tensor] == 0
      else None
  )


def _context_local(
    q,
    k,
    v,
    g,
    beta,
    conv_q,
    conv_k,
    conv_v,
    *ids,
    kernel,
    context,
    dk,
    dv,
    chunk_size,
):
  """`_context_delta_rule` on one device's blocks (`ids`: the segment ids'
  block when rows are packed, else nothing)."""
  b, two_l = q.shape[:2]
  packed = bool(ids)
  ids = context_recurrence.pieces(ids[0]) if packed else None
  convolve = functools.partial(
      _context_convolve, ids=ids, kernel=kernel, context=context
  )
  q = _l2_normalize(convolve(q, conv_q)) * dk**-0.5
  k = _l2_normalize(convolve(k, conv_k))
  v = convolve(v, conv_v)
  g, beta = (
      context_recurrence.pieces(a).reshape((2 * b, -1) + a.shape[2:])
      for a in (g, beta)
  )
  flat_ids = None if ids is None else ids.reshape(2 * b, -1)
  starts = _context_start_states(
      q, k, v, g, beta, ids, flat_ids, context, dk, dv, chunk_size
  )
  out, _ = chunked_delta_rule(
      q,
      k,
      v,
      g,
      beta,
      chunk_size,
      starts.reshape((2 * b,) + starts.shape[2:]),
      flat_ids,
  )
  return out.reshape((b, two_l) + out.shape[2:])


def _context_convolve(x, weight, *, ids, kernel: int, context: int):
  """A device's chunks' causal convolution, each chunk after its halo (the
  pieces folded into the batch; `ids`: their segment ids, or None)."""
  x = context_recurrence.pieces(x)
  full = jnp.concatenate(
      [context_recurrence.halo(x, kernel - 1, context), x], axis=2
  )
  full = full.reshape((-1,) + full.shape[2:])
  full_ids = None
  if ids is not None:
    full_ids = jnp.concatenate(
        [context_recurrence.halo(ids, kernel - 1, context), ids], axis=2
    ).reshape(full.shape[:2])
  window = jnp.zeros((full.shape[0], kernel - 1) + x.shape[3:], x.dtype)
  out, _ = _causal_conv(full, weight, window, full_ids)
  return out[:, kernel - 1 :]


def _context_start_states(
    q, k, v, g, beta, ids, flat_ids, context, dk, dv, chunk_size
):
  """The states at a device's two chunks' starts (`_context_delta_rule`).

  A first run of the rule from a zero state with Dk identity columns
  appended gives each chunk's (transition T, end state B); the starts
  follow from every device's (`context_recurrence.start_states`).
  """
  two_b, _, local_hv = v.shape[:3]
  b = two_b // 2
  # Zero values and identity start columns: the transition T.
  eye = jnp.broadcast_to(
      jnp.eye(dk, dtype=jnp.float32), (2 * b, local_hv, dk, dk)
  )
  augmented = jnp.concatenate([v, jnp.zeros(v.shape[:3] + (dk,), v.dtype)], -1)
  start = jnp.concatenate(
      [jnp.zeros((2 * b, local_hv, dk, dv), jnp.float32), eye], -1
  )
  _, end = chunked_delta_rule(
      q, k, augmented, g, beta, chunk_size, start, flat_ids
  )
  end = end.reshape((b, 2) + end.shape[1:])
  keep = jnp.ones((b, 2), jnp.float32)
  if ids is not None:
    before = context_recurrence.halo(ids, 1, context)[:, :, 0]
    keep = (ids[:, :, 0] == before).astype(jnp.float32)
  return context_recurrence.start_states(
      end[..., dv:], end[..., :dv], keep, context
  )


def step(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    state: State,
) -> tuple[jax.Array, State]:
  """One decoding step: the layer on one token per sequence.

  Args:
    x: [B, E] normalised input of the new tokens, in the compute dtype.
    layer: one layer's parameters.
    config: the fields the module docstring lists.
    state: the `State` after the tokens before.

  Returns:
    (out [B, E] in x's dtype, the `State` after the new tokens).
  """
  out, state = apply(x[:, None], layer, config, state, recurrent=True)
  return out[:, 0], state
