"""A training step's metrics, packed into one array by the compiled step.

The engine's micro-step returns the loss and its scalar aux metrics as one
`PackedMetrics`: a single array, whose names are static data of the
output's pytree structure, so every call of the compiled program, traced now
or found in a cache, hands them back. The host buffers it with
`MetricsRecorder.buffer_packed` (host lists, no device op): one value to
fetch per micro-batch, whatever the number of metrics. Each metric is checked
with `maxtext.metrics.values.check_scalar` while the step is traced, the
check the recorder applies to every value it is given.

Weighted aux metrics stay separate (the per-name path); a `SummedMetric` is
packed and declared to the recorder as a sum, so the step's value of a count
is its sum over the micro-batches.

Metric names follow `flatten_metrics`: nested dicts become `name/sub`; None
values, the keys `intermediate_outputs` and `param_statistics` and
tuple/list values are skipped. The loss is recorded as `loss`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp

from maxtext.model import param_statistics
from maxtext.metrics import recorder as metrics_recorder
from maxtext.metrics import values as metric_values

_SKIPPED_KEYS = ("intermediate_outputs", param_statistics.KEY)
# The metrics of the step's update, which its last micro-step returns packed
# in this order.
UPDATE_NAMES = ("learning_rate", "grad_norm", "step_skipped")


def flatten_metrics(name: str, value) -> list[tuple[str, Any]]:
  """Walks `value` as `record_metrics` does; returns [(name, leaf), ...].

  Args:
    name: the prefix ("" for none).
    value: a leaf or a (nested) mapping of leaves.

  Returns:
    (full name, leaf) pairs in the mapping's iteration order; None values, the
    keys `intermediate_outputs` and `param_statistics` and tuple/list values
    are left out.
  """
  out = []

  def walk(prefix, v):
    if v is None or isinstance(v, (tuple, list)):
      return
    if isinstance(v, Mapping):
      for key, sub in v.items():
        if key in _SKIPPED_KEYS:
          continue
        walk(f"{prefix}/{key}" if prefix else str(key), sub)
      return
    out.append((prefix, v))

  walk(name, value)
  return out


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["values"],
    meta_fields=["names", "sums"],
)
@dataclasses.dataclass(frozen=True)
class PackedMetrics:
  """A micro-batch's scalar metrics, packed in one array.

  `names` and `sums` are static fields: part of the pytree structure of a
  jitted program's output, which JAX keeps with the compiled program, so
  every call returns them with its values.

  Attributes:
    values: shape (len(names),), one value per name.
    names: the metric names, in packing order.
    sums: those of `names` declared `SummedMetric` (reduced by their sum).
  """

  values: jax.Array
  names: tuple[str, ...]
  sums: tuple[str, ...]


@functools.lru_cache(maxsize=64)
def _sum_declarations(sums: tuple[str, ...]) -> Optional[dict]:
  """`buffer_packed`'s aggregation_fns for the summed names (None if none)."""
  return {name: metrics_recorder.sum_values for name in sums} or None


def pack(loss, aux) -> tuple[PackedMetrics, dict]:
  """Splits the step's metrics (at trace time) into packed and weighted.

  Args:
    loss: the loss, a scalar.
    aux: the loss function's aux: None or a (nested) dict of metrics.

  Returns:
    (packed, weighted): the loss and the scalar aux metrics (SummedMetric
    values included, their names in `packed.sums`), and name ->
    WeightedMetric.

  Raises:
    TypeError/ValueError: naming the metric, for an aux that is not a dict,
      colliding names, or a value `check_scalar` refuses.
  """
  if aux is not None and not isinstance(aux, Mapping):
    raise TypeError(
        "loss_fn's aux must be None or a dict of metrics; got "
        f"{type(aux).__name__}"
    )
  scalars = [("loss", loss)]
  sums = []
  weighted = {}
  for name, leaf in flatten_metrics("", aux):
    if isinstance(leaf, metrics_recorder.WeightedMetric):
      weighted[name] = leaf
      continue
    if isinstance(leaf, metrics_recorder.SummedMetric):
      leaf = leaf.value
      if isinstance(
          leaf,
          (metrics_recorder.WeightedMetric, metrics_recorder.SummedMetric),
      ):
        raise TypeError(
            f"metric {name!r}: a SummedMetric holds one scalar; got "
            f"{type(leaf).__name__}"
        )
      sums.append(name)
    scalars.append((name, leaf))
  names = tuple(n for n, _ in scalars)
  if len(set(names) | set(weighted)) != len(names) + len(weighted):
    raise ValueError(
        f"metric names collide: {sorted(names)} " f"{sorted(weighted)}"
    )
  leaves = []
  for name, leaf in scalars:
    if isinstance(leaf, (str, bytes)):
      raise TypeError(f"metric {name!r}: not a number: {leaf!r}")
    try:
      arr = jnp.asarray(leaf)
    except TypeError as exc:
      raise TypeError(f"metric {name!r}: not a number: {leaf!r}") from exc
    metric_values.check_scalar(name, arr.dtype, arr.shape, arr)
    leaves.append(arr.reshape(()))
  dtype = jnp.result_type(jnp.float32, *[x.dtype for x in leaves])
  packed = jnp.stack([x.astype(dtype) for x in leaves])
  return PackedMetrics(packed, names, tuple(sums)), weighted


def buffer(
    recorder: metrics_recorder.MetricsRecorder,
    step: int,
    packed: PackedMetrics,
    weighted: Mapping[str, metrics_recorder.WeightedMetric],
) -> None:
  """Buffers a micro-step's metrics for `step` (host lists, no device op).

  The names come with the output's structure, whether the call that made
  `packed` traced the program or found it compiled.
  """
  recorder.buffer_packed(
      step, packed.names, packed.values, _sum_declarations(packed.sums)
  )
  for name, value in weighted.items():
    recorder.buffer_metrics(step, name, value)
