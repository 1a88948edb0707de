"""A model's parameter counts from its shapes: total, active per token, parts.

The shapes come from `jax.eval_shape` of the model's own initialiser, so
nothing is allocated and a 671B model is counted in seconds. "Active per
token" counts what one token's forward pass uses: every parameter except
the routed experts a token is not sent to (of each MoE layer's
`num_experts` routed experts, `num_experts_per_token` count). The input
embedding is a table look-up that touches one row per token; DeepSeek's
published activated counts leave the table out, so it is also given without
it (`active_without_embedding`).
"""

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from maxtext.model import transformer

# Parts of the model, in the order `count` reports them.
PARTS = (
    "embedding",
    "attention",
    "norms",
    "dense_mlp",
    "router",
    "shared_experts",
    "routed_experts",
    "unembedding",
)


@dataclasses.dataclass(frozen=True)
class ParamCount:
  """Parameter counts of one model.

  Attributes:
    total: every parameter.
    active: parameters one token uses (routed experts: k of n).
    parts: PARTS name -> parameters (all routed experts, not only k).
  """

  total: int
  active: int
  parts: dict[str, int]

  @property
  def active_without_embedding(self) -> int:
    """`active` less the input embedding table (DeepSeek's convention)."""
    return self.active - self.parts["embedding"]


def _part(path: tuple[str, ...], axes: tuple[str, ...]) -> str:
  """Which of PARTS a parameter at `path` with logical `axes` belongs to."""
  name = path[-1]
  if name in ("embedding", "unembedding"):
    return name
  if name.endswith("norm"):
    return "norms"
  if name in ("router", "router_bias"):
    return "router"
  if name.startswith("shared_"):
    return "shared_experts"
  if transformer.EXPERT_LOGICAL_AXIS in axes:
    return "routed_experts"
  if name in ("w_gate", "w_up", "w_down"):
    return "dense_mlp"
  return "attention"


def count_abstract(params: Any, config: Any) -> ParamCount:
  """Counts a parameter tree of `transformer.init_params`'s structure.

  Args:
    params: the parameters (arrays or ShapeDtypeStructs).
    config: the model's config (`num_experts`, `num_experts_per_token`).

  Raises:
    ValueError: `params` is not of the model's structure.
  """
  axes = transformer.param_logical_axes(params)
  parts = dict.fromkeys(PARTS, 0)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  axes_leaves = jax.tree_util.tree_leaves(
      axes, is_leaf=lambda x: isinstance(x, tuple)
  )
  for (path, x), names in zip(leaves, axes_leaves):
    keys = tuple(getattr(k, "key", str(k)) for k in path)
    parts[_part(keys, names)] += int(np.prod(x.shape, dtype=np.int64))
  total = sum(parts.values())
  routed = parts["routed_experts"]
  active = total - routed
  if routed:
    # Each MoE layer's routed experts are equal in size: k of n are used.
    active += routed * config.num_experts_per_token // config.num_experts
  return ParamCount(total=total, active=active, parts=parts)


def count(config: Any) -> ParamCount:
  """Counts the config's model from `jax.eval_shape`; allocates nothing."""
  params = jax.eval_shape(
      functools.partial(transformer.init_params, config), jax.random.PRNGKey(0)
  )
  return count_abstract(params, config)


def report(counts: ParamCount, config: Any) -> str:
  """The counts as text: parts, then total and active lines."""

  def fmt(n):
    return f"{n:>17,} ({n / 1e9:.2f}B)"

  lines = [f"{name:<26}{fmt(counts.parts[name])}" for name in PARTS]
  lines.append(f"{'total':<26}{fmt(counts.total)}")
  k, n = config.num_experts_per_token, config.num_experts
  experts = f"; routed experts {k} of {n}" if n else ""
  lines.append(f"{'active per token':<26}{fmt(counts.active)}{experts}")
  lines.append(
      f"{'active, no embedding':<26}{fmt(counts.active_without_embedding)}"
      " (the input embedding table left out)"
  )
  return "\n".join(lines)
