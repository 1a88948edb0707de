"""A frozen mixture-of-experts router: no gradient and no update reaches it.

MLPerf qwen35_397b_grpo's reference trains its MoE policy with the router
frozen (`freeze_moe_router`): the routing the pretrained model learnt is
kept while the experts and the rest train. Two pieces, so that no part of
a step moves the router's parameters (`router` and, with a router bias,
`router_bias`, under the model's `moe_layers`):

* `stop_gradients(params)`, applied by the loss to the parameters it reads:
  the router's gradient is exactly 0 (the optimizer's moments stay 0);
* `decay_mask(base)`: the optimizer's weight-decay mask without the router,
  so AdamW's decoupled decay (which acts without a gradient) leaves it too.

The optimizer keeps its state structure (the decay mask does not shape it),
so a frozen run's checkpoints restore as any other's. A dense model has no
router: both are no-ops there (`count` says how many leaves are frozen).
"""

from typing import Any, Callable

import jax

# The router's parameters (maxtext/model/moe.py).
ROUTER_NAMES = ("router", "router_bias")


def router_mask(params: Any) -> Any:
  """True for the router's leaves of `params`, False elsewhere."""

  def is_router(path, _):
    last = path[-1] if path else None
    return getattr(last, "key", None) in ROUTER_NAMES

  return jax.tree_util.tree_map_with_path(is_router, params)


def count(params: Any) -> int:
  """How many leaves of `params` are the router's."""
  return sum(jax.tree_util.tree_leaves(router_mask(params)))


def stop_gradients(params: Any) -> Any:
  """`params` with the router's leaves behind `stop_gradient`."""
  return jax.tree_util.tree_map(
      lambda frozen, x: jax.lax.stop_gradient(x) if frozen else x,
      router_mask(params),
      params,
  )


def decay_mask(base: Callable[[Any], Any]) -> Callable[[Any], Any]:
  """`base`'s weight-decay mask with the router's leaves taken out."""

  def mask(params):
    return jax.tree_util.tree_map(
        lambda decays, frozen: bool(decays) and not frozen,
        base(params),
        router_mask(params),
    )

  return mask
