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

* `buffer_metrics(step, name, metric)`: the per-name API.
* `buffer_packed(step, names, packed)`: the fast path for a jitted step that
  returns its scalar metrics packed in one array of shape `(len(names),)`. The
  K packed arrays of a step are concatenated once at flush; column `j` becomes
  the scalar entry `names[j]` of the same `MetricsBuffer`, under the same
  all-or-nothing flush.

Decisions on values (validated on the host, with no device op and no transfer:
only Python types, NumPy values and the metadata of JAX arrays are inspected):

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
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

AggregationFn = Callable[[Any], Any]

# Concrete JAX array classes seen so far (learned, not imported privately);
# values of these classes take the validation fast path.
_concrete_array_types: set = set()

_SCALAR = "scalar"
_WEIGHTED = "weighted"


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
  """

  step: int
  mode: str
  scalar_metrics: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  weighted_metrics: dict[str, WeightedMetric] = dataclasses.field(
      default_factory=dict)
  aggregation_fns: dict[str, AggregationFn] = dataclasses.field(
      default_factory=dict)
  # Records in buffering order: ("s", name, x), ("w", name, x_sum, x_den) or
  # ("p", names, x). Each x is a NumPy array (a host value: shape (1,), packed
  # (len(names),)) or the slot (dtype, element offset) of a device value in
  # `_device`.
  _pending: list = dataclasses.field(default_factory=list, repr=False)
  _pending_values: int = dataclasses.field(default=0, repr=False)
  # dtype -> [pending device values in buffering order, their total size].
  _device: dict = dataclasses.field(default_factory=dict, repr=False)
  _kinds: dict = dataclasses.field(default_factory=dict, repr=False)
  _packed_names_ok: set = dataclasses.field(default_factory=set, repr=False)

  @property
  def pending_count(self) -> int:
    """Values of this buffer waiting for a flush."""
    return self._pending_values

  def _hold(self, x, size: int = 1):
    """Keeps a validated value: NumPy as it is, a device value in a slot."""
    if isinstance(x, np.ndarray):
      return x
    group = self._device.get(x.dtype)
    if group is None:
      group = self._device[x.dtype] = [[], 0]
    offset = group[1]
    group[0].append(x)
    group[1] = offset + size
    return (x.dtype, offset)


# --------------------------------------------------------------------------
# Validation (host only).

_dtype_verdicts: dict[Any, Optional[str]] = {}


def _dtype_problem(dtype) -> Optional[str]:
  """None if `dtype` is an accepted metric dtype, else why not."""
  try:
    return _dtype_verdicts[dtype]
  except (KeyError, TypeError):
    pass
  if jnp.issubdtype(dtype, jnp.bool_):
    verdict = "boolean dtype is not accepted (cast to int or float)"
  elif jnp.issubdtype(dtype, jnp.complexfloating):
    verdict = "complex dtype is not accepted"
  elif jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(
      dtype, jnp.floating):
    verdict = None
  else:
    verdict = f"dtype {dtype} is not numeric"
  try:
    _dtype_verdicts[dtype] = verdict
  except TypeError:
    pass
  return verdict


def _describe(value) -> str:
  """A description of `value` that never reads device memory."""
  if isinstance(value, jax.Array):
    kind = "tracer" if isinstance(value, jax.core.Tracer) else "jax.Array"
    return f"{kind}(shape={tuple(value.shape)}, dtype={value.dtype})"
  text = repr(value)
  return text if len(text) <= 120 else text[:117] + "..."


def _bad(exc_type, name, problem, value):
  return exc_type(f"metric {name!r}: {problem}; got {_describe(value)}")


def _host_or_device_scalar(name: str, value, what: str = "value"):
  """Validates one scalar; returns a JAX array or a NumPy (1,) array copy."""
  cls = type(value)
  if cls in _concrete_array_types:  # The common case: a concrete JAX array.
    verdict = _dtype_verdicts.get(value.dtype, "")
    if (verdict is None and value.shape in ((), (1,)) and
        not value.is_deleted()):
      return value
  if cls is float:
    return np.array([value], np.float64)
  if cls is int:
    try:
      return np.array([value], np.int64)
    except OverflowError:
      raise _bad(ValueError, name, f"{what} does not fit in int64",
                 value) from None
  if isinstance(value, (bool, np.bool_)):
    raise _bad(TypeError, name,
               f"{what} is a boolean (cast to int or float)", value)
  if isinstance(value, jax.Array):
    if isinstance(value, jax.core.Tracer):
      raise _bad(TypeError, name,
                 f"{what} is a traced value; buffer metrics outside jit",
                 value)
    problem = _dtype_problem(value.dtype)
    if problem:
      raise _bad(TypeError, name, f"{what} {problem}", value)
    if value.shape not in ((), (1,)):
      raise _bad(ValueError, name, f"{what} must have shape () or (1,)",
                 value)
    if value.is_deleted():
      raise _bad(ValueError, name, f"{what} has a deleted device buffer",
                 value)
    _concrete_array_types.add(cls)
    return value
  if isinstance(value, (np.ndarray, np.generic)):
    problem = _dtype_problem(value.dtype)
    if problem:
      raise _bad(TypeError, name, f"{what} {problem}", value)
    if np.shape(value) not in ((), (1,)):
      raise _bad(ValueError, name, f"{what} must have shape () or (1,)",
                 value)
    return np.array(value, copy=True).reshape(1)
  if isinstance(value, (int, float)):  # Subclasses of int/float.
    return _host_or_device_scalar(name, (float if isinstance(value, float)
                                         else int)(value), what)
  if isinstance(value, complex):
    raise _bad(TypeError, name, f"{what} is a complex number", value)
  raise _bad(TypeError, name,
             f"{what} must be a Python int/float, a NumPy or JAX numeric "
             "scalar, or a WeightedMetric of such", value)


def _check_step(step) -> int:
  if isinstance(step, (bool, np.bool_)) or not isinstance(
      step, (int, np.integer)):
    raise TypeError(f"step must be a non-negative int; got {_describe(step)}")
  if step < 0:
    raise ValueError(f"step must be a non-negative int; got {step!r}")
  return int(step)


def _check_name(name) -> None:
  if not isinstance(name, str) or not name:
    raise (TypeError if not isinstance(name, str) else ValueError)(
        f"metric name must be a non-empty str; got {_describe(name)}")


def _check_aggregation_fn(name, fn) -> None:
  if fn is not None and not callable(fn):
    raise TypeError(f"metric {name!r}: aggregation_fn must be None or "
                    f"callable; got {_describe(fn)}")


# --------------------------------------------------------------------------
# Flush machinery.


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


def _fetch(values: dict, sizes: dict, name_of) -> dict:
  """Brings every device value to the host with few device ops.

  Each dtype's values are cut into chunks of at most MAX_OPERANDS_PER_LAUNCH
  values, each padded to a power of two by repeating its first value; chunks
  are packed into jitted concatenation calls of at most MAX_OPERANDS_PER_LAUNCH
  operands. Up to that many device values therefore take one launch whatever
  their dtypes; more take about one launch per MAX_OPERANDS_PER_LAUNCH values.
  A dtype holding a single 1D value needs no launch. One `jax.device_get` then
  brings every result to the host. Values that cannot share one computation
  (arrays committed to different devices) make a call fail; then each value
  is copied to the host on its own: no launch, one transfer per value.

  Args:
    values: dtype -> device arrays, in offset order.
    sizes: dtype -> total number of elements of those arrays.
    name_of: (dtype, index in values[dtype]) -> metric name, for errors.

  Returns:
    dtype -> flat NumPy array of sizes[dtype] elements.
  """
  keys = list(values)
  chunks, fetched = [], []  # fetched: (dtype, chunk index or None)
  for k in keys:
    vals = values[k]
    if len(vals) == 1 and vals[0].ndim == 1:
      fetched.append((k, None))
      continue
    for i in range(0, len(vals), MAX_OPERANDS_PER_LAUNCH):
      chunk = vals[i:i + MAX_OPERANDS_PER_LAUNCH]
      chunk = chunk + chunk[:1] * (_padded_arity(len(chunk)) - len(chunk))
      chunks.append(tuple(chunk))
      fetched.append((k, len(chunks) - 1))
  try:
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
    host = jax.device_get([values[k][0] if c is None else chunk_outputs[c]
                           for k, c in fetched])
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
                         f"{_describe(value)} from the device: {exc}"
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


def _owner_name(buf: MetricsBuffer, dtype, index: int) -> str:
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

  __slots__ = ("items",)

  def __init__(self):
    self.items = []

  def add_index(self, dtype, offset: int) -> None:
    items = self.items
    if items and type(items[-1]) is list and items[-1][0] == dtype:  # pylint: disable=unidiomatic-typecheck
      items[-1][1].append(offset)
    else:
      items.append([dtype, [offset]])

  def add_array(self, array: np.ndarray) -> None:
    self.items.append(array)

  def build(self, flat: dict, old: Optional[np.ndarray]) -> np.ndarray:
    pieces = [] if old is None else [old]
    for item in self.items:
      if type(item) is list:  # pylint: disable=unidiomatic-typecheck
        pieces.append(flat[item[0]][np.asarray(item[1], np.intp)])
      else:
        pieces.append(item)
    return _concat(pieces)


def _flush_buffers(buffers: Sequence[MetricsBuffer]) -> None:
  """All-or-nothing flush of `buffers`; raises naming the metric on failure."""
  # pylint: disable=protected-access
  work = [b for b in buffers if b._pending]
  if not work:
    return
  # Phase 1: every buffer's device values, per dtype, one after the other.
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
              f"deleted before flush ({_describe(v)})")
      lst.extend(vals)
      sizes[dt] += size
    bases.append(base)

  def name_of(dt, index):
    start, owner = max((o for o in owners[dt] if o[0] <= index),
                       key=lambda o: o[0])
    return _owner_name(owner, dt, index - start)

  # Phase 2: few device ops and one transfer.
  flat = _fetch(values, sizes, name_of) if values else {}
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
        for j, name in enumerate(names):
          segs = scalar_segs.get(name)
          if segs is None:
            segs = scalar_segs[name] = _Segments()
          segs.add_array(matrix[:, j])
        i += k
    new_scalars = {name: segs.build(flat, buf.scalar_metrics.get(name))
                   for name, segs in scalar_segs.items()}
    new_weighted = {}
    for name, (s_segs, d_segs) in weighted_segs.items():
      old = buf.weighted_metrics.get(name)
      new_weighted[name] = WeightedMetric(
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
    if isinstance(max_history, bool) or not isinstance(max_history, int):
      raise TypeError(f"max_history must be an int; got {max_history!r}")
    if max_history < 1:
      raise ValueError(f"max_history must be >= 1; got {max_history!r}")
    self._mode = mode
    self._max_history = max_history
    self._history: collections.deque[MetricsBuffer] = collections.deque()

  @property
  def mode(self) -> str:
    return self._mode

  @property
  def max_history(self) -> int:
    return self._max_history

  # -- buffering -----------------------------------------------------------

  def _target(self, step: int) -> Optional[MetricsBuffer]:
    """The buffer a value for `step` goes to, or None if a new one starts."""
    if self._history and self._history[-1].step == step:
      return self._history[-1]
    return None

  def _open(self, step: int) -> MetricsBuffer:
    buf = self._target(step)
    if buf is not None:
      return buf
    buf = MetricsBuffer(step=step, mode=self._mode)
    self._history.append(buf)
    while len(self._history) > self._max_history:
      old = self._history.popleft()
      logging.warning(
          "MetricsRecorder(%s): history passed max_history=%d; evicting the "
          "buffer of step %d with %d pending values.", self._mode,
          self._max_history, old.step, old.pending_count)
    return buf

  @staticmethod
  def _check_fn_conflict(buf, name, fn) -> None:
    if buf is None or fn is None:
      return
    old = buf.aggregation_fns.get(name)
    if old is not None and old is not fn:
      raise ValueError(
          f"metric {name!r}: aggregation_fn {fn!r} differs from {old!r} given "
          f"earlier for step {buf.step}")

  def buffer_metrics(self, step: int, name: str, metric,
                     aggregation_fn: Optional[AggregationFn] = None) -> None:
    """Buffers one value on the host; no device op, no transfer.

    Args:
      step: a non-negative int.
      name: a non-empty str.
      metric: a Python int/float, a NumPy or JAX scalar (shape () or (1,),
        numeric dtype), or a WeightedMetric of two such values.
      aggregation_fn: None or a callable reducing the flushed values (the 1D
        array, or the WeightedMetric of 1D arrays) to a scalar; see
        `reduce_buffer`.

    Raises:
      TypeError/ValueError: naming the metric and the value; nothing is
        buffered.
    """
    step = _check_step(step)
    _check_name(name)
    _check_aggregation_fn(name, aggregation_fn)
    if isinstance(metric, WeightedMetric):
      kind = _WEIGHTED
      values = (_host_or_device_scalar(name, metric.unreduced_sum,
                                       "unreduced_sum"),
                _host_or_device_scalar(name, metric.denominator,
                                       "denominator"))
    else:
      kind = _SCALAR
      values = (_host_or_device_scalar(name, metric),)
    buf = self._target(step)
    if buf is not None:
      old_kind = buf._kinds.get(name)  # pylint: disable=protected-access
      if old_kind is not None and old_kind != kind:
        raise ValueError(
            f"metric {name!r}: is {old_kind} in step {step}, cannot buffer a "
            f"{kind} value; got {_describe(metric)}")
      self._check_fn_conflict(buf, name, aggregation_fn)
    buf = self._open(step)
    # pylint: disable=protected-access
    buf._kinds[name] = kind
    if kind == _SCALAR:
      buf._pending.append(("s", name, buf._hold(values[0])))
    else:
      buf._pending.append(("w", name, buf._hold(values[0]),
                           buf._hold(values[1])))
    buf._pending_values += 1
    if aggregation_fn is not None:
      buf.aggregation_fns[name] = aggregation_fn

  def buffer_packed(self, step: int, names: tuple[str, ...], packed,
                    aggregation_fns: Optional[Mapping[str,
                                                      AggregationFn]] = None
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
      raise TypeError(f"names must be a tuple of str; got {_describe(names)}")
    buf = self._target(step)
    known = buf is not None and names in buf._packed_names_ok  # pylint: disable=protected-access
    if not known:
      if not names:
        raise ValueError("names must not be empty")
      for name in names:
        _check_name(name)
      if len(set(names)) != len(names):
        dup = sorted(n for n in set(names) if names.count(n) > 1)
        raise ValueError(f"names must be distinct; repeated: {dup}")
      if buf is not None:
        for name in names:
          if buf._kinds.get(name, _SCALAR) != _SCALAR:  # pylint: disable=protected-access
            raise ValueError(
                f"metric {name!r}: is weighted in step {step}, cannot buffer "
                "a scalar value through buffer_packed")
    label = f"{names[0]}... (packed)"
    if isinstance(packed, jax.Array):
      if isinstance(packed, jax.core.Tracer):
        raise _bad(TypeError, label,
                   "packed is a traced value; buffer metrics outside jit",
                   packed)
      value = packed
    elif isinstance(packed, np.ndarray):
      value = np.array(packed, copy=True)
    else:
      raise _bad(TypeError, label, "packed must be a JAX or NumPy array",
                 packed)
    problem = _dtype_problem(value.dtype)
    if problem:
      raise _bad(TypeError, label, f"packed {problem}", packed)
    if value.shape != (len(names),):
      raise _bad(ValueError, label,
                 f"packed must have shape ({len(names)},)", packed)
    if isinstance(value, jax.Array) and value.is_deleted():
      raise _bad(ValueError, label, "packed has a deleted device buffer",
                 packed)
    if aggregation_fns is not None:
      if not isinstance(aggregation_fns, Mapping):
        raise TypeError("aggregation_fns must be None or a mapping; got "
                        f"{_describe(aggregation_fns)}")
      for name, fn in aggregation_fns.items():
        if name not in names:
          raise ValueError(f"aggregation_fns names {name!r}, which is not in "
                           "names")
        _check_aggregation_fn(name, fn)
        self._check_fn_conflict(buf, name, fn)
    buf = self._open(step)
    # pylint: disable=protected-access
    if names not in buf._packed_names_ok:
      for name in names:
        buf._kinds[name] = _SCALAR
      buf._packed_names_ok.add(names)
    buf._pending.append(("p", names, buf._hold(value, len(names))))
    buf._pending_values += len(names)
    if aggregation_fns:
      for name, fn in aggregation_fns.items():
        if fn is not None:
          buf.aggregation_fns[name] = fn

  # -- flushing and reading ------------------------------------------------

  def flush(self) -> None:
    """Turns every pending value into its buffer's arrays; all or nothing.

    Raises:
      ValueError/RuntimeError: naming the metric whose value cannot be
        fetched; then no buffer and no pending value has changed.
    """
    _flush_buffers(list(self._history))

  def get_step_metrics(self, step: int) -> Optional[MetricsBuffer]:
    """The newest buffer of `step`, flushed, or None."""
    step = _check_step(step)
    for buf in reversed(self._history):
      if buf.step == step:
        _flush_buffers([buf])
        return buf
    return None

  def get_metrics_history(self, clear: bool = False) -> list[MetricsBuffer]:
    """Flushes, then returns the buffers oldest first; `clear` drops them."""
    self.flush()
    history = list(self._history)
    if clear:
      self._history.clear()
    return history

  def cleanup(self) -> None:
    """Drops every buffer and its pending values."""
    self._history.clear()

  def pending_count(self) -> int:
    """Number of values waiting for a flush, over all buffers."""
    return sum(b.pending_count for b in self._history)


def reduce_buffer(buffer: MetricsBuffer) -> dict[str, float]:
  """Reduces each metric of a flushed buffer to a float.

  Scalar metrics use their aggregation_fn (given the 1D array) or the mean;
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
    raise ValueError(f"buffer of step {buffer.step} has "
                     f"{buffer.pending_count} pending values; flush first")
  out = {}
  for name, values in buffer.scalar_metrics.items():
    fn = buffer.aggregation_fns.get(name)
    out[name] = _to_float(name, fn(values) if fn else np.mean(values))
  for name, wm in buffer.weighted_metrics.items():
    fn = buffer.aggregation_fns.get(name)
    if fn:
      reduced = fn(wm)
    else:
      reduced = WeightedMetric(np.sum(wm.unreduced_sum),
                               np.sum(wm.denominator)).compute()
    out[name] = _to_float(name, reduced)
  return dict(sorted(out.items()))


def _to_float(name: str, value) -> float:
  if np.shape(value) not in ((), (1,)):
    raise ValueError(f"metric {name!r}: aggregation_fn must return a scalar; "
                     f"got shape {np.shape(value)}")
  return float(np.asarray(value).reshape(()))
