"""The data types of buffered training metrics: WeightedMetric, SummedMetric,
MetricsBuffer.

A `MetricsBuffer` is the public result of `maxtext.metrics.recorder`: one
step's flushed arrays. The values still waiting for a flush are the recorder's
own state (`maxtext.metrics.pending`), not part of the buffer; the recorder,
`maxtext.metrics.pending` and `maxtext.metrics.flush` share these types, so
they live here, below all three.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

AggregationFn = Callable[[Any], Any]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WeightedMetric:
  """A metric reduced as sum(unreduced_sum) / sum(denominator).

  A pytree, so it can be returned from jitted functions. It is deliberately not
  a tuple: the engine skips tuple values when it walks auxiliary outputs.

  Attributes:
    unreduced_sum: the numerator, a scalar or (after a flush) a 1D array.
    denominator: the denominator, same shape as `unreduced_sum`.
  """

  unreduced_sum: Any
  denominator: Any

  def compute(self):
    """Returns unreduced_sum / denominator, and 0 where the denominator is 0.

    NumPy in, NumPy out; JAX arrays (and tracers) in, JAX out.
    """
    s, d = self.unreduced_sum, self.denominator
    xp = jnp if isinstance(s, jax.Array) or isinstance(d, jax.Array) else np
    zero = d == 0
    safe = xp.where(zero, xp.ones_like(d), d)
    return xp.where(zero, xp.zeros_like(s / safe), s / safe)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SummedMetric:
  """A count-like metric: its step value is the sum of its buffered values.

  A loss function wraps a per-micro-batch count in it (dropped tokens, ...);
  the step's value is then the sum over the step's micro-batches, which no
  one has to scale by their number. A pytree, so it can be returned from
  jitted functions; not a tuple, which the engine would skip.

  Attributes:
    value: a scalar (Python, NumPy or JAX; a tracer inside `jit`).
  """

  value: Any


def sum_values(values) -> Any:
  """The aggregation of a `SummedMetric`: the sum of its flushed values."""
  return np.sum(values)


@dataclasses.dataclass(eq=False)
class MetricsBuffer:
  """One step's metrics.

  Attributes:
    step: the training step.
    mode: the recorder's mode ("train", "eval", ...).
    scalar_metrics: name -> NumPy 1D array, one entry per flushed value, in
      buffering order.
    weighted_metrics: name -> WeightedMetric of two NumPy 1D arrays.
    aggregation_fns: name -> callable given when the metric was buffered.
    pending_count: values of this buffer waiting for a flush (the recorder
      keeps it; 0 once flushed).
  """

  step: int
  mode: str
  scalar_metrics: dict[str, np.ndarray] = dataclasses.field(
      default_factory=dict
  )
  weighted_metrics: dict[str, WeightedMetric] = dataclasses.field(
      default_factory=dict
  )
  aggregation_fns: dict[str, AggregationFn] = dataclasses.field(
      default_factory=dict
  )
  pending_count: int = 0


def describe(value) -> str:
  """A description of `value` that never reads device memory."""
  if isinstance(value, jax.Array):
    kind = "tracer" if isinstance(value, jax.core.Tracer) else "jax.Array"
    return f"{kind}(shape={tuple(value.shape)}, dtype={value.dtype})"
  text = repr(value)
  return text if len(text) <= 120 else text[:117] + "..."
