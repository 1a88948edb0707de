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

Not here yet: the layer's place in the transformer stack (the layer
pattern), its checkpoint import, and the decoder's cache of `State`s.

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

from typing import Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.model import layers

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


def _dims(config) -> tuple[int, int, int, int, int]:
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
    config,
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


def init_state(config, batch: int, dtype) -> State:
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


def _causal_conv(
    x: jax.Array, weight: jax.Array, window: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """SiLU of the depthwise causal convolution, and the next window.

  out_t = SiLU(sum_i weight[i] x_{t - (K - 1) + i}), with the K - 1 inputs
  before x taken from `window`: K shifted multiply-adds, in float32.

  Args:
    x: [B, S, H, D] inputs.
    weight: [K, H, D] per-channel kernels.
    window: [B, K - 1, H, D] the inputs before x.

  Returns:
    (out [B, S, H, D] in x's dtype, the last K - 1 inputs [B, K - 1, H, D]).
  """
  kernel, seq = weight.shape[0], x.shape[1]
  full = jnp.concatenate([window.astype(x.dtype), x], axis=1)
  full32, w32 = full.astype(jnp.float32), weight.astype(jnp.float32)
  out = sum(full32[:, i : i + seq] * w32[i] for i in range(kernel))
  new_window = full[:, full.shape[1] - (kernel - 1) :]
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

  Args:
    q: [B, T, Hk, Dk] queries, normalised and scaled.
    k: [B, T, Hk, Dk] keys, normalised.
    v: [B, T, Hv, Dv] values.
    g: [B, T, Hv] log decays (<= 0).
    beta: [B, T, Hv] update strengths in [0, 1].
    chunk_size: C >= 1.
    initial_state: float32 [B, Hv, Dk, Dv] S before the first token; None =
      zeros.

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
  # Per chunk and head, positions last: [B, N, Hk, G, C].
  cum = jnp.cumsum(jnp.moveaxis(g, 2, -1), axis=-1)
  beta_c = jnp.moveaxis(beta, 2, -1)
  # exp(Gc_i - Gc_j) for j <= i, 0 above the diagonal: [B,N,Hk,G,C,C].
  # The mask goes before the exp, where Gc_i - Gc_j > 0 could overflow.
  causal = np.tril(np.ones((c, c), bool))
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
  k_beta = k_t * (beta_c * jnp.exp(cum))[..., None]  # [B,N,Hk,G,C,Dk]
  solved = jnp.einsum(
      "bnhgij,bnhgjd->bnhgid",
      _unit_lower_inverse(system),
      jnp.concatenate([v_beta, k_beta], axis=-1),
  )
  u_part, w_part = solved[..., :dv], solved[..., dv:]
  q_read = jnp.moveaxis(q, 2, -2)[:, :, :, None] * jnp.exp(cum)[..., None]
  k_write = k_t * jnp.exp(cum[..., -1:] - cum)[..., None]
  chunk_decay = jnp.exp(cum[..., -1])[..., None, None]  # [B,N,Hk,G,1,1]

  def chunk(state, xs):
    u_c, w_c, q_c, k_c, scores_c, decay_c = xs
    u = u_c - jnp.einsum("bhgcd,bhgde->bhgce", w_c, state)
    out = jnp.einsum("bhgcd,bhgde->bhgce", q_c, state) + jnp.einsum(
        "bhgij,bhgje->bhgie", scores_c, u
    )
    state = state * decay_c + jnp.einsum("bhgcd,bhgce->bhgde", k_c, u)
    return state, out

  k_write = jnp.broadcast_to(k_write, w_part.shape)
  xs = tuple(
      jnp.moveaxis(x, 1, 0)
      for x in (u_part, w_part, q_read, k_write, scores, chunk_decay)
  )
  state0 = _grouped_state(initial_state, (b, hk, hv // hk, dk, dv))
  state, out = jax.lax.scan(chunk, state0, xs)
  # [N, B, Hk, G, C, Dv] -> [B, N * C, Hv, Dv], the padding dropped.
  out = jnp.transpose(out, (1, 0, 4, 2, 3, 5)).reshape(b, n * c, hv, dv)
  return out[:, :t], state.reshape(b, hv, dk, dv)


def recurrent_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array]:
  """The gated delta rule token by token (a `lax.scan` over T).

  S = exp(g_t) S; S = S + k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t.

  Args and returns: as `chunked_delta_rule`, without chunk_size.
  """
  b, t, hk, dk = k.shape
  hv, dv = v.shape[-2:]
  f32 = jnp.float32
  v, g, beta = _split_groups(v, g, beta, hk)

  def token(state, xs):
    q_t, k_t, v_t, g_t, beta_t = xs
    state = state * jnp.exp(g_t)[..., None, None]
    predicted = jnp.einsum("bhgde,bhd->bhge", state, k_t)
    delta = (v_t - predicted) * beta_t[..., None]
    state = state + jnp.einsum("bhd,bhge->bhgde", k_t, delta)
    return state, jnp.einsum("bhgde,bhd->bhge", state, q_t)

  xs = tuple(
      jnp.moveaxis(x, 1, 0) for x in (q.astype(f32), k.astype(f32), v, g, beta)
  )
  state0 = _grouped_state(initial_state, (b, hk, hv // hk, dk, dv))
  state, out = jax.lax.scan(token, state0, xs)
  out = jnp.moveaxis(out, 0, 1).reshape(b, t, hv, dv)
  return out, state.reshape(b, hv, dk, dv)


def apply(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config,
    state: Optional[State] = None,
    *,
    recurrent: bool = False,
) -> tuple[jax.Array, State]:
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

  Returns:
    (out [B, S, E] in x's dtype, the `State` after x).
  """
  dk = _dims(config)[2]
  cdt = x.dtype
  tag = jax.ad_checkpoint.checkpoint_name
  if state is None:
    state = init_state(config, x.shape[0], cdt)

  def project(name, spec):
    return jnp.einsum(spec, x, layer[name].astype(cdt))

  q, conv_q = _causal_conv(
      project("wq", "bse,ehd->bshd"), layer["conv_q"], state.conv_q
  )
  k, conv_k = _causal_conv(
      project("wk", "bse,ehd->bshd"), layer["conv_k"], state.conv_k
  )
  v, conv_v = _causal_conv(
      project("wv", "bse,ehd->bshd"), layer["conv_v"], state.conv_v
  )
  q = tag(_l2_normalize(q) * dk**-0.5, "query")
  k = tag(_l2_normalize(k), "key")
  v = tag(v, "value")
  a = project("wa", "bse,eh->bsh").astype(jnp.float32)
  b = project("wb", "bse,eh->bsh").astype(jnp.float32)
  f32 = jnp.float32
  g = -jnp.exp(layer["a_log"].astype(f32)) * jax.nn.softplus(
      a + layer["dt_bias"].astype(f32)
  )
  beta = jax.nn.sigmoid(b)
  if recurrent:
    out, recurrent_state = recurrent_delta_rule(
        q, k, v, g, beta, state.recurrent
    )
  else:
    out, recurrent_state = chunked_delta_rule(
        q, k, v, g, beta, int(config.linear_chunk_size), state.recurrent
    )
  out = tag(out, "context")
  z = project("wz", "bse,ehd->bshd").astype(f32)
  normed = layers.rms_norm(out, layer["out_norm"], config.norm_epsilon)
  gated = (normed * jax.nn.silu(z)).astype(cdt)
  out = tag(
      jnp.einsum("bshd,hde->bse", gated, layer["wo"].astype(cdt)), "attn_out"
  )
  return out, State(conv_q, conv_k, conv_v, recurrent_state)


def step(
    x: jax.Array, layer: Mapping[str, jax.Array], config, state: State
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
