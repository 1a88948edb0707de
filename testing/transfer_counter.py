"""Counts the host<->device transfers made through JAX inside a `with` block.

Benchmarks that say where a loop's host time goes count, beside the programs
it launches (`dispatch_counter`), the values it moves between the host and
the devices:

  * calls of `jax.device_get`, `jax.device_put` and
    `jax.make_array_from_process_local_data` (`calls`, by function name);
  * the arrays they move (`to_host`, `to_device`): a `jax.device_get` of a
    tuple of four device arrays is one call and four device-to-host
    transfers;
  * host reads of a device array outside those calls through its Python
    methods (`float`, `int`, `bool`, `.item()`, `.tolist()`, `__array__`),
    each a call of its own (`calls["host read (item)"]` ...) and one array
    to the host. NumPy can read a device array through the buffer protocol
    without calling `__array__` (`np.asarray` of a CPU array does): such a
    read is not counted.

A value given to a program as a host array is placed by the launch itself;
`dispatch_counter.record_launches(host_arguments=...)` counts those.

The functions are replaced for the block's duration (module attributes of
`jax` and methods of JAX's array class), so the counts hold for code that
calls them as `jax.device_get(...)`; not thread-safe.
"""

import collections
import contextlib
import dataclasses
from typing import Callable, Iterator

import jax
from jax._src import array as jax_array

_HOST_READS = (
    "__array__",
    "__float__",
    "__int__",
    "__bool__",
    "item",
    "tolist",
)


@dataclasses.dataclass
class Transfers:
  """What a block moved.

  Attributes:
    calls: calls by name ("jax.device_get", "host read (item)", ...).
    to_host: device arrays read to the host (each array of a
      `jax.device_get`, each host read).
    to_device: host values placed on the devices (each leaf of a
      `jax.device_put` or `make_array_from_process_local_data`).
  """

  calls: collections.Counter = dataclasses.field(
      default_factory=collections.Counter
  )
  to_host: int = 0
  to_device: int = 0


def _device_arrays(tree) -> int:
  return sum(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(tree))


def _host_values(tree) -> int:
  return sum(
      not isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(tree)
  )


# Each counted function: (direction, what it moves, given its arguments).
_MOVES = {
    "device_get": ("to_host", lambda args, kw: _device_arrays(args[0])),
    "device_put": (
        "to_device",
        lambda args, kw: _host_values(args[0] if args else kw["x"]),
    ),
    # (sharding, local_data, ...)
    "make_array_from_process_local_data": (
        "to_device",
        lambda args, kw: _host_values(
            args[1] if len(args) > 1 else kw["local_data"]
        ),
    ),
}


@contextlib.contextmanager
def count_transfers(
    active: Callable[[], bool] = lambda: True,
) -> Iterator[Transfers]:
  """Counts the transfers made inside the block while `active()` holds.

  Yields:
    A `Transfers` that grows as the block runs.
  """
  counts = Transfers()
  depth = [0]  # Reads inside a transfer call are that call's own.

  def counting(label, direction, moved):
    def make(original):
      def wrapper(*args, **kwargs):
        if active() and not depth[0]:
          counts.calls[label] += 1
          number = moved(args, kwargs)
          if direction == "to_host":
            counts.to_host += number
          else:
            counts.to_device += number
        depth[0] += 1
        try:
          return original(*args, **kwargs)
        finally:
          depth[0] -= 1

      return wrapper

    return make

  patches = [
      (jax, name, counting(f"jax.{name}", direction, moved))
      for name, (direction, moved) in _MOVES.items()
  ]
  patches += [
      (
          jax_array.ArrayImpl,
          name,
          counting(f"host read ({name})", "to_host", lambda args, kw: 1),
      )
      for name in _HOST_READS
  ]
  with contextlib.ExitStack() as stack:
    for owner, name, make in patches:
      original = getattr(owner, name)
      setattr(owner, name, make(original))
      stack.callback(setattr, owner, name, original)
    yield counts
