"""The all-or-nothing flush of pending metric values into NumPy arrays.

A flush is two steps, so that all or nothing is visible in the code:

* `build(pending_buffers)` computes every buffer's new arrays and touches no
  state: the buffers, their pending values and their arrays stay as they are.
  It raises, naming the metric, if any value cannot be brought home.
* `commit(updates)` stores what `build` returned: plain assignments that
  cannot fail (`PendingBuffer.commit`).

`build` runs in three phases over every pending buffer it is given:

1. gather: each buffer's pending device values, per dtype, one buffer after
   the other (a deleted device buffer fails here, naming its metric);
2. fetch: per dtype, the values are cut into chunks of at most
   `MAX_OPERANDS_PER_LAUNCH`, each padded to a power of two, and packed into
   jitted concatenation calls of at most that many operands; one
   `jax.device_get` brings every result to the host. Up to
   `MAX_OPERANDS_PER_LAUNCH` device values, mixed dtypes included, take one
   launch; a dtype holding a single 1D value (one packed array) takes none.
   Values that cannot share one computation (committed to different devices)
   are copied to the host one by one instead;
3. assemble: each metric's new array is put together from index lists into
   the flat host arrays, strided views of packed runs, and host values, in
   buffering order, after what the buffer already holds.

`prefetch` runs the device half of phases 1 and 2 ahead of time (the
concatenations and the start of their copies to the host) so that device work
dispatched after it, such as the optimizer step, queues behind the flush's
launches; the `build` that follows takes its results.

`maxtext.metrics.recorder` is the public entry point; this module is its
machinery and changes nothing but through `PendingBuffer.commit`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.metrics import buffer as metrics_buffer
from maxtext.metrics import pending as metrics_pending

_DeviceSlot = metrics_pending.DeviceSlot
_PackedRecord = metrics_pending.PackedRecord
_ScalarRecord = metrics_pending.ScalarRecord
_WeightedRecord = metrics_pending.WeightedRecord


@jax.jit
def _concat_groups(groups):
  """groups: tuple of tuples of arrays; returns one 1D array per group."""
  return tuple(jnp.concatenate([jnp.ravel(x) for x in g]) for g in groups)


# The most device values one jitted concatenation takes. XLA's compile time
# grows faster than linearly in the operand count (measured on CPU: 256
# operands 0.3 s, 1600 operands 5 s, 6400 operands 49 s), so larger flushes are
# split into chunks of this size.
MAX_OPERANDS_PER_LAUNCH = 256


def _padded_arity(n: int) -> int:
  """n rounded up to a power of two (at most MAX_OPERANDS_PER_LAUNCH), so a
  varying number of values reuses a few compiled concatenations."""
  return min(MAX_OPERANDS_PER_LAUNCH, 1 << max(0, n - 1).bit_length())


def _launch(values: dict) -> tuple[list, list]:
  """Dispatches the concatenations that bring `values` home in few transfers.

  Each dtype's values are cut into chunks of at most MAX_OPERANDS_PER_LAUNCH
  values, each padded to a power of two by repeating its first value; chunks
  are packed into jitted concatenation calls of at most MAX_OPERANDS_PER_LAUNCH
  operands. Up to that many device values therefore take one launch whatever
  their dtypes; more take about one launch per MAX_OPERANDS_PER_LAUNCH values.
  A dtype holding a single 1D value needs no launch. Nothing waits for the
  device here.

  Args:
    values: dtype -> device arrays, in offset order.

  Returns:
    (fetched, arrays): fetched[i] = (dtype, chunk index or None) says what the
    device array arrays[i] holds; arrays of one dtype come in offset order.

  Raises:
    Whatever the concatenation raises for values that cannot share one
    computation (arrays committed to different devices).
  """
  chunks, fetched = [], []  # fetched: (dtype, chunk index or None)
  for k, vals in values.items():
    if len(vals) == 1 and vals[0].ndim == 1:
      fetched.append((k, None))
      continue
    for i in range(0, len(vals), MAX_OPERANDS_PER_LAUNCH):
      chunk = vals[i : i + MAX_OPERANDS_PER_LAUNCH]
      chunk = chunk + chunk[:1] * (_padded_arity(len(chunk)) - len(chunk))
      chunks.append(tuple(chunk))
      fetched.append((k, len(chunks) - 1))
  calls, arity = [[]], 0
  for chunk in chunks:
    if arity + len(chunk) > MAX_OPERANDS_PER_LAUNCH:
      calls.append([])
      arity = 0
    calls[-1].append(chunk)
    arity += len(chunk)
  chunk_outputs = []
  for call in calls:
    if call:
      chunk_outputs.extend(_concat_groups(tuple(call)))
  return fetched, [
      values[k][0] if c is None else chunk_outputs[c] for k, c in fetched
  ]


def _fetch(values: dict, sizes: dict, name_of, launched=None) -> dict:
  """Brings every device value to the host with few device ops.

  The concatenations of `_launch` (or `launched`, its result from earlier),
  then one `jax.device_get` for all their results. Values that cannot share
  one computation make a call fail; then each value is copied to the host on
  its own: no launch, one transfer per value.

  Args:
    values: dtype -> device arrays, in offset order.
    sizes: dtype -> total number of elements of those arrays.
    name_of: (dtype, index in values[dtype]) -> metric name, for errors.
    launched: None, or what `_launch(values)` returned for these very values.

  Returns:
    dtype -> flat NumPy array of sizes[dtype] elements.
  """
  keys = list(values)
  try:
    fetched, arrays = launched if launched is not None else _launch(values)
    host = jax.device_get(arrays)
  # Whatever failed in the batched fetch, the one-by-one fetch below finds the
  # value at fault and names its metric.
  except Exception:  # pylint: disable=broad-exception-caught
    return {k: _fetch_one_by_one(k, values[k], name_of) for k in keys}
  parts: dict = {k: [] for k in keys}
  for (k, _), h in zip(fetched, host):
    parts[k].append(np.asarray(h).reshape(-1))
  return {
      k: (np.concatenate(p) if len(p) > 1 else p[0])[: sizes[k]]
      for k, p in parts.items()
  }


def _fetch_one_by_one(key, vals, name_of) -> np.ndarray:
  """The values of `key` fetched one at a time, naming the one that fails.

  Args:
    key: the dtype the values share.
    vals: the device values of that dtype, in order.
    name_of: (key, index) -> the metric's name, for the error.

  Returns:
    The values' elements as one flat host array.

  Raises:
    RuntimeError: a value cannot be fetched; it names the metric.
  """
  parts = []
  for i, value in enumerate(vals):
    try:
      parts.append(np.asarray(jax.device_get(value)).reshape(-1))
    except Exception as exc:
      raise RuntimeError(
          f"metric {name_of(key, i)!r}: cannot fetch "
          f"{metrics_buffer.describe(value)} from the device: "
          f"{exc}"
      ) from exc
  return np.concatenate(parts)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
  """np.concatenate, widening ml_dtypes floats (bfloat16, ...) to float32 when
  NumPy has no promotion rule for the mix (e.g. int64 with bfloat16)."""
  try:
    return np.concatenate(parts)
  except (TypeError, np.exceptions.DTypePromotionError):

    def native(dt):
      return dt.kind in "biuf" and dt.type.__module__ == "numpy"

    return np.concatenate(
        [p if native(p.dtype) else p.astype(np.float32) for p in parts]
    )


class _IndexRun:
  """Elements of one dtype's flat host array, picked by their indices."""

  __slots__ = ("dtype", "indices")

  def __init__(self, dtype, index: int):
    self.dtype = dtype
    self.indices = [index]


class _Segments:
  """One metric's new pieces in order: `_IndexRun`s and host arrays."""

  __slots__ = ("items", "owned")

  def __init__(self):
    self.items = []
    self.owned = False  # items is one array that nothing else refers to.

  def add(self, held: metrics_pending.Held, base: dict) -> None:
    """Appends one pending value; `base`: dtype -> where the buffer's device
    values start in the flat host arrays."""
    if isinstance(held, _DeviceSlot):
      self.add_index(held.dtype, base[held.dtype] + held.offset)
    else:
      self.add_array(held)

  def add_index(self, dtype, index: int) -> None:
    items = self.items
    self.owned = False
    if items and isinstance(items[-1], _IndexRun) and items[-1].dtype == dtype:
      items[-1].indices.append(index)
    else:
      items.append(_IndexRun(dtype, index))

  def add_array(self, array: np.ndarray, owned: bool = False) -> None:
    """Appends `array`; `owned` says no one else holds it (so the assembly
    may return it as it is when it is the only piece)."""
    self.owned = owned and not self.items
    self.items.append(array)

  def assemble(self, flat: dict, old: Optional[np.ndarray]) -> np.ndarray:
    """The metric's whole new array: `old` (or nothing), then the pieces."""
    if old is None and self.owned:
      return self.items[0]
    pieces = [] if old is None else [old]
    for item in self.items:
      if isinstance(item, _IndexRun):
        pieces.append(flat[item.dtype][np.asarray(item.indices, np.intp)])
      else:
        pieces.append(item)
    return _concat(pieces)


def _gather(work: Sequence[metrics_pending.PendingBuffer]):
  """Phase 1: every buffer's device values, per dtype, one after the other.

  Returns:
    (values, sizes, bases, name_of): dtype -> device arrays in offset order;
    dtype -> their total elements; per buffer, dtype -> where its values
    start; (dtype, index in values[dtype]) -> metric name.

  Raises:
    ValueError: a device value was deleted (naming its metric).
  """
  values, sizes, bases, owners = {}, {}, [], {}
  for pending in work:
    base = {}
    for dt, group in pending.device.items():
      lst = values.get(dt)
      if lst is None:
        lst = values[dt] = []
        owners[dt] = []
        sizes[dt] = 0
      base[dt] = sizes[dt]
      owners[dt].append((len(lst), pending))
      for i, v in enumerate(group.values):
        if v.is_deleted():
          raise ValueError(
              f"metric {pending.owner_name(dt, i)!r}: its device buffer was "
              f"deleted before flush ({metrics_buffer.describe(v)})"
          )
      lst.extend(group.values)
      sizes[dt] += group.size
    bases.append(base)

  def name_of(dt, index):
    start, owner = max(
        (o for o in owners[dt] if o[0] <= index), key=lambda o: o[0]
    )
    return owner.owner_name(dt, index - start)

  return values, sizes, bases, name_of


def _pending_counts(work) -> list[int]:
  return [len(p.records) for p in work]


def check(pending_buffers: Sequence[metrics_pending.PendingBuffer]) -> None:
  """Raises what `build` would raise for a value already lost on the host.

  No device op, no transfer, nothing changes: the gathering of `build`'s
  first phase, which finds a device value deleted before the flush.

  Raises:
    ValueError: a device value was deleted (naming its metric).
  """
  work = [p for p in pending_buffers if p.records]
  if work:
    _gather(work)


class Prefetch:
  """The device side of a flush, dispatched ahead: see `prefetch`."""

  __slots__ = ("work", "counts", "gathered", "launched")

  def __init__(self, work, gathered, launched):
    self.work = work  # The pending buffers with records, in order.
    self.counts = _pending_counts(work)
    self.gathered = gathered  # What `_gather(work)` returned.
    self.launched = launched  # What `_launch` returned for their values.

  def matches(self, work) -> bool:
    """Whether `work` holds just what was pending at the prefetch."""
    return (
        len(work) == len(self.work)
        and all(a is b for a, b in zip(work, self.work))
        and _pending_counts(work) == self.counts
    )


def prefetch(
    pending_buffers: Sequence[metrics_pending.PendingBuffer],
) -> Optional[Prefetch]:
  """Dispatches a flush's concatenations and starts their copies to the host.

  Nothing waits for the device and nothing changes. A `build` of the same
  pending buffers, with nothing buffered or flushed in between, can take the
  result and skip its own launches; its caller must make sure of that.
  Dispatching early lets later device work (an optimizer step) queue behind
  the concatenations instead of ahead of them.

  Returns:
    The Prefetch, or None when nothing is pending or the values cannot be
    prefetched (a deleted value, values on different devices); then `build`
    does all the work and reports any error.
  """
  work = [p for p in pending_buffers if p.records]
  if not work:
    return None
  try:
    gathered = _gather(work)
    if not gathered[0]:
      return None
    launched = _launch(gathered[0])
    for array in launched[1]:
      array.copy_to_host_async()
  # A prefetch is only a head start: any failure falls back to build().
  except Exception:  # pylint: disable=broad-exception-caught
    return None  # build meets the same problem and names the metric.
  return Prefetch(work, gathered, launched)


@dataclasses.dataclass(slots=True)
class Update:
  """What a flush stores for one pending buffer: see `commit`.

  Attributes:
    pending: the pending buffer.
    scalars: name -> the scalar metric's whole new array.
    weighted: name -> the weighted metric's whole new WeightedMetric.
  """

  pending: metrics_pending.PendingBuffer
  scalars: dict
  weighted: dict


def _packed_run(records, i: int) -> int:
  """How many records from records[i] (a PackedRecord) on have the same names
  and values contiguous in one device group, so one view takes them all."""
  first = records[i]
  slot, names = first.values, first.names
  if not isinstance(slot, _DeviceSlot):
    return 1
  width, n, k = len(names), len(records), 1
  while i + k < n:
    nxt = records[i + k]
    if not (
        isinstance(nxt, _PackedRecord)
        and nxt.names == names
        and isinstance(nxt.values, _DeviceSlot)
        and nxt.values.dtype == slot.dtype
        and nxt.values.offset == slot.offset + k * width
    ):
      break
    k += 1
  return k


def _assemble(
    pending: metrics_pending.PendingBuffer, base: dict, flat: dict
) -> Update:
  """Phase 3 for one buffer: its new arrays, built from its records."""
  scalar_segs: dict = {}
  weighted_segs: dict = {}
  records = pending.records
  i, n = 0, len(records)
  while i < n:
    record = records[i]
    if isinstance(record, _ScalarRecord):
      segs = scalar_segs.get(record.name)
      if segs is None:
        segs = scalar_segs[record.name] = _Segments()
      segs.add(record.value, base)
      i += 1
    elif isinstance(record, _WeightedRecord):
      pair = weighted_segs.get(record.name)
      if pair is None:
        pair = weighted_segs[record.name] = (_Segments(), _Segments())
      pair[0].add(record.unreduced_sum, base)
      pair[1].add(record.denominator, base)
      i += 1
    else:
      names, held = record.names, record.values
      width = len(names)
      k = _packed_run(records, i)
      if isinstance(held, _DeviceSlot):
        start = base[held.dtype] + held.offset
        matrix = flat[held.dtype][start : start + k * width].reshape(k, width)
      else:
        matrix = held.reshape(1, width)
      # One copy for the run: row j holds names[j]'s k values, contiguous,
      # in an array of the flush's own.
      columns = matrix.T.copy()
      for j, name in enumerate(names):
        segs = scalar_segs.get(name)
        if segs is None:
          segs = scalar_segs[name] = _Segments()
        segs.add_array(columns[j], owned=True)
      i += k
  buf = pending.buffer
  scalars = {
      name: segs.assemble(flat, buf.scalar_metrics.get(name))
      for name, segs in scalar_segs.items()
  }
  weighted = {}
  for name, (s_segs, d_segs) in weighted_segs.items():
    old = buf.weighted_metrics.get(name)
    weighted[name] = metrics_buffer.WeightedMetric(
        s_segs.assemble(flat, None if old is None else old.unreduced_sum),
        d_segs.assemble(flat, None if old is None else old.denominator),
    )
  return Update(pending, scalars, weighted)


def build(
    pending_buffers: Sequence[metrics_pending.PendingBuffer],
    prefetched: Optional[Prefetch] = None,
) -> list[Update]:
  """Builds the new arrays of every pending value; changes nothing.

  Args:
    pending_buffers: the buffers to flush; those with nothing pending are
      skipped.
    prefetched: None, or what `prefetch(pending_buffers)` returned with
      nothing buffered or flushed since; its gathering and launches then
      stand in for this build's.

  Returns:
    One Update per buffer with pending values, for `commit`.

  Raises:
    ValueError: a device value was deleted before the flush (naming its
      metric).
    RuntimeError: a device value cannot be fetched (naming its metric).
  """
  work = [p for p in pending_buffers if p.records]
  if not work:
    return []
  if prefetched is not None and prefetched.matches(work):
    # The same values as at the prefetch: its gathering and launches hold.
    (values, sizes, bases, name_of), launched = (
        prefetched.gathered,
        prefetched.launched,
    )
  else:
    values, sizes, bases, name_of = _gather(work)
    launched = None
  # Phase 2: few device ops and one transfer.
  flat = _fetch(values, sizes, name_of, launched) if values else {}
  return [_assemble(p, base, flat) for p, base in zip(work, bases)]


def commit(updates: Sequence[Update]) -> None:
  """Stores what `build` returned; plain assignments that cannot fail."""
  for update in updates:
    update.pending.commit(update.scalars, update.weighted)
