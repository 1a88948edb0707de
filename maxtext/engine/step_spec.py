"""What a training step computes, checked: the engine's arguments as a spec.

`make_spec` checks the `Engine` constructor's arguments that shape the step
(the loss, the optimizer and its learning-rate schedule, K, clipping,
donation, the eval function and its metrics' directions, the statistic
rules) and returns them as a `StepSpec`, from which
`maxtext/engine/step_programs.py` makes the compiled programs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import optax

from maxtext.core import checks
from maxtext.core import eval_metrics
from maxtext.model import param_statistics

LossFn = Callable[[Any, Any], tuple[jax.Array, Any]]
# (params, batch) -> {eval metric name: scalar}.
EvalFn = Callable[[Any, Any], Mapping[str, jax.Array]]


def eval_program(
    loss_fn: LossFn,
    eval_fn: Optional[EvalFn],
    directions: Optional[Mapping[str, eval_metrics.Direction]],
) -> tuple[EvalFn, Mapping[str, eval_metrics.Direction]]:
  """The eval function and its metrics' directions (see `Engine`)."""
  if (eval_fn is None) != (directions is None):
    raise ValueError(
        "eval_fn and eval_directions must be given together (or neither)"
    )
  if eval_fn is None:
    return (
        lambda params, batch: {eval_metrics.LOSS: loss_fn(params, batch)[0]},
        eval_metrics.LOSS_DIRECTIONS,
    )
  if not callable(eval_fn):
    raise TypeError(f"eval_fn must be callable; got {eval_fn!r}")
  if not directions or not all(
      isinstance(name, str) and isinstance(d, eval_metrics.Direction)
      for name, d in directions.items()
  ):
    raise TypeError(
        "eval_directions must map each eval metric's name (a str) to an "
        f"eval_metrics.Direction; got {directions!r}"
    )
  return eval_fn, dict(directions)


class StatisticSlots:
  """The statistic-moved parameters' slots in parameter-shaped trees."""

  def __init__(
      self, rules: Mapping[str, param_statistics.Rule], shapes: Mapping
  ):
    """
    Args:
      rules: parameter path -> rule, checked (`param_statistics.check_rules`).
      shapes: parameter path -> shape, for the rules' paths.
    """
    self.rules = rules
    self._shapes = shapes

  def map(self, tree, fn):
    """`tree` with each statistic leaf replaced by fn(path, leaf), in its
    dtype; every other leaf as it is."""
    if not self.rules:
      return tree

    def one(path, leaf):
      name = param_statistics.path_name(path)
      if name not in self.rules:
        return leaf
      return jnp.asarray(fn(name, leaf)).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(one, tree)

  def only(self, tree) -> dict:
    """path -> leaf of `tree`, for the statistic-moved parameters."""
    return {
        param_statistics.path_name(path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if param_statistics.path_name(path) in self.rules
    }

  def gradients_only(self, tree) -> list:
    """`tree`'s leaves without the statistic-moved parameters' slots."""
    return [
        leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if param_statistics.path_name(path) not in self.rules
    ]

  def with_statistics(self, grads, aux):
    """The micro-batch's gradients with each statistic-moved parameter's
    slot holding the loss's statistic (checked at trace time)."""
    statistics = param_statistics.statistics_of(aux, self.rules, self._shapes)
    return self.map(grads, lambda path, _: statistics[path])


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """What the programs compute; the shapes come from the state.

  Attributes:
    loss_fn: `loss_fn(params, micro_batch) -> (loss, aux)`.
    eval_fn: `eval_fn(params, batch) -> {name: scalar}`.
    eval_directions: the eval metrics' names and directions.
    optimizer: the optax transformation.
    lr_fn: step -> learning rate (only measured, the optimizer has its own).
    k: the micro-batches per step.
    clip: the global norm the mean gradient is clipped to (0 = none).
    donate: the step donates parameters and optimizer state to the
      program that updates them.
    statistics: the statistic-moved parameters.
    compute_copy: None, or `compute_copy(params) -> params`, the copy the
      loss is differentiated in (`Engine`'s argument).
  """

  loss_fn: LossFn
  eval_fn: EvalFn
  eval_directions: Mapping[str, eval_metrics.Direction]
  optimizer: optax.GradientTransformation
  lr_fn: Callable[[Any], Any]
  k: int
  clip: float
  donate: bool
  statistics: StatisticSlots
  compute_copy: Optional[Callable[[Any], Any]] = None


def _check_arguments(loss_fn, optimizer, learning_rate_fn, k, clip, donate):
  """Raises TypeError/ValueError on a bad `Engine` argument."""
  if not callable(loss_fn):
    raise TypeError(f"loss_fn must be callable; got {loss_fn!r}")
  if not isinstance(optimizer, optax.GradientTransformation):
    raise TypeError(
        "optimizer must be an optax.GradientTransformation; got "
        f"{type(optimizer).__name__}"
    )
  if not callable(learning_rate_fn) and not isinstance(
      learning_rate_fn, (int, float)
  ):
    raise TypeError(
        "learning_rate_fn must be callable or a number; got "
        f"{learning_rate_fn!r}"
    )
  # These two raise ValueError for a wrong type too (bool included), as they
  # always have, so they use the predicates of `checks`, not check_int.
  if not checks.is_int(k) or k < 1:
    raise ValueError(
        f"gradient_accumulation_steps must be an int >= 1; got {k!r}"
    )
  if (
      not checks.is_number(clip)
      # `not >= 0` also refuses NaN, which `< 0` would let through.
      or not clip >= 0
      or clip == float("inf")
  ):
    raise ValueError(
        f"grad_clip_norm must be a finite number >= 0; got {clip!r}"
    )
  if not isinstance(donate, bool):
    raise TypeError(f"donate_state must be a bool; got {donate!r}")


def make_spec(
    loss_fn: LossFn,
    params,
    optimizer: optax.GradientTransformation,
    learning_rate_fn,
    k: int,
    grad_clip_norm: float,
    donate: bool,
    eval_fn: Optional[EvalFn],
    eval_directions: Optional[Mapping[str, eval_metrics.Direction]],
    statistic_rules: Optional[Mapping[str, param_statistics.Rule]],
    compute_copy: Optional[Callable[[Any], Any]] = None,
) -> StepSpec:
  """The `StepSpec` of an `Engine`'s arguments, checked.

  Raises:
    TypeError/ValueError: naming the bad argument.
  """
  _check_arguments(
      loss_fn, optimizer, learning_rate_fn, k, grad_clip_norm, donate
  )
  if compute_copy is not None and not callable(compute_copy):
    raise TypeError(f"compute_copy must be callable; got {compute_copy!r}")
  eval_fn, eval_directions = eval_program(loss_fn, eval_fn, eval_directions)
  shapes = {
      param_statistics.path_name(path): leaf.shape
      for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
  }
  rules = param_statistics.check_rules(statistic_rules or {}, shapes)
  return StepSpec(
      loss_fn=loss_fn,
      eval_fn=eval_fn,
      eval_directions=eval_directions,
      optimizer=optimizer,
      lr_fn=(
          learning_rate_fn
          if callable(learning_rate_fn)
          else (lambda _, lr=float(learning_rate_fn): lr)
      ),
      k=int(k),
      clip=float(grad_clip_norm),
      donate=donate,
      statistics=StatisticSlots(rules, {path: shapes[path] for path in rules}),
      compute_copy=compute_copy,
  )
