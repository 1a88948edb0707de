"""The recorder's pending state: one step's values waiting for a flush.

`MetricsRecorder` keeps one `PendingBuffer` per `MetricsBuffer` it fills. The
pending buffer holds the validated values in buffering order as named records
(`ScalarRecord`, `WeightedRecord`, `PackedRecord`), what the recorder checks
new values against (each name's kind, the names tuples already checked), and
it is the only writer of its buffer's arrays and `pending_count`.

A pending value is either a NumPy 1D array (a host value, kept as it is) or a
`DeviceSlot`: the JAX array waits in its dtype's `DeviceGroup`, so that the
flush can bring a whole group home with few device ops, and the record keeps
where its elements start in that group.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

import numpy as np

from maxtext.metrics import buffer as metrics_buffer

# The two kinds of metric; a name keeps one kind within a buffer.
SCALAR = "scalar"
WEIGHTED = "weighted"


@dataclasses.dataclass(slots=True)
class DeviceSlot:
  """Where a pending device value sits in its buffer's device groups.

  Attributes:
    dtype: the dtype of the value, the key of its `DeviceGroup`.
    offset: the index of the value's first element in that group, counted
      over the group's values flattened one after the other.
  """

  dtype: Any
  offset: int


# A pending value: a NumPy 1D array on the host, or a device value's slot.
Held = Union[np.ndarray, DeviceSlot]


@dataclasses.dataclass(slots=True)
class ScalarRecord:
  """One value of the scalar metric `name` (a host value has shape (1,))."""

  name: str
  value: Held


@dataclasses.dataclass(slots=True)
class WeightedRecord:
  """One value of the weighted metric `name` (host values of shape (1,))."""

  name: str
  unreduced_sum: Held
  denominator: Held


@dataclasses.dataclass(slots=True)
class PackedRecord:
  """One value each of the scalar metrics `names`, packed in that order.

  Attributes:
    names: distinct metric names.
    values: len(names) elements (a host value has shape (len(names),)).
  """

  names: tuple[str, ...]
  values: Held


Record = Union[ScalarRecord, WeightedRecord, PackedRecord]


class DeviceGroup:
  """The pending device values of one dtype, in buffering order."""

  __slots__ = ("values", "size")

  def __init__(self):
    self.values: list = []  # JAX arrays of shape (), (1,) or (n,).
    self.size = 0  # Their total number of elements.


class PendingBuffer:
  """A `MetricsBuffer` and the values waiting for a flush to go into it.

  Attributes:
    buffer: the MetricsBuffer the values go into.
    records: the pending records, in buffering order.
    device: dtype -> DeviceGroup of the records' device values.
    kinds: name -> SCALAR or WEIGHTED, for every name ever buffered here
      (flushed or not).
    packed_names: names tuples of `PackedRecord`s already buffered here.
  """

  __slots__ = ("buffer", "records", "device", "kinds", "packed_names")

  def __init__(self, buffer: metrics_buffer.MetricsBuffer):
    self.buffer = buffer
    self.records: list[Record] = []
    self.device: dict[Any, DeviceGroup] = {}
    self.kinds: dict[str, str] = {}
    self.packed_names: set[tuple[str, ...]] = set()

  def _hold(self, value, size: int = 1) -> Held:
    """Keeps a validated value: NumPy as it is, a device value in a slot."""
    if isinstance(value, np.ndarray):
      return value
    dtype = value.dtype  # A property of jax.Array: read it once.
    group = self.device.get(dtype)
    if group is None:
      group = self.device[dtype] = DeviceGroup()
    slot = DeviceSlot(dtype, group.size)
    group.values.append(value)
    group.size += size
    return slot

  def add_scalar(self, name: str, value) -> None:
    """Adds one validated value of the scalar metric `name`.

    Args:
      name: the metric.
      value: a NumPy array of shape (1,) or a JAX array of shape () or (1,).
    """
    self.kinds[name] = SCALAR
    self.records.append(ScalarRecord(name, self._hold(value)))
    self.buffer.pending_count += 1

  def add_weighted(self, name: str, unreduced_sum, denominator) -> None:
    """Adds one validated value of the weighted metric `name`.

    Args:
      name: the metric.
      unreduced_sum: as `value` in `add_scalar`.
      denominator: as `value` in `add_scalar`.
    """
    self.kinds[name] = WEIGHTED
    self.records.append(
        WeightedRecord(name, self._hold(unreduced_sum), self._hold(denominator))
    )
    self.buffer.pending_count += 1

  def add_packed(self, names: tuple[str, ...], values) -> None:
    """Adds one validated value of each scalar metric in `names`.

    Args:
      names: distinct metric names, none of them weighted in this buffer.
      values: a NumPy or JAX array of shape (len(names),).
    """
    if names not in self.packed_names:
      for name in names:
        self.kinds[name] = SCALAR
      self.packed_names.add(names)
    self.records.append(PackedRecord(names, self._hold(values, len(names))))
    self.buffer.pending_count += len(names)

  def owner_name(self, dtype, index: int) -> str:
    """The metric whose device value is `device[dtype].values[index]`.

    Only error messages need it, so it searches instead of keeping an index.
    """
    values = self.device[dtype].values
    offset = sum(v.size for v in values[:index])
    for record in self.records:
      if isinstance(record, PackedRecord):
        held, name = (record.values,), f"{record.names[0]}... (packed)"
      elif isinstance(record, WeightedRecord):
        held, name = (record.unreduced_sum, record.denominator), record.name
      else:
        held, name = (record.value,), record.name
      for h in held:
        if (
            isinstance(h, DeviceSlot)
            and h.dtype == dtype
            and h.offset == offset
        ):
          return name
    return "?"

  def commit(
      self,
      scalars: dict[str, np.ndarray],
      weighted: dict[str, metrics_buffer.WeightedMetric],
  ) -> None:
    """Stores a flush's arrays in the buffer and drops the pending values.

    Plain assignments that cannot fail: the flush builds every array first.

    Args:
      scalars: name -> the scalar metric's whole new array.
      weighted: name -> the weighted metric's whole new WeightedMetric.
    """
    self.buffer.scalar_metrics.update(scalars)
    self.buffer.weighted_metrics.update(weighted)
    self.buffer.pending_count = 0
    self.records = []
    self.device = {}
