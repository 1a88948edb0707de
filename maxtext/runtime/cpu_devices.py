"""How many devices JAX's CPU backend makes: fake devices for meshes on a CPU.

XLA's CPU client makes one device unless XLA_FLAGS holds
--xla_force_host_platform_device_count=N, and it reads XLA_FLAGS once, when
the backend starts (the first device query). Multi-device tests, and tools
that lay out a mesh on a CPU, set the count here before JAX starts: this
module imports no JAX.
"""

from collections.abc import MutableMapping
import os
from typing import Optional

from maxtext.core import checks

FLAG = "--xla_force_host_platform_device_count"


def with_device_count(xla_flags: str, count: Optional[int]) -> str:
  """`xla_flags` with the device count set to `count`; None removes it.

  Args:
    xla_flags: an XLA_FLAGS value (flags separated by white space).
    count: the number of CPU devices (>= 1), or None for XLA's default.

  Returns:
    The flags with any earlier device count replaced; the others kept in
    order.
  """
  if count is not None:
    count = checks.check_int("count", count, 1)
  kept = [f for f in xla_flags.split() if not f.startswith(FLAG + "=")]
  if count is not None:
    kept.append(f"{FLAG}={count}")
  return " ".join(kept)


def request(count: int, environ: MutableMapping[str, str] = os.environ) -> None:
  """Makes the CPU backend, once it starts, have `count` devices.

  Call it before anything asks JAX for a device: a started backend keeps the
  count it started with.

  Args:
    count: the number of CPU devices (>= 1).
    environ: the environment whose XLA_FLAGS is set (this process's).
  """
  environ["XLA_FLAGS"] = with_device_count(environ.get("XLA_FLAGS", ""), count)
