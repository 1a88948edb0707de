"""Argument checks shared by the library: one definition of each rule.

Python's `bool` is a subclass of `int`, so `isinstance(True, int)` holds; an
argument that must be a count, a step or a number takes neither `True` nor
`False`. Every module checks such arguments through the functions here, which
raise `TypeError` for a wrong type and `ValueError` for a value out of range,
each naming the argument and the value.
"""

import math
import numbers
import stat
from typing import Any, Optional


def is_int(value: Any) -> bool:
  """True for an integer (Python or NumPy) that is not a bool."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  """True for a real number (int or float, Python or NumPy), not a bool."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, minimum: Optional[int] = None) -> int:
  """Returns `value` as an int.

  Args:
    name: the argument's name, for the message.
    value: the value to check.
    minimum: the smallest value allowed, or None for any.

  Raises:
    TypeError: `value` is not an int (a bool is not).
    ValueError: `value` is below `minimum`.
  """
  if not is_int(value):
    raise TypeError(f"{name} must be an int, got {value!r}")
  if minimum is not None and value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
  return int(value)


def check_number(
    name: str, value: Any, *, finite: bool = True, positive: bool = False
) -> float:
  """Returns `value` as a float.

  Args:
    name: the argument's name, for the message.
    value: the value to check.
    finite: whether NaN and infinities are refused.
    positive: whether the value must be > 0.

  Raises:
    TypeError: `value` is not a real number (a bool is not).
    ValueError: `value` is not finite (when `finite`) or not > 0 (when
      `positive`).
  """
  if not is_number(value):
    raise TypeError(f"{name} must be a number, got {value!r}")
  if finite and not math.isfinite(value):
    raise ValueError(f"{name} must be finite, got {value!r}")
  if positive and not value > 0:
    raise ValueError(f"{name} must be > 0, got {value!r}")
  return float(value)


def file_kind(mode: int) -> str:
  """What an `os.stat` mode says a path is, for messages ("a directory")."""
  if stat.S_ISREG(mode):
    return "a regular file"
  if stat.S_ISDIR(mode):
    return "a directory"
  if stat.S_ISFIFO(mode):
    return "a FIFO"
  if stat.S_ISSOCK(mode):
    return "a socket"
  if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
    return "a device"
  return "a special file"
