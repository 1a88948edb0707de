"""Mixture-of-experts feed-forward layer: router, sorted dispatch, balance loss.

A router scores every token against `num_experts` experts and sends it to its
top `num_experts_per_token`; each expert is a SwiGLU MLP of width
`moe_mlp_dim`. The routed computation never forms a dense
[tokens, experts, ...] product: the (token, expert) assignments are sorted by
expert and each expert's contiguous rows are multiplied by its own weights
with `jax.lax.ragged_dot`. Optional shared experts (`num_shared_experts`) see
every token; they are one SwiGLU MLP of width num_shared * moe_mlp_dim, which
is the sum of that many experts of width moe_mlp_dim.

Router scores (`router_score`):
  "softmax": probabilities over experts; a token's top-k probabilities are its
    combine weights as they are (Switch Transformer, GShard).
  "sigmoid": independent sigmoid affinities (DeepSeek-V3); the top-k
    affinities, normalised to sum to 1, are the combine weights.

Load-balancing loss (`load_balance_loss`), with f_i the fraction of the
group's (token, expert) assignments that went to expert i and P_i the mean
over the group's tokens of the router's normalised scores for expert i:
  "switch": num_experts * sum_i f_i * P_i over the whole micro-batch (1 when
    routing is uniform).
  "sequence": the same quantity per sequence, averaged over sequences
    (DeepSeek-V3's sequence-wise balance loss).
The assignment fractions carry no gradient; the loss trains the router
through P.

With `capacity_factor` c > 0 each expert takes at most
ceil(c * tokens * k / num_experts) assignments, first come (token order)
first served; the rest are dropped (their expert output is not added, the
residual stream carries the token on) and counted.

Parameter shapes of one stacked MoE block (L MoE layers, E emb_dim,
X num_experts, F moe_mlp_dim, S num_shared_experts):
  router                      [L, E, X]
  w_gate, w_up                [L, X, E, F]
  w_down                      [L, X, F, E]
  shared_w_gate, shared_w_up  [L, E, S * F]   (only when S > 0)
  shared_w_down               [L, S * F, E]   (only when S > 0)
"""

import math
from typing import Callable, Mapping

import jax
import jax.numpy as jnp

from maxtext import choices

# Logical axis names of the MoE parameters (one per dimension).
LOGICAL_AXES = {
    "router": ("layers", "embed", "experts"),
    "w_gate": ("layers", "experts", "embed", "moe_mlp"),
    "w_up": ("layers", "experts", "embed", "moe_mlp"),
    "w_down": ("layers", "experts", "moe_mlp", "embed"),
    "shared_w_gate": ("layers", "embed", "mlp"),
    "shared_w_up": ("layers", "embed", "mlp"),
    "shared_w_down": ("layers", "mlp", "embed"),
}

# Per-layer statistics `moe_mlp` returns, reduced over layers by `summarize`.
STAT_NAMES = (
    "aux_loss",
    "load_max",
    "load_min",
    "load_cv",
    "router_entropy",
    "dropped",
)


def expert_width(config) -> int:
  """Hidden width of one expert: `moe_mlp_dim`, or `mlp_dim` when 0."""
  return config.moe_mlp_dim or config.mlp_dim


def init_params(
    config, num_layers: int, normal: Callable[[tuple[int, ...], int], jax.Array]
) -> dict[str, jax.Array]:
  """The MoE feed-forward parameters of `num_layers` stacked layers.

  Args:
    config: the run configuration (model fields).
    num_layers: layers in the stack.
    normal: `normal(shape, fan_in)` draws a scaled truncated normal.

  Returns:
    name -> array, the shapes in the module docstring.
  """
  l, e, x = num_layers, config.emb_dim, config.num_experts
  f = expert_width(config)
  params = {
      "router": normal((l, e, x), e),
      "w_gate": normal((l, x, e, f), e),
      "w_up": normal((l, x, e, f), e),
      "w_down": normal((l, x, f, e), f),
  }
  if config.num_shared_experts:
    s = config.num_shared_experts * f
    params["shared_w_gate"] = normal((l, e, s), e)
    params["shared_w_up"] = normal((l, e, s), e)
    params["shared_w_down"] = normal((l, s, e), s)
  return params


def route(logits: jax.Array, config) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Router scores and each token's top-k experts.

  Args:
    logits: float32 [T, X] router logits.
    config: `router_score`, `num_experts_per_token`.

  Returns:
    (probs, weights, experts): probs float32 [T, X] the normalised scores
    (each row sums to 1; what the balance loss and the entropy use),
    weights float32 [T, k] the combine weights, experts int32 [T, k].

  Raises:
    ValueError: unknown `router_score`.
  """
  k = config.num_experts_per_token
  if config.router_score == "softmax":
    probs = jax.nn.softmax(logits, axis=-1)
    weights, experts = jax.lax.top_k(probs, k)
  elif config.router_score == "sigmoid":
    scores = jax.nn.sigmoid(logits)
    probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
    top, experts = jax.lax.top_k(scores, k)
    weights = top / jnp.sum(top, axis=-1, keepdims=True)
  else:
    raise ValueError(
        f"config.router_score={config.router_score!r}: must be "
        f"one of {list(choices.ROUTER_SCORES)}"
    )
  return probs, weights, experts


def balance_loss(
    probs: jax.Array, experts: jax.Array, num_experts: int, kind: str
) -> jax.Array:
  """The load-balancing loss (module docstring) of one layer.

  Args:
    probs: float32 [B, S, X] normalised router scores.
    experts: int32 [B, S, k] chosen experts.
    num_experts: X.
    kind: "switch" or "sequence".

  Returns:
    A float32 scalar.

  Raises:
    ValueError: unknown `kind`.
  """
  if kind not in choices.LOAD_BALANCE_LOSSES:
    raise ValueError(
        f"config.load_balance_loss={kind!r}: must be one of "
        f"{list(choices.LOAD_BALANCE_LOSSES)}"
    )
  counts = jnp.sum(
      jax.nn.one_hot(experts, num_experts, dtype=jnp.float32), axis=2
  )  # [B, S, X]
  if kind == "switch":
    fraction = jnp.sum(counts, axis=(0, 1)) / (
        experts.shape[0] * experts.shape[1] * experts.shape[2]
    )
    mean_prob = jnp.mean(probs, axis=(0, 1))
    return num_experts * jnp.sum(jax.lax.stop_gradient(fraction) * mean_prob)
  fraction = jnp.sum(counts, axis=1) / (experts.shape[1] * experts.shape[2])
  mean_prob = jnp.mean(probs, axis=1)  # [B, X]
  per_sequence = num_experts * jnp.sum(
      jax.lax.stop_gradient(fraction) * mean_prob, axis=-1
  )
  return jnp.mean(per_sequence)


def capacity(num_tokens: int, config) -> int:
  """Assignments one expert takes at most; 0 = unlimited."""
  if not config.capacity_factor:
    return 0
  return math.ceil(
      config.capacity_factor
      * num_tokens
      * config.num_experts_per_token
      / config.num_experts
  )


def _swiglu(
    x: jax.Array, layer: Mapping[str, jax.Array], prefix: str
) -> jax.Array:
  cdt = x.dtype
  gate = x @ layer[prefix + "w_gate"].astype(cdt)
  up = x @ layer[prefix + "w_up"].astype(cdt)
  return (jax.nn.silu(gate) * up) @ layer[prefix + "w_down"].astype(cdt)


def moe_mlp(
    x: jax.Array, layer: Mapping[str, jax.Array], config
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The MoE feed-forward layer.

  Args:
    x: [B, S, E] normalised hidden states (compute dtype).
    layer: this layer's parameters (module docstring, without `L`).
    config: the run configuration.

  Returns:
    (out, stats): out [B, S, E] in x's dtype; stats float32 scalars named
    as `STAT_NAMES`: the unweighted balance loss, the max and min over experts
    of the assignment fraction, its coefficient of variation (std / mean),
    the mean router entropy in nats, and the number of dropped assignments.
  """
  b, s, e = x.shape
  cdt = x.dtype
  n, k = config.num_experts, config.num_experts_per_token
  tokens = x.reshape(b * s, e)
  logits = jnp.einsum(
      "te,ex->tx",
      tokens,
      layer["router"].astype(cdt),
      preferred_element_type=jnp.float32,
  )
  probs, weights, experts = route(logits, config)

  # Sorted dispatch: assignment a = token * k + slot; a stable sort by expert
  # keeps token order within each expert (capacity is first come first
  # served).
  flat_experts = experts.reshape(-1)
  order = jnp.argsort(flat_experts, stable=True)
  sorted_experts = flat_experts[order]
  group_sizes = jnp.bincount(flat_experts, length=n).astype(jnp.int32)
  rows = tokens[order // k]
  keep = jnp.ones(order.shape, jnp.bool_)
  cap = capacity(b * s, config)
  if cap:
    starts = jnp.cumsum(group_sizes) - group_sizes
    rank = jnp.arange(order.shape[0]) - starts[sorted_experts]
    keep = rank < cap

  def cast(name):
    return layer[name].astype(cdt)

  gate = jax.lax.ragged_dot(rows, cast("w_gate"), group_sizes)
  up = jax.lax.ragged_dot(rows, cast("w_up"), group_sizes)
  out_sorted = jax.lax.ragged_dot(
      jax.nn.silu(gate) * up, cast("w_down"), group_sizes
  )
  out_sorted = jnp.where(keep[:, None], out_sorted, 0)
  # Back to assignment order, weighted, summed over each token's k slots.
  inverse = jnp.argsort(order)
  per_slot = out_sorted[inverse].reshape(b * s, k, e)
  out = jnp.einsum("tke,tk->te", per_slot, weights.astype(cdt))
  if config.num_shared_experts:
    out = out + _swiglu(tokens, layer, "shared_")

  fraction = group_sizes.astype(jnp.float32) / (b * s * k)
  mean_fraction = 1.0 / n
  entropy = -jnp.sum(probs * jnp.log(jnp.maximum(probs, 1e-30)), axis=-1)
  stats = {
      "aux_loss": balance_loss(
          probs.reshape(b, s, n),
          experts.reshape(b, s, k),
          n,
          config.load_balance_loss,
      ),
      "load_max": jnp.max(fraction),
      "load_min": jnp.min(fraction),
      "load_cv": jnp.std(fraction) / mean_fraction,
      "router_entropy": jnp.mean(entropy),
      "dropped": jnp.sum(~keep).astype(jnp.float32),
  }
  return out.reshape(b, s, e), stats


def summarize(stats: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Reduces per-layer statistics ([L] each) to one scalar per name.

  The balance loss, coefficient of variation and entropy are means over the
  MoE layers; load_max and load_min the extremes over layers; dropped the
  sum over layers.
  """
  return {
      "aux_loss": jnp.mean(stats["aux_loss"]),
      "load_max": jnp.max(stats["load_max"]),
      "load_min": jnp.min(stats["load_min"]),
      "load_cv": jnp.mean(stats["load_cv"]),
      "router_entropy": jnp.mean(stats["router_entropy"]),
      "dropped": jnp.sum(stats["dropped"]),
  }


def dense_reference(
    x: jax.Array, layer: Mapping[str, jax.Array], config
) -> jax.Array:
  """`moe_mlp`'s output computed densely: every expert on every token.

  The straightforward [tokens, experts, moe_mlp] computation the tests check
  `moe_mlp` (values and gradients) against; capacity is applied with a
  cumulative count over the token-major assignment order.
  """
  b, s, e = x.shape
  n = config.num_experts
  tokens = x.reshape(b * s, e)
  logits = jnp.einsum(
      "te,ex->tx",
      tokens,
      layer["router"].astype(x.dtype),
      preferred_element_type=jnp.float32,
  )
  _, weights, experts = route(logits, config)
  chosen = jax.nn.one_hot(experts, n, dtype=jnp.float32)  # [T, k, X]
  cap = capacity(b * s, config)
  if cap:
    flat = chosen.reshape(-1, n)
    position = jnp.cumsum(flat, axis=0) - flat
    chosen = (flat * (position < cap)).reshape(chosen.shape)
  combine = jnp.einsum("tkx,tk->tx", chosen, weights)
  gate = jnp.einsum("te,xef->txf", tokens, layer["w_gate"])
  up = jnp.einsum("te,xef->txf", tokens, layer["w_up"])
  every = jnp.einsum("txf,xfe->txe", jax.nn.silu(gate) * up, layer["w_down"])
  out = jnp.einsum("txe,tx->te", every, combine.astype(x.dtype))
  if config.num_shared_experts:
    out = out + _swiglu(tokens, layer, "shared_")
  return out.reshape(b, s, e)
