"""Mixture-of-experts feed-forward layer: router, sorted dispatch, balance loss.

A router scores every token against `num_experts` experts and sends it to its
top `num_experts_per_token`; each expert is a SwiGLU MLP of width
`moe_mlp_dim`. The routed computation never forms a dense
[tokens, experts, ...] product: the (token, expert) assignments are sorted by
expert and each expert's contiguous rows are multiplied by its own weights
with `jax.lax.ragged_dot`. Optional shared experts (`num_shared_experts`) see
every token; they are one SwiGLU MLP of width num_shared * moe_mlp_dim, which
is the sum of that many experts of width moe_mlp_dim (or of width
`shared_expert_mlp_dim` when that is set). With `shared_expert_gate` their
output is scaled per token by sigmoid(x . shared_gate) (Qwen3.5's
shared_expert_gate, a [E] vector per layer).

Router scores (`router_score`):
  "softmax": probabilities over experts; a token's top-k probabilities are its
    combine weights as they are (Switch Transformer, GShard), or renormalised
    to sum to 1 with `router_norm_topk` (Qwen3-MoE's norm_topk_prob).
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

On a mesh of several devices each device routes its own tokens, and the
tokens of one expert group (the devices along the "expert" mesh axis) are
dispatched together: each device computes the assignments to the experts it
holds (`moe_mlp`). One device's tokens never reach another expert group.

With `capacity_factor` c > 0 each expert takes at most
ceil(c * tokens * k / num_experts) assignments of a dispatch group (the
whole micro-batch on one device, one expert group's tokens on a mesh), first
come (token order) first served; the rest are dropped (their expert output
is not added, the residual stream carries the token on) and counted.

Parameter shapes of one stacked MoE block (L MoE layers, E emb_dim,
X num_experts, F moe_mlp_dim, S num_shared_experts):
  router                      [L, E, X]
  router_bias                 [L, X]          (only with `router_bias`)
  w_gate, w_up                [L, X, E, F]
  w_down                      [L, X, F, E]
  shared_w_gate, shared_w_up  [L, E, S * F]   (only when S > 0)
  shared_w_down               [L, S * F, E]   (only when S > 0)
  shared_gate                 [L, E]          (with `shared_expert_gate`)
(S * F is `shared_expert_mlp_dim` when that is > 0.)
"""

import functools
import math
from typing import Callable, Mapping, Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from maxtext.core import choices
from maxtext.model import model_config
from maxtext.runtime import mesh as mesh_lib

# Logical axis names of the MoE parameters (one per dimension).
LOGICAL_AXES = {
    "router": ("layers", "embed", "experts"),
    "router_bias": ("layers", "experts"),
    "w_gate": ("layers", "experts", "embed", "moe_mlp"),
    "w_up": ("layers", "experts", "embed", "moe_mlp"),
    "w_down": ("layers", "experts", "moe_mlp", "embed"),
    "shared_w_gate": ("layers", "embed", "mlp"),
    "shared_w_up": ("layers", "embed", "mlp"),
    "shared_w_down": ("layers", "mlp", "embed"),
    "shared_gate": ("layers", "embed"),
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


def expert_width(config: model_config.ModelConfig) -> int:
  """Hidden width of one expert: `moe_mlp_dim`, or `mlp_dim` when 0."""
  return config.moe_mlp_dim or config.mlp_dim


def shared_width(config: model_config.ModelConfig) -> int:
  """Hidden width of the shared experts together: `shared_expert_mlp_dim`,
  or num_shared_experts x `expert_width` when that is 0."""
  return config.shared_expert_mlp_dim or (
      config.num_shared_experts * expert_width(config)
  )


def init_params(
    config: model_config.ModelConfig,
    num_layers: int,
    normal: Callable[[tuple[int, ...], int], jax.Array],
) -> dict[str, jax.Array]:
  """The MoE feed-forward parameters of `num_layers` stacked layers.

  Args:
    config: the model's config.
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
  if config.router_bias:
    params["router_bias"] = jnp.zeros((l, x), jnp.float32)
  if config.num_shared_experts:
    s = shared_width(config)
    params["shared_w_gate"] = normal((l, e, s), e)
    params["shared_w_up"] = normal((l, e, s), e)
    params["shared_w_down"] = normal((l, s, e), s)
    if config.shared_expert_gate:
      params["shared_gate"] = normal((l, e), e)
  return params


def route(
    logits: jax.Array,
    config: model_config.ModelConfig,
    bias: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Router scores and each token's top-k experts.

  The choice ranks the scores plus `bias` (DeepSeek-V3's correction bias,
  which steers the choice and never the weights); with
  `num_expert_groups` > 1 only the best `expert_groups_per_token` groups
  of consecutive experts are eligible, a group ranked by the sum of its two
  best biased scores. The combine weights are the chosen experts' scores
  (normalised to sum to 1 for "sigmoid", and for "softmax" with
  `router_norm_topk`) times `routed_scaling_factor`.

  Args:
    logits: float32 [T, X] router logits.
    config: `router_score`, `router_norm_topk`, `num_experts_per_token`,
      `num_expert_groups`, `expert_groups_per_token`,
      `routed_scaling_factor`.
    bias: float32 [X] added to the scores for the choice, or None.

  Returns:
    (probs, weights, experts): probs float32 [T, X] the normalised scores
    (each row sums to 1; what the balance loss and the entropy use),
    weights float32 [T, k] the combine weights, experts int32 [T, k].

  Raises:
    ValueError: unknown `router_score`.
  """
  k = config.num_experts_per_token
  if config.router_score == "softmax":
    scores = probs = jax.nn.softmax(logits, axis=-1)
  elif config.router_score == "sigmoid":
    scores = jax.nn.sigmoid(logits)
    probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
  else:
    raise ValueError(
        f"config.router_score={config.router_score!r}: must be "
        f"one of {list(choices.ROUTER_SCORES)}"
    )
  choice = scores if bias is None else scores + bias.astype(scores.dtype)
  _, experts = jax.lax.top_k(_eligible(choice, config), k)
  weights = jnp.take_along_axis(scores, experts, axis=-1)
  if config.router_score == "sigmoid" or config.router_norm_topk:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return probs, weights * config.routed_scaling_factor, experts


def _eligible(choice: jax.Array, config: model_config.ModelConfig) -> jax.Array:
  """`choice` [T, X] with experts outside each token's best groups at -inf."""
  groups = config.num_expert_groups
  if groups <= 1:
    return choice
  t, x = choice.shape
  grouped = choice.reshape(t, groups, x // groups)
  group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [T, G]
  _, best = jax.lax.top_k(group_score, config.expert_groups_per_token)
  keep = jnp.sum(jax.nn.one_hot(best, groups, dtype=jnp.int32), axis=1) > 0
  return jnp.where(keep[:, :, None], grouped, -jnp.inf).reshape(t, x)


def balance_loss(
    probs: jax.Array,
    experts: jax.Array,
    num_experts: int,
    kind: str,
    mean: Callable[[jax.Array], jax.Array] = lambda v: v,
) -> jax.Array:
  """The load-balancing loss (module docstring) of one layer.

  Args:
    probs: float32 [B, S, X] normalised router scores.
    experts: int32 [B, S, k] chosen experts.
    num_experts: X.
    kind: "switch" or "sequence".
    mean: the mean over the devices that each hold an equal part of the
      micro-batch (`jax.lax.pmean` in `shard_map`); the identity when
      `probs` is the whole micro-batch.

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
    fraction = mean(
        jnp.sum(counts, axis=(0, 1))
        / (experts.shape[0] * experts.shape[1] * experts.shape[2])
    )
    mean_prob = mean(jnp.mean(probs, axis=(0, 1)))
    return num_experts * jnp.sum(jax.lax.stop_gradient(fraction) * mean_prob)
  fraction = jnp.sum(counts, axis=1) / (experts.shape[1] * experts.shape[2])
  mean_prob = jnp.mean(probs, axis=1)  # [B, X]
  per_sequence = num_experts * jnp.sum(
      jax.lax.stop_gradient(fraction) * mean_prob, axis=-1
  )
  return mean(jnp.mean(per_sequence))


def capacity(num_tokens: int, config: model_config.ModelConfig) -> int:
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


def _shared(tokens: jax.Array, layer: Mapping[str, jax.Array]) -> jax.Array:
  """The shared experts' output of [T, E] tokens, gated per token by
  sigmoid(tokens . shared_gate) when the layer has that gate."""
  out = _swiglu(tokens, layer, "shared_")
  if "shared_gate" in layer:
    gate = tokens @ layer["shared_gate"].astype(tokens.dtype)
    out = out * jax.nn.sigmoid(gate)[:, None]
  return out


def dispatch(
    tokens: jax.Array,
    weights: jax.Array,
    experts: jax.Array,
    layer: Mapping[str, jax.Array],
    first_expert: jax.Array | int,
    cap: int,
    earlier: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The routed experts' output for a group of tokens, from some experts.

  The experts held are `layer`'s w_gate/w_up/w_down, X_held of them,
  global ids first_expert .. first_expert + X_held - 1; assignments to any
  other expert add nothing here (another device holds that expert). With
  all experts held (first_expert 0) this is the whole routed computation.

  Sorted dispatch: assignment a = token * k + slot; a stable sort by expert
  (other devices' experts last) keeps token order within each expert, so
  capacity is first come first served in the group's token order.
  `jax.lax.ragged_dot` multiplies each expert's contiguous rows by its own
  weights; the rows past the held experts' groups are zero.

  Args:
    tokens: [T, E] the group's tokens (compute dtype).
    weights: float32 [T, k] combine weights.
    experts: int32 [T, k] chosen experts (global ids).
    layer: the held experts' weights, [X_held, ...] each.
    first_expert: the global id of the first held expert.
    cap: assignments one expert takes at most (`capacity`); 0 = unlimited.
    earlier: int32 [X_held] assignments each held expert was given by the
      tokens before these (when a group is dispatched in parts), or None.

  Returns:
    (out, dropped, given): out [T, E] in tokens' dtype, each token's
    combine-weighted sum over its assignments to the held experts; dropped
    the float32 count of those assignments that capacity turned away; given
    int32 [X_held] the assignments to each held expert, dropped or not.
  """
  t, e = tokens.shape
  k = experts.shape[1]
  cdt = tokens.dtype
  held = layer["w_gate"].shape[0]
  local = experts.reshape(-1) - first_expert
  mine = (local >= 0) & (local < held)
  key = jnp.where(mine, local, held)
  order = jnp.argsort(key, stable=True)
  sorted_key = key[order]
  group_sizes = jnp.bincount(key, length=held + 1)[:held].astype(jnp.int32)
  rows = tokens[order // k]
  taken = sorted_key < held
  keep = taken
  if cap:
    starts = jnp.cumsum(group_sizes) - group_sizes
    expert = jnp.minimum(sorted_key, held - 1)
    rank = jnp.arange(order.shape[0]) - starts[expert]
    if earlier is not None:
      rank = rank + earlier[expert]
    keep = taken & (rank < cap)

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
  per_slot = out_sorted[inverse].reshape(t, k, e)
  out = jnp.einsum("tke,tk->te", per_slot, weights.astype(cdt))
  dropped = jnp.sum(taken & ~keep).astype(jnp.float32)
  return out, dropped, group_sizes


def _statistics(
    probs: jax.Array,
    experts: jax.Array,
    dropped: jax.Array,
    config: model_config.ModelConfig,
    mean: Callable[[jax.Array], jax.Array],
    total: Callable[[jax.Array], jax.Array],
) -> dict[str, jax.Array]:
  """`moe_mlp`'s statistics of the whole micro-batch.

  Args:
    probs: float32 [B, S, X] normalised router scores of these tokens.
    experts: int32 [B, S, k] their chosen experts.
    dropped: float32 assignments dropped here.
    config: the model's config.
    mean: the mean over devices holding equal parts of the micro-batch.
    total: the sum over the devices that dropped disjoint assignments.
  """
  n = config.num_experts
  counts = jnp.bincount(experts.reshape(-1), length=n)
  fraction = mean(counts.astype(jnp.float32) / experts.size)
  entropy = -jnp.sum(probs * jnp.log(jnp.maximum(probs, 1e-30)), axis=-1)
  return {
      "expert_load": fraction,
      "aux_loss": balance_loss(
          probs, experts, n, config.load_balance_loss, mean
      ),
      "load_max": jnp.max(fraction),
      "load_min": jnp.min(fraction),
      "load_cv": jnp.std(fraction) * n,
      "router_entropy": mean(jnp.mean(entropy)),
      "dropped": total(dropped),
  }


def _route_tokens(
    tokens: jax.Array,
    router: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
):
  """`route` of [T, E] tokens with the layer's router (and its bias)."""
  logits = jnp.einsum(
      "te,ex->tx",
      tokens,
      router["router"].astype(tokens.dtype),
      preferred_element_type=jnp.float32,
  )
  return route(logits, config, router.get("router_bias"))


def moe_mlp(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The MoE feed-forward layer.

  Without a mesh (or on one device) the whole micro-batch is one dispatch
  group. On a mesh of several devices (the batch split over every mesh
  axis) each device routes its own tokens in `shard_map` and the dispatch
  group is the tokens of one expert group: the devices along the mesh's
  "expert" axis, or the device alone when the mesh has none. A device
  gathers its group's tokens with their choices (an all-gather over the
  expert axis), runs the assignments that go to the experts it holds, and
  the group's devices sum their partial outputs back to the tokens' owners
  (a reduce-scatter): the all-gather token dispatch, whose traffic equals
  an all-to-all's when k is about the expert axis's size, with shapes that
  do not depend on the routing. No device ever holds another group's
  tokens. Capacity (`capacity_factor`) counts the dispatch group's tokens;
  the statistics are the whole micro-batch's either way.

  Args:
    x: [B, S, E] normalised hidden states (compute dtype).
    layer: this layer's parameters (module docstring, without `L`).
    config: the model's config.
    mesh: the mesh the program is compiled for, or None.

  Returns:
    (out, stats): out [B, S, E] in x's dtype; stats float32 scalars named
    as `STAT_NAMES`: the unweighted balance loss, the max and min over experts
    of the assignment fraction, its coefficient of variation (std / mean),
    the mean router entropy in nats, and the number of dropped assignments;
    and "expert_load", float32 [X], each expert's fraction of the
    micro-batch's assignments (what `update_router_bias` balances).
  """
  b, s, e = x.shape
  tokens = x.reshape(b * s, e)
  routed = {name: layer[name] for name in ("w_gate", "w_up", "w_down")}
  router = {
      name: layer[name] for name in ("router", "router_bias") if name in layer
  }
  if mesh is None or mesh.size == 1:
    probs, weights, experts = _route_tokens(tokens, router, config)
    out, dropped, _ = dispatch(
        tokens, weights, experts, routed, 0, capacity(b * s, config)
    )
    stats = _statistics(
        probs.reshape(b, s, -1),
        experts.reshape(b, s, -1),
        dropped,
        config,
        mean=lambda v: v,
        total=lambda v: v,
    )
  else:
    # The held experts' weights are gathered (over every axis but
    # "expert") in the compute dtype: half the bytes moved and held of
    # float32 weights, and their gradients come back in it to be reduced.
    compute = {name: w.astype(x.dtype) for name, w in routed.items()}
    out, stats = _sharded(x, router, compute, config, mesh)
    out = out.reshape(b * s, e)
  if config.num_shared_experts:
    out = out + _shared(tokens, layer)
  return out.reshape(b, s, e), stats


def _dispatch_group(
    tokens: jax.Array,
    weights: jax.Array,
    experts: jax.Array,
    routed: Mapping[str, jax.Array],
    cap: int,
    expert_axis: str,
    batch_axes: tuple[str, ...],
) -> tuple[jax.Array, jax.Array]:
  """One device's part of its expert group's dispatch, in `shard_map`.

  The group's G devices' tokens and choices are gathered, and the held
  experts take them one device's tokens at a time: a scan whose steps keep
  nothing for the backward pass but their inputs, so the sorted rows of one
  device's T * k assignments are alive at once rather than the group's
  G * T * k. Capacity carries over from part to part, in the group's token
  order. A reduce-scatter sums the G devices' partial outputs back to the
  tokens' owners.

  Args:
    tokens, weights, experts: this device's, as `dispatch` takes them.
    routed: the experts this device holds.
    cap: `dispatch`'s.
    expert_axis: the mesh's expert axis.
    batch_axes: the mesh axes the tokens are split over.

  Returns:
    (out [T, E], dropped): this device's tokens' routed output, and the
    assignments this device's experts dropped.
  """
  gather = functools.partial(jax.lax.all_gather, axis_name=expert_axis)
  held = routed["w_gate"].shape[0]
  first = jax.lax.axis_index(expert_axis) * held

  def part(earlier, source):
    out, dropped, given = dispatch(*source, routed, first, cap, earlier)
    return earlier + given, (out, dropped)

  sources = (gather(tokens), gather(weights), gather(experts))
  # The counts vary over the devices as the tokens do.
  none_yet = jax.lax.pcast(
      jnp.zeros((held,), jnp.int32), batch_axes, to="varying"
  )
  _, (outs, dropped) = jax.lax.scan(jax.checkpoint(part), none_yet, sources)
  out = jax.lax.psum_scatter(outs, expert_axis, scatter_dimension=0)
  return out, jnp.sum(dropped)


def _sharded(
    x: jax.Array,
    router: Mapping[str, jax.Array],
    routed: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
    mesh: jax.sharding.Mesh,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The routed experts on a mesh (`moe_mlp`'s docstring): [B, S, E] out."""
  # The tokens are split over the batch axes (rows) and, with context
  # parallelism, the context axis (each row's tokens): every device routes
  # its own, and the statistics are reduced over all of them.
  context_axis = (
      mesh_lib.CONTEXT_AXIS if mesh_lib.context_size(mesh) > 1 else None
  )
  token_axes = mesh_lib.batch_axes(mesh) + (
      (context_axis,) if context_axis else ()
  )
  expert_axis = mesh_lib.EXPERT_AXIS if mesh_lib.expert_size(mesh) > 1 else None
  group = mesh.shape[expert_axis] if expert_axis else 1
  # With a tensor axis each device holds a slice of every held expert's
  # hidden units (w_gate, w_up by columns, w_down by rows): its output is a
  # partial sum over them, summed over the axis.
  tensor_axis = mesh_lib.TENSOR_AXIS if mesh_lib.tensor_size(mesh) > 1 else None

  def local(x, router, routed):
    b, s, e = x.shape
    tokens = x.reshape(b * s, e)
    probs, weights, experts = _route_tokens(tokens, router, config)
    cap = capacity(group * b * s, config)
    if expert_axis:
      out, dropped = _dispatch_group(
          tokens, weights, experts, routed, cap, expert_axis, token_axes
      )
    else:
      out, dropped, _ = dispatch(tokens, weights, experts, routed, 0, cap)
    if tensor_axis:
      out = jax.lax.psum(out, tensor_axis)
    stats = _statistics(
        probs.reshape(b, s, -1),
        experts.reshape(b, s, -1),
        dropped,
        config,
        mean=lambda v: jax.lax.pmean(v, token_axes),
        total=lambda v: jax.lax.psum(v, token_axes),
    )
    return out.reshape(b, s, e), stats

  batch = P(mesh_lib.batch_axes(mesh), context_axis)
  held = {
      "w_gate": P(expert_axis, None, tensor_axis),
      "w_up": P(expert_axis, None, tensor_axis),
      "w_down": P(expert_axis, tensor_axis, None),
  }
  return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(
          batch,
          {name: P() for name in router},
          {name: held[name] for name in routed},
      ),
      out_specs=(batch, P()),
  )(x, dict(router), dict(routed))


def summarize(stats: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Reduces per-layer statistics ([L] each) to one scalar per name.

  The balance loss, coefficient of variation and entropy are means over the
  MoE layers; load_max and load_min the extremes over layers; dropped the
  sum over layers. "expert_load", when given, stays per layer ([L, X]).
  """
  loads = (
      {"expert_load": stats["expert_load"]} if "expert_load" in stats else {}
  )
  return loads | {
      "aux_loss": jnp.mean(stats["aux_loss"]),
      "load_max": jnp.max(stats["load_max"]),
      "load_min": jnp.min(stats["load_min"]),
      "load_cv": jnp.mean(stats["load_cv"]),
      "router_entropy": jnp.mean(stats["router_entropy"]),
      "dropped": jnp.sum(stats["dropped"]),
  }


def update_router_bias(
    bias: jax.Array, load: jax.Array, rate: float
) -> jax.Array:
  """DeepSeek-V3's auxiliary-loss-free balancing: one step of the bias.

  Each layer's bias of an expert that took more than the mean load goes
  down by `rate`, of one that took less goes up by `rate` (an expert at
  exactly the mean keeps its bias): bias + rate * sign(mean load - load).

  Args:
    bias: float32 [L, X] the router correction bias.
    load: [L, X] each expert's share of the step's assignments (any
      positive scale: only the comparison with the layer's mean counts).
    rate: the update speed (DeepSeek-V3 trained with 0.001).
  """
  mean = jnp.mean(load, axis=-1, keepdims=True)
  return bias + rate * jnp.sign(mean - load).astype(bias.dtype)


def dense_reference(
    x: jax.Array,
    layer: Mapping[str, jax.Array],
    config: model_config.ModelConfig,
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
  _, weights, experts = route(logits, config, layer.get("router_bias"))
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
    out = out + _shared(tokens, layer)
  return out.reshape(b, s, e)
