"""Host-buffered training metrics, turned into arrays once per step.

A training step runs K micro-batches and each yields M metrics. Appending every
metric to a device array per micro-batch would dispatch M*K device ops per step
(and recompile for each new array length). `MetricsRecorder` instead keeps each
step's values in host Python lists and builds the arrays at `flush()`:

* the pending device values of every buffer being flushed are concatenated by
  one jitted call per up to `MAX_OPERANDS_PER_LAUNCH` (256) values, all dtypes
  together, followed by one `jax.device_get`. The engine's packed path hands
  over K arrays per step (one per micro-batch, each holding all M metrics), so
  its flush is one launch for any M and any K up to 256; a single packed array
  needs no launch at all. The per-name path hands over M*K values, so it takes
  about M*K/256 launches: XLA's compile time grows faster than linearly in the
  operand count (CPU: 256 operands 0.3 s, 1600 operands 5 s, 6400 operands
  49 s), which rules out one launch for everything;
* the flat host arrays are then split into per-name NumPy arrays (one fancy
  index or strided view per name and run, then one copy per name);
* Python numbers and NumPy values never touch a device.

Flushed arrays are NumPy 1D arrays on the host, one entry per buffered value,
in buffering order.

Two ways in, one place out:

* `buffer_metrics(step, name, metric)`: the per-name API. A `SummedMetric`
  is buffered as its value with `aggregation_fn=sum_values`, so the step's
  value of a count is the sum over micro-batches, not their mean.
* `buffer_packed(step, names, packed)`: the fast path for a jitted step that
  returns its scalar metrics packed in one array of shape `(len(names),)`. The
  K packed arrays of a step are concatenated once at flush; column `j` becomes
  the scalar entry `names[j]` of the same `MetricsBuffer`, under the same
  all-or-nothing flush.

Decisions on values (validated on the host, with no device op and no transfer:
only Python types, NumPy values and the metadata of JAX arrays are inspected;
dtypes and shapes by `maxtext.metrics.values`, the one check the engine's
packing applies too):

* Accepted: Python `int` (stored as int64; out of range is a ValueError) and
  `float` (float64); NumPy and JAX values of shape `()` or `(1,)` with an
  integer or floating dtype (bfloat16 included), dtype kept. A name whose values
  mix dtypes gets NumPy's promoted dtype at flush (bfloat16 and the other
  ml_dtypes floats widen to float32 where NumPy has no rule, e.g. with int64).
* NaN and +/-inf are data, not errors: the training loop's non-finite policy
  acts on flushed values, and a recorder that dropped or rejected them would
  hide exactly the steps worth seeing.
* Booleans (Python `bool`, `np.bool_`, bool arrays) are rejected with TypeError:
  `bool` is an `int` subclass, so a flag passed where a number was meant
  (`loss > x` for `loss`) would be averaged silently. Cast explicitly.
* Complex numbers and complex dtypes are rejected with TypeError: metrics are
  logged as real numbers (JSON, TensorBoard) and there is no lossless cast.
* str, None, dict, list, tuple, object and string arrays, PRNG keys, tracers
  (a value inside `jit`), deleted JAX arrays and any other shape are rejected.
* A metric keeps one kind (scalar or weighted) within a buffer, across both
  paths. A name keeps one `aggregation_fn` within a buffer: passing a different
  callable object later raises ValueError (pass the same function object).

Every rejection raises TypeError or ValueError naming the metric and the value,
and nothing enters any buffer (no empty buffer is created either).

The recorder is not thread-safe: one training loop owns it.

The data types live in `maxtext.metrics.buffer`, the pending state (one
`PendingBuffer` per `MetricsBuffer`, owned by the recorder) in
`maxtext.metrics.pending` and the flush machinery in `maxtext.metrics.flush`;
this module re-exports `WeightedMetric`, `SummedMetric`, `sum_values`,
`MetricsBuffer` and `MAX_OPERANDS_PER_LAUNCH`, so callers import only it.
"""

from __future__ import annotations

import collections
from typing import Mapping, Optional

from absl import logging
import jax
import numpy as np

from maxtext.core import checks
from maxtext.metrics import buffer as metrics_buffer
from maxtext.metrics import flush as metrics_flush
from maxtext.metrics import pending as metrics_pending
from maxtext.metrics import values as metric_values

AggregationFn = metrics_buffer.AggregationFn
MetricsBuffer = metrics_buffer.MetricsBuffer
WeightedMetric = metrics_buffer.WeightedMetric
SummedMetric = metrics_buffer.SummedMetric
sum_values = metrics_buffer.sum_values
MAX_OPERANDS_PER_LAUNCH = metrics_flush.MAX_OPERANDS_PER_LAUNCH

# Concrete JAX array classes seen so far (learned, not imported privately);
# values of these classes take the validation fast path.
_concrete_array_types: set = set()

_SCALAR = metrics_pending.SCALAR
_WEIGHTED = metrics_pending.WEIGHTED
# How many distinct well-formed names tuples a recorder remembers.
_MAX_VALID_NAMES = 1024


# --------------------------------------------------------------------------
# Validation (host only).


def _host_or_device_scalar(name: str, value, what: str = "value"):
  """Validates one scalar; returns a JAX array or a NumPy (1,) array copy."""
  cls = type(value)
  if cls in _concrete_array_types:  # The common case: a concrete JAX array.
    verdict = metric_values.dtype_verdicts.get(value.dtype, "")
    if (
        verdict is None
        and value.shape in metric_values.SCALAR_SHAPES
        and not value.is_deleted()
    ):
      return value
  if cls is float:
    return np.array([value], np.float64)
  if cls is int:
    try:
      return np.array([value], np.int64)
    except OverflowError:
      raise metric_values.error(
          ValueError, name, f"{what} does not fit in int64", value
      ) from None
  if isinstance(value, (bool, np.bool_)):
    raise metric_values.error(
        TypeError, name, f"{what} is a boolean (cast to int or float)", value
    )
  if isinstance(value, jax.Array):
    if isinstance(value, jax.core.Tracer):
      raise metric_values.error(
          TypeError,
          name,
          f"{what} is a traced value; buffer metrics outside jit",
          value,
      )
    metric_values.check_scalar(name, value.dtype, value.shape, value, what)
    if value.is_deleted():
      raise metric_values.error(
          ValueError, name, f"{what} has a deleted device buffer", value
      )
    _concrete_array_types.add(cls)
    return value
  if isinstance(value, (np.ndarray, np.generic)):
    metric_values.check_scalar(name, value.dtype, np.shape(value), value, what)
    return np.array(value, copy=True).reshape(1)
  if isinstance(value, (int, float)):  # Subclasses of int/float.
    return _host_or_device_scalar(
        name, (float if isinstance(value, float) else int)(value), what
    )
  if isinstance(value, complex):
    raise metric_values.error(
        TypeError, name, f"{what} is a complex number", value
    )
  raise metric_values.error(
      TypeError,
      name,
      f"{what} must be a Python int/float, a NumPy or JAX numeric "
      "scalar, or a WeightedMetric of such",
      value,
  )


def _check_step(step) -> int:
  """`step` as an int; TypeError/ValueError unless a non-negative int."""
  # A plain int (every step the engine passes) skips the numbers-ABC check,
  # which costs about as much as the rest of buffering a value.
  if step.__class__ is not int and not checks.is_int(step):
    raise TypeError(
        "step must be a non-negative int; got "
        f"{metrics_buffer.describe(step)}"
    )
  if step < 0:
    raise ValueError(f"step must be a non-negative int; got {step!r}")
  return int(step)


def _check_name(name) -> None:
  if not isinstance(name, str) or not name:
    raise (TypeError if not isinstance(name, str) else ValueError)(
        "metric name must be a non-empty str; got "
        f"{metrics_buffer.describe(name)}"
    )


def _check_aggregation_fn(name, fn) -> None:
  if fn is not None and not callable(fn):
    raise TypeError(
        f"metric {name!r}: aggregation_fn must be None or "
        f"callable; got {metrics_buffer.describe(fn)}"
    )


# --------------------------------------------------------------------------
# The recorder.


class MetricsRecorder:
  """Buffers metrics on the host per step and builds arrays at flush."""

  def __init__(self, mode: str = "train", max_history: int = 128):
    """Creates a recorder.

    Args:
      mode: a label copied to every buffer ("train", "eval", ...).
      max_history: how many step buffers to keep; the oldest is evicted, with a
        logged warning, when a new buffer would exceed it.

    Raises:
      TypeError/ValueError: on a bad `mode` or `max_history`.
    """
    if not isinstance(mode, str) or not mode:
      raise ValueError(f"mode must be a non-empty str; got {mode!r}")
    self._max_history = checks.check_int("max_history", max_history, minimum=1)
    self._mode = mode
    # The buffers, oldest first: the public results.
    self._history: collections.deque[MetricsBuffer] = collections.deque()
    # Buffer -> its pending state, for every buffer of the history (in the
    # same order): what waits for a flush and what new values are checked
    # against. Only the recorder holds these.
    self._pending: dict[MetricsBuffer, metrics_pending.PendingBuffer] = {}
    # The device side of the next flush, dispatched by prefetch(); anything
    # that buffers or flushes values drops it.
    self._prefetch: Optional[metrics_flush.Prefetch] = None
    # Names tuples of buffer_packed already found well formed (a jitted step
    # hands the same tuple every micro-batch of every step).
    self._valid_names: set[tuple[str, ...]] = set()

  @property
  def mode(self) -> str:
    return self._mode

  @property
  def max_history(self) -> int:
    return self._max_history

  # -- buffering -----------------------------------------------------------

  def _target(self, step: int) -> Optional[metrics_pending.PendingBuffer]:
    """The buffer a value for `step` goes to, or None if a new one starts."""
    if self._history and self._history[-1].step == step:
      return self._pending[self._history[-1]]
    return None

  def _open(self, step: int) -> metrics_pending.PendingBuffer:
    """The buffer for `step`, starting one (and evicting the oldest)."""
    self._prefetch = None  # A value is about to be buffered.
    target = self._target(step)
    if target is not None:
      return target
    buf = MetricsBuffer(step=step, mode=self._mode)
    target = self._pending[buf] = metrics_pending.PendingBuffer(buf)
    self._history.append(buf)
    while len(self._history) > self._max_history:
      old = self._history.popleft()
      del self._pending[old]  # Its pending values go with it.
      logging.warning(
          "MetricsRecorder(%s): history passed max_history=%d; evicting the "
          "buffer of step %d with %d pending values.",
          self._mode,
          self._max_history,
          old.step,
          old.pending_count,
      )
    return target

  @staticmethod
  def _check_fn_conflict(
      target: Optional[metrics_pending.PendingBuffer], name, fn
  ) -> None:
    if target is None or fn is None:
      return
    old = target.buffer.aggregation_fns.get(name)
    if old is not None and old is not fn:
      raise ValueError(
          f"metric {name!r}: aggregation_fn {fn!r} differs from {old!r} given "
          f"earlier for step {target.buffer.step}"
      )

  def buffer_metrics(
      self,
      step: int,
      name: str,
      metric,
      aggregation_fn: Optional[AggregationFn] = None,
  ) -> None:
    """Buffers one value on the host; no device op, no transfer.

    Args:
      step: a non-negative int.
      name: a non-empty str.
      metric: a Python int/float, a NumPy or JAX scalar (shape () or (1,),
        numeric dtype), a WeightedMetric of two such values, or a
        SummedMetric of one (buffered as its value, reduced by its sum).
      aggregation_fn: None or a callable reducing the flushed values (the 1D
        array, or the WeightedMetric of 1D arrays) to a scalar; see
        `reduce_buffer`. None for a SummedMetric, whose aggregation is
        `sum_values`.

    Raises:
      TypeError/ValueError: naming the metric and the value; nothing is
        buffered.
    """
    step = _check_step(step)
    _check_name(name)
    _check_aggregation_fn(name, aggregation_fn)
    if isinstance(metric, SummedMetric):
      if aggregation_fn is not None:
        raise ValueError(
            f"metric {name!r}: a SummedMetric is reduced by its sum; "
            f"aggregation_fn must be None, got {aggregation_fn!r}"
        )
      if isinstance(metric.value, (WeightedMetric, SummedMetric)):
        raise metric_values.error(
            TypeError,
            name,
            "a SummedMetric holds one scalar",
            metric,
        )
      metric, aggregation_fn = metric.value, sum_values
    if isinstance(metric, WeightedMetric):
      kind = _WEIGHTED
      values = (
          _host_or_device_scalar(name, metric.unreduced_sum, "unreduced_sum"),
          _host_or_device_scalar(name, metric.denominator, "denominator"),
      )
    else:
      kind = _SCALAR
      values = (_host_or_device_scalar(name, metric),)
    target = self._target(step)
    if target is not None:
      old_kind = target.kinds.get(name)
      if old_kind is not None and old_kind != kind:
        raise ValueError(
            f"metric {name!r}: is {old_kind} in step {step}, cannot buffer a "
            f"{kind} value; got {metrics_buffer.describe(metric)}"
        )
      self._check_fn_conflict(target, name, aggregation_fn)
    target = self._open(step)
    if kind == _SCALAR:
      target.add_scalar(name, values[0])
    else:
      target.add_weighted(name, values[0], values[1])
    if aggregation_fn is not None:
      target.buffer.aggregation_fns[name] = aggregation_fn

  def buffer_packed(
      self,
      step: int,
      names: tuple[str, ...],
      packed,
      aggregation_fns: Optional[Mapping[str, AggregationFn]] = None,
  ) -> None:
    """Buffers scalar metrics packed in one array; no device op, no transfer.

    Args:
      step: a non-negative int.
      names: a tuple of distinct non-empty str, one per entry of `packed`.
      packed: a JAX or NumPy array of shape (len(names),), numeric dtype;
        entry j is one value of the scalar metric names[j].
      aggregation_fns: None or a mapping from some of `names` to callables, as
        in `buffer_metrics`.

    Raises:
      TypeError/ValueError: naming the metric and the value; nothing is
        buffered.
    """
    step = _check_step(step)
    if not isinstance(names, tuple):
      raise TypeError(
          "names must be a tuple of str; got "
          f"{metrics_buffer.describe(names)}"
      )
    target = self._target(step)
    self._check_packed_names(step, names, target)
    value = _packed_value(names, packed)
    if aggregation_fns is not None:
      self._check_packed_fns(target, names, aggregation_fns)
    target = self._open(step)
    target.add_packed(names, value)
    if aggregation_fns:
      for name, fn in aggregation_fns.items():
        if fn is not None:
          target.buffer.aggregation_fns[name] = fn

  def _check_packed_names(self, step: int, names: tuple, target) -> None:
    """`buffer_packed`'s names: valid, distinct, and scalars in `step`.

    A tuple seen before (in this step's target, or among the recently
    validated ones) is not checked again."""
    if target is not None and names in target.packed_names:
      return
    if names not in self._valid_names:
      if not names:
        raise ValueError("names must not be empty")
      for name in names:
        _check_name(name)
      if len(set(names)) != len(names):
        dup = sorted(n for n in set(names) if names.count(n) > 1)
        raise ValueError(f"names must be distinct; repeated: {dup}")
      if len(self._valid_names) >= _MAX_VALID_NAMES:
        self._valid_names.clear()
      self._valid_names.add(names)
    if target is not None:
      for name in names:
        if target.kinds.get(name, _SCALAR) != _SCALAR:
          raise ValueError(
              f"metric {name!r}: is weighted in step {step}, cannot buffer "
              "a scalar value through buffer_packed"
          )

  def _check_packed_fns(self, target, names: tuple, aggregation_fns) -> None:
    """`buffer_packed`'s aggregation functions: a mapping over `names`."""
    if not isinstance(aggregation_fns, Mapping):
      raise TypeError(
          "aggregation_fns must be None or a mapping; got "
          f"{metrics_buffer.describe(aggregation_fns)}"
      )
    for name, fn in aggregation_fns.items():
      if name not in names:
        raise ValueError(
            f"aggregation_fns names {name!r}, which is not in names"
        )
      _check_aggregation_fn(name, fn)
      self._check_fn_conflict(target, name, fn)

  # -- flushing and reading ------------------------------------------------

  def prefetch(self) -> None:
    """Dispatches the device side of the next `flush()` without waiting.

    The pending values' concatenations are launched and their copies to the
    host started; the next `flush()` takes them if nothing was buffered or
    flushed in between (otherwise they are dropped and `flush()` does the
    work). Device work dispatched after `prefetch()` queues behind these
    launches, so the flush does not wait for it. Never raises and changes
    nothing: a value that cannot be fetched is reported by `flush()`.
    """
    self._prefetch = metrics_flush.prefetch(list(self._pending.values()))

  def check_flushable(self) -> None:
    """Raises now what `flush()` would raise for a value the host can see
    is lost (a device value deleted after it was buffered), naming the
    metric. No device op, no transfer, nothing changes; a value whose
    device computation fails is only found by `flush()`.

    Raises:
      ValueError: naming the metric whose device buffer was deleted.
    """
    metrics_flush.check(list(self._pending.values()))

  def flush(self) -> None:
    """Turns every pending value into its buffer's arrays; all or nothing.

    Raises:
      ValueError/RuntimeError: naming the metric whose value cannot be
        fetched; then no buffer and no pending value has changed.
    """
    prefetched, self._prefetch = self._prefetch, None
    self._flush(list(self._pending.values()), prefetched)

  @staticmethod
  def _flush(
      targets: list[metrics_pending.PendingBuffer],
      prefetched: Optional[metrics_flush.Prefetch] = None,
  ) -> None:
    # Every new array is built before anything is stored: if the build
    # raises, no buffer and no pending value has changed.
    updates = metrics_flush.build(targets, prefetched)
    metrics_flush.commit(updates)

  def get_step_metrics(self, step: int) -> Optional[MetricsBuffer]:
    """The newest buffer of `step`, flushed, or None."""
    step = _check_step(step)
    self._prefetch = None
    for buf in reversed(self._history):
      if buf.step == step:
        self._flush([self._pending[buf]])
        return buf
    return None

  def get_metrics_history(self, clear: bool = False) -> list[MetricsBuffer]:
    """Flushes, then returns the buffers oldest first; `clear` drops them."""
    self.flush()
    history = list(self._history)
    if clear:
      self._history.clear()
      self._pending.clear()
    return history

  def cleanup(self) -> None:
    """Drops every buffer and its pending values."""
    self._prefetch = None
    self._history.clear()
    self._pending.clear()

  def pending_count(self) -> int:
    """Number of values waiting for a flush, over all buffers."""
    return sum(buf.pending_count for buf in self._history)


def reduce_buffer(buffer: MetricsBuffer) -> dict[str, float]:
  """Reduces each metric of a flushed buffer to a float.

  Scalar metrics use their aggregation_fn (given the 1D array; `sum_values`
  for a SummedMetric) or the mean;
  weighted metrics use their aggregation_fn (given the WeightedMetric of 1D
  arrays) or sum(unreduced_sum) / sum(denominator), 0 for a zero denominator.

  Args:
    buffer: a flushed MetricsBuffer.

  Returns:
    name -> float, names sorted.

  Raises:
    ValueError: if the buffer has pending values, or an aggregation_fn does not
      return a scalar (naming the metric).
  """
  if buffer.pending_count:
    raise ValueError(
        f"buffer of step {buffer.step} has "
        f"{buffer.pending_count} pending values; flush first"
    )
  out = {}
  for name, values in buffer.scalar_metrics.items():
    fn = buffer.aggregation_fns.get(name)
    out[name] = _to_float(name, fn(values) if fn else mean(values))
  for name, wm in buffer.weighted_metrics.items():
    fn = buffer.aggregation_fns.get(name)
    if fn:
      reduced = fn(wm)
    else:
      reduced = WeightedMetric(
          np.sum(wm.unreduced_sum), np.sum(wm.denominator)
      ).compute()
    out[name] = _to_float(name, reduced)
  return dict(sorted(out.items()))


def mean(values: np.ndarray):
  """`np.mean(values)`, the same value bit for bit, at a fraction of its
  per-call cost for the short float arrays a step's record holds.

  For a 1D float32 or float64 array, `np.mean` is the array's sum (the same
  `np.add.reduce`) divided by the element count as a NumPy integer, cast
  back to the array's dtype; this does just that. Other arrays (integers,
  float16, bfloat16, empty ones) go to `np.mean` itself.
  """
  if (
      isinstance(values, np.ndarray)
      and values.ndim == 1
      and values.size
      and values.dtype in _SUMMED_IN_OWN_DTYPE
  ):
    total = np.add.reduce(values)
    return total.dtype.type(total / np.intp(values.size))
  return np.mean(values)


# The dtypes whose np.mean accumulates and divides in the dtype itself.
_SUMMED_IN_OWN_DTYPE = (np.dtype(np.float32), np.dtype(np.float64))


def _to_float(name: str, value) -> float:
  if np.shape(value) not in ((), (1,)):
    raise ValueError(
        f"metric {name!r}: aggregation_fn must return a scalar; "
        f"got shape {np.shape(value)}"
    )
  return float(np.asarray(value).reshape(()))


def _packed_value(names: tuple, packed):
  """`buffer_packed`'s array, checked: a concrete JAX array (kept) or a NumPy
  array (copied) of shape (len(names),) and a numeric dtype."""
  label = f"{names[0]}... (packed)"
  if isinstance(packed, jax.Array):
    if isinstance(packed, jax.core.Tracer):
      raise metric_values.error(
          TypeError,
          label,
          "packed is a traced value; buffer metrics outside jit",
          packed,
      )
    value = packed
  elif isinstance(packed, np.ndarray):
    value = np.array(packed, copy=True)
  else:
    raise metric_values.error(
        TypeError, label, "packed must be a JAX or NumPy array", packed
    )
  problem = metric_values.dtype_problem(value.dtype)
  if problem:
    raise metric_values.error(TypeError, label, f"packed {problem}", packed)
  if value.shape != (len(names),):
    raise metric_values.error(
        ValueError, label, f"packed must have shape ({len(names)},)", packed
    )
  if isinstance(value, jax.Array) and value.is_deleted():
    raise metric_values.error(
        ValueError, label, "packed has a deleted device buffer", packed
    )
  return value
