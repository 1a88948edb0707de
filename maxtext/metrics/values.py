"""What a metric's value may be: the one check of its dtype and shape.

Every way a value enters the recorder goes through it:
`MetricsRecorder.buffer_metrics` and `buffer_packed` apply it on the host
(reading a JAX array's dtype and shape, never its data), and the engine's
packing (`maxtext/engine/metric_packing.py`) applies it to each metric of
the traced micro-step before packing them into one array. So the packed
path takes exactly the metrics the per-name path takes, and refuses the
others in the same words.

* Integer and floating dtypes are accepted (bfloat16 and the other ml_dtypes
  floats included).
* Booleans are refused: a flag passed where a number was meant (`loss > x`
  for `loss`) would be averaged silently. Cast explicitly.
* Complex dtypes are refused: metrics are logged as real numbers (JSON,
  TensorBoard) and there is no lossless cast.
* Any other dtype (strings, objects, PRNG keys) is refused.
* A scalar has shape () or (1,).
"""

from typing import Any, Optional

import jax.numpy as jnp

from maxtext.metrics import buffer as metrics_buffer

# The shapes of a scalar metric value.
SCALAR_SHAPES = ((), (1,))

# dtype -> None (accepted) or why not. Each dtype is judged once; the
# recorder's fast path reads this dict directly.
dtype_verdicts: dict[Any, Optional[str]] = {}


def dtype_problem(dtype) -> Optional[str]:
  """None if `dtype` is an accepted metric dtype, else why not."""
  try:
    return dtype_verdicts[dtype]
  except (KeyError, TypeError):
    pass
  if jnp.issubdtype(dtype, jnp.bool_):
    verdict = "boolean dtype is not accepted (cast to int or float)"
  elif jnp.issubdtype(dtype, jnp.complexfloating):
    verdict = "complex dtype is not accepted"
  elif jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(
      dtype, jnp.floating
  ):
    verdict = None
  else:
    verdict = f"dtype {dtype} is not numeric"
  try:
    dtype_verdicts[dtype] = verdict
  except TypeError:
    pass  # An unhashable dtype-like is judged again next time.
  return verdict


def check_scalar(name: str, dtype, shape, value, what: str = "value") -> None:
  """Refuses a value of `dtype` and `shape` unless it is a scalar metric.

  Args:
    name: the metric, for the message.
    dtype: the value's dtype.
    shape: the value's shape.
    value: the value (only described, never read: it may be a tracer or
      live on a device).
    what: how the message calls the value ("value", "unreduced_sum", ...).

  Raises:
    TypeError: a refused dtype.
    ValueError: a shape other than () or (1,).
  """
  problem = dtype_problem(dtype)
  if problem:
    raise error(TypeError, name, f"{what} {problem}", value)
  if tuple(shape) not in SCALAR_SHAPES:
    raise error(ValueError, name, f"{what} must have shape () or (1,)", value)


def error(exc_type: type, name: str, problem: str, value) -> Exception:
  """The exception refusing `value` as the metric `name`, naming both."""
  return exc_type(
      f"metric {name!r}: {problem}; got {metrics_buffer.describe(value)}"
  )
