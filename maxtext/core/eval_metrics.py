"""Eval metrics: named values, each with the direction in which it improves.

An evaluation gives one value per metric name: the language model's is
"loss", the mean eval cross entropy in nats per token (lower is better); a
pass rate would be higher-is-better. The model declares the names and
directions of what its eval function returns; the engine computes the
values; the run state averages them over the eval batches.

A run's quality target names one metric and a threshold: the first
evaluation whose value of that metric reaches the threshold, in the metric's
direction, ends the run with success. The same metric is MLPerf's
`eval_accuracy` (the benchmark's quality target is on it).

No JAX here: the model, the engine, the loop and the listeners all use it.
"""

import dataclasses
import enum
import types
from typing import Mapping, Optional


class Direction(enum.Enum):
  """Which way an eval metric improves."""

  LOWER_IS_BETTER = "lower_is_better"  # A loss.
  HIGHER_IS_BETTER = "higher_is_better"  # A pass rate, an accuracy.

  def reaches(self, value: float, threshold: float) -> bool:
    """Whether `value` is at `threshold` or better (NaN never is)."""
    if self is Direction.LOWER_IS_BETTER:
      return value <= threshold
    return value >= threshold

  @property
  def symbol(self) -> str:
    """How a value that reaches a threshold compares to it: <= or >=."""
    return "<=" if self is Direction.LOWER_IS_BETTER else ">="


@dataclasses.dataclass(frozen=True)
class EvalMetric:
  """One metric of one evaluation: its value and the way it improves."""

  value: float
  direction: Direction


# The language model's eval metric: mean cross entropy, nats per token.
LOSS = "loss"
LOSS_DIRECTIONS: Mapping[str, Direction] = types.MappingProxyType(
    {LOSS: Direction.LOWER_IS_BETTER}
)


@dataclasses.dataclass(frozen=True)
class Target:
  """A run's quality target.

  Attributes:
    metric: the eval metric the target is on (MLPerf's `eval_accuracy`).
    threshold: the value that ends the run with success once reached, or
      None for no target (the run trains its step budget).
  """

  metric: str
  threshold: Optional[float]

  def reached(self, metrics: Mapping[str, EvalMetric]) -> bool:
    """Whether an evaluation's `metrics` reach the target.

    Raises:
      KeyError: the evaluation has no metric of the target's name.
    """
    metric = metrics[self.metric]
    if self.threshold is None:
      return False
    return metric.direction.reaches(metric.value, self.threshold)


def target(target_eval_loss: float) -> Target:
  """A run's quality target: the eval loss at the config's
  `target_eval_loss` (0 = no target)."""
  return Target(LOSS, target_eval_loss or None)
