"""The all-or-nothing flush of `MetricsBuffer`s: pending values to NumPy arrays.

`flush_buffers` runs in four phases over every buffer it is given:

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
3. build: each metric's new array is assembled from index lists into the flat
   host arrays, strided views of packed runs, and host values, in buffering
   order, and appended to what the buffer already holds;
4. commit: plain assignments that cannot fail.

`prefetch_buffers` runs the device half of phases 1 and 2 ahead of time (the
concatenations and the start of their copies to the host) so that device work
dispatched after it, such as the optimizer step, queues behind the flush's
launches; the `flush_buffers` that follows takes its results.

Any failure before the commit raises with nothing changed, so a caller may
retry or drop the buffers. `maxtext.metrics.recorder` is the public entry
point; this module is its machinery.
"""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.metrics import buffer as metrics_buffer


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
      chunk = vals[i:i + MAX_OPERANDS_PER_LAUNCH]
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
  return fetched, [values[k][0] if c is None else chunk_outputs[c]
                   for k, c in fetched]


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
  except Exception:  # pylint: disable=broad-except
    return {k: _fetch_one_by_one(k, values[k], name_of) for k in keys}
  parts: dict = {k: [] for k in keys}
  for (k, _), h in zip(fetched, host):
    parts[k].append(np.asarray(h).reshape(-1))
  return {k: (np.concatenate(p) if len(p) > 1 else p[0])[:sizes[k]]
          for k, p in parts.items()}


def _fetch_one_by_one(key, vals, name_of) -> np.ndarray:
  parts = []
  for i, value in enumerate(vals):
    try:
      parts.append(np.asarray(jax.device_get(value)).reshape(-1))
    except Exception as exc:  # pylint: disable=broad-except
      raise RuntimeError(f"metric {name_of(key, i)!r}: cannot fetch "
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
    native = lambda dt: dt.kind in "biuf" and dt.type.__module__ == "numpy"
    return np.concatenate([p if native(p.dtype) else p.astype(np.float32)
                           for p in parts])


def _owner_name(buf: metrics_buffer.MetricsBuffer, dtype, index: int) -> str:
  """The metric whose device value is buf._device[dtype][0][index]."""
  # pylint: disable=protected-access
  vals = buf._device[dtype][0]
  offset = sum(v.size for v in vals[:index])
  for rec in buf._pending:
    for x in rec[2:]:
      if isinstance(x, tuple) and x == (dtype, offset):
        return rec[1] if rec[0] != "p" else f"{rec[1][0]}... (packed)"
  return "?"


class _Segments:
  """Per-name pieces in order: index lists into a flat array, or arrays."""

  __slots__ = ("items", "owned")

  def __init__(self):
    self.items = []
    self.owned = False  # items is one array that nothing else refers to.

  def add_index(self, dtype, offset: int) -> None:
    items = self.items
    self.owned = False
    if items and type(items[-1]) is list and items[-1][0] == dtype:  # pylint: disable=unidiomatic-typecheck
      items[-1][1].append(offset)
    else:
      items.append([dtype, [offset]])

  def add_array(self, array: np.ndarray, owned: bool = False) -> None:
    """Appends `array`; `owned` says no one else holds it (so the build may
    return it as it is when it is the only piece)."""
    self.owned = owned and not self.items
    self.items.append(array)

  def build(self, flat: dict, old: Optional[np.ndarray]) -> np.ndarray:
    if old is None and self.owned:
      return self.items[0]
    pieces = [] if old is None else [old]
    for item in self.items:
      if type(item) is list:  # pylint: disable=unidiomatic-typecheck
        pieces.append(flat[item[0]][np.asarray(item[1], np.intp)])
      else:
        pieces.append(item)
    return _concat(pieces)


def _gather(work):
  """Phase 1: every buffer's device values, per dtype, one after the other.

  Returns:
    (values, sizes, bases, name_of): dtype -> device arrays in offset order;
    dtype -> their total elements; per buffer, dtype -> where its values
    start; (dtype, index in values[dtype]) -> metric name.

  Raises:
    ValueError: a device value was deleted (naming its metric).
  """
  # pylint: disable=protected-access
  values, sizes, bases, owners = {}, {}, [], {}
  for buf in work:
    base = {}
    for dt, (vals, size) in buf._device.items():
      lst = values.get(dt)
      if lst is None:
        lst = values[dt] = []
        owners[dt] = []
        sizes[dt] = 0
      base[dt] = sizes[dt]
      owners[dt].append((len(lst), buf))
      for i, v in enumerate(vals):
        if v.is_deleted():
          raise ValueError(
              f"metric {_owner_name(buf, dt, i)!r}: its device buffer was "
              f"deleted before flush ({metrics_buffer.describe(v)})")
      lst.extend(vals)
      sizes[dt] += size
    bases.append(base)

  def name_of(dt, index):
    start, owner = max((o for o in owners[dt] if o[0] <= index),
                       key=lambda o: o[0])
    return _owner_name(owner, dt, index - start)

  return values, sizes, bases, name_of


class Prefetch:
  """The device side of a flush, dispatched ahead: see `prefetch_buffers`."""

  __slots__ = ("work", "counts", "gathered", "launched")

  def __init__(self, work, gathered, launched):
    self.work = work  # The buffers with pending values, in order.
    self.counts = _pending_counts(work)
    self.gathered = gathered  # What `_gather(work)` returned.
    self.launched = launched  # What `_launch` returned for their values.

  def matches(self, work) -> bool:
    """Whether `work` holds just what was pending at the prefetch."""
    return (len(work) == len(self.work) and
            all(a is b for a, b in zip(work, self.work)) and
            _pending_counts(work) == self.counts)


def _pending_counts(work) -> list[int]:
  return [len(b._pending) for b in work]  # pylint: disable=protected-access


def prefetch_buffers(buffers: Sequence[metrics_buffer.MetricsBuffer]
                    ) -> Optional[Prefetch]:
  """Dispatches a flush's concatenations and starts their copies to the host.

  Nothing waits for the device and nothing changes. A `flush_buffers` of the
  same buffers, with nothing buffered or flushed in between, can take the
  result and skip its own launches; its caller must make sure of that.
  Dispatching early lets later device work (an optimizer step) queue behind
  the concatenations instead of ahead of them.

  Returns:
    The Prefetch, or None when nothing is pending or the values cannot be
    prefetched (a deleted value, values on different devices); then
    `flush_buffers` does all the work and reports any error.
  """
  # pylint: disable=protected-access
  work = [b for b in buffers if b._pending]
  if not work:
    return None
  try:
    gathered = _gather(work)
    if not gathered[0]:
      return None
    launched = _launch(gathered[0])
    for array in launched[1]:
      array.copy_to_host_async()
  except Exception:  # pylint: disable=broad-except
    return None  # flush_buffers meets the same problem and names the metric.
  return Prefetch(work, gathered, launched)


def flush_buffers(buffers: Sequence[metrics_buffer.MetricsBuffer],
                  prefetch: Optional[Prefetch] = None) -> None:
  """Turns the pending values of `buffers` into their arrays; all or nothing.

  Args:
    buffers: the buffers to flush; those with nothing pending are skipped.
    prefetch: None, or what `prefetch_buffers(buffers)` returned with nothing
      buffered or flushed since; its gathering and launches then stand in
      for this flush's.

  Raises:
    ValueError: a device value was deleted before the flush (naming its
      metric).
    RuntimeError: a device value cannot be fetched (naming its metric).
    Either way no buffer and no pending value has changed.
  """
  # pylint: disable=protected-access
  work = [b for b in buffers if b._pending]
  if not work:
    return
  if prefetch is not None and prefetch.matches(work):
    # The same values as at the prefetch: its gathering and launches hold.
    (values, sizes, bases, name_of), launched = (prefetch.gathered,
                                                 prefetch.launched)
  else:
    values, sizes, bases, name_of = _gather(work)
    launched = None
  # Phase 2: few device ops and one transfer.
  flat = _fetch(values, sizes, name_of, launched) if values else {}
  # Phase 3: build every new array (nothing is committed yet).
  results = []
  for buf, base in zip(work, bases):
    scalar_segs: dict = {}
    weighted_segs: dict = {}
    pending = buf._pending
    i, n_recs = 0, len(pending)
    while i < n_recs:
      rec = pending[i]
      tag = rec[0]
      if tag == "s":
        segs = scalar_segs.get(rec[1])
        if segs is None:
          segs = scalar_segs[rec[1]] = _Segments()
        x = rec[2]
        if type(x) is tuple:  # pylint: disable=unidiomatic-typecheck
          segs.add_index(x[0], base[x[0]] + x[1])
        else:
          segs.add_array(x)
        i += 1
      elif tag == "w":
        pair = weighted_segs.get(rec[1])
        if pair is None:
          pair = weighted_segs[rec[1]] = (_Segments(), _Segments())
        for segs, x in zip(pair, rec[2:]):
          if type(x) is tuple:  # pylint: disable=unidiomatic-typecheck
            segs.add_index(x[0], base[x[0]] + x[1])
          else:
            segs.add_array(x)
        i += 1
      else:
        names, x = rec[1], rec[2]
        width = len(names)
        # A run of packed records with the same names whose values are
        # contiguous in one flat array becomes one (k, width) view.
        k = 1
        if type(x) is tuple:  # pylint: disable=unidiomatic-typecheck
          while (i + k < n_recs and pending[i + k][0] == "p" and
                 pending[i + k][1] == names and
                 type(pending[i + k][2]) is tuple and  # pylint: disable=unidiomatic-typecheck
                 pending[i + k][2] == (x[0], x[1] + k * width)):
            k += 1
          start = base[x[0]] + x[1]
          matrix = flat[x[0]][start:start + k * width].reshape(k, width)
        else:
          matrix = x.reshape(1, width)
        # One copy for the run: row j holds names[j]'s k values, contiguous,
        # in an array of the flush's own.
        columns = matrix.T.copy()
        for j, name in enumerate(names):
          segs = scalar_segs.get(name)
          if segs is None:
            segs = scalar_segs[name] = _Segments()
          segs.add_array(columns[j], owned=True)
        i += k
    new_scalars = {name: segs.build(flat, buf.scalar_metrics.get(name))
                   for name, segs in scalar_segs.items()}
    new_weighted = {}
    for name, (s_segs, d_segs) in weighted_segs.items():
      old = buf.weighted_metrics.get(name)
      new_weighted[name] = metrics_buffer.WeightedMetric(
          s_segs.build(flat, None if old is None else old.unreduced_sum),
          d_segs.build(flat, None if old is None else old.denominator))
    results.append((buf, new_scalars, new_weighted))
  # Phase 4: commit (plain assignments that cannot fail).
  for buf, new_scalars, new_weighted in results:
    buf.scalar_metrics.update(new_scalars)
    buf.weighted_metrics.update(new_weighted)
    buf._pending = []
    buf._pending_values = 0
    buf._device = {}
