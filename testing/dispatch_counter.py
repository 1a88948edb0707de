"""Counts device executable launches made by JAX inside a `with` block.

Tests and benchmarks use this to check how many times a piece of code sends a
compiled program to the device (for example, that a metrics flush is one
launch however many values it gathers).

How JAX launches a jitted function, and why a plain wrapper misses launches:

  A `jax.jit` function, and every eager op (which JAX runs as a small jitted
  computation), is a C++ callable with its own cache keyed on the argument
  signature. On a signature it has not seen, it calls back into Python: the
  Python path traces, compiles (or takes the compiled executable from the
  compilation cache), and launches through `pxla.ExecuteReplicated.__call__`.
  It then asks `pjit._get_fastpath_data` for what C++ needs to launch that
  executable by itself and stores the answer in the C++ cache. From then on,
  calls with that signature launch from C++ and never run Python, so a
  wrapper around `ExecuteReplicated.__call__` sees only the first call.

What `count_dispatches` does:

  * It replaces `pjit._get_fastpath_data` with a function returning None, so
    the C++ cache never gets launch data: every call takes the Python path
    and so goes through `ExecuteReplicated.__call__`, which is wrapped to
    count.
  * It clears the C++ dispatch caches on entry, so entries that already hold
    launch data (made before the block) cannot bypass the count, and on exit,
    so entries made without launch data inside the block do not keep those
    calls on the slow path afterwards. Only the C++ dispatch entries are
    dropped: compiled executables stay cached, so nothing recompiles.

This reaches into JAX internals (`jax._src`), which is why it lives in a
`testonly` library; `dispatch_counter_test` pins the behaviour on the JAX
version in use.
"""

import collections
import contextlib
from typing import Any, Callable, Iterator, Optional

import jax

from jax._src import pjit as jax_pjit
from jax._src.interpreters import pxla
from jax._src.lib import _jax as jax_lib_cpp


def _clear_cpp_dispatch_caches() -> None:
  """Drops the C++ dispatch entries (and their launch data) only."""
  # jax has no public hook for its dispatch caches; these are its internals.
  # pylint: disable=protected-access
  jax_pjit._cpp_pjit_cache_fun_only.clear()
  jax_pjit._cpp_pjit_cache_explicit_attributes.clear()
  jax_lib_cpp.PjitFunctionCache.clear_all()


@contextlib.contextmanager
def _on_launch(callback: Callable[[str, tuple], None]) -> Iterator[None]:
  """Calls callback(executable name, its arguments as given) at every
  launch inside the block."""
  # jax has no public launch hook: this patches its internals for the block.
  # pylint: disable=protected-access
  original_call = pxla.ExecuteReplicated.__call__
  original_fastpath = jax_pjit._get_fastpath_data

  def reporting_call(self, *args):
    callback(self.name, args)
    return original_call(self, *args)

  _clear_cpp_dispatch_caches()
  pxla.ExecuteReplicated.__call__ = reporting_call
  jax_pjit._get_fastpath_data = lambda *a, **k: None
  try:
    yield
  finally:
    pxla.ExecuteReplicated.__call__ = original_call
    jax_pjit._get_fastpath_data = original_fastpath
    _clear_cpp_dispatch_caches()


@contextlib.contextmanager
def count_dispatches() -> Iterator[list[int]]:
  """Counts executable launches, with JAX's C++ dispatch fast path off.

  Read the count inside or after the block; compare readings taken before and
  after a call to count that call's launches. Not thread-safe: it patches
  module globals of JAX for the duration of the block.

  Yields:
    A one-element list whose element is the number of launches so far in the
    block; it grows as the block runs.
  """
  count = [0]

  def add(unused_name, unused_args):
    count[0] += 1

  with _on_launch(add):
    yield count


def _host_values(args: tuple) -> int:
  return sum(
      not isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(args)
  )


@contextlib.contextmanager
def record_launches(
    host_arguments: Optional[collections.Counter] = None,
) -> Iterator[list[str]]:
  """Records the executables launched, in order, with the fast path off.

  Not thread-safe, like `count_dispatches`.

  Args:
    host_arguments: where given, counts by executable name the arguments
      a launch was given as host values (NumPy arrays, Python scalars)
      rather than device arrays: each one the launch places on the device,
      a host-to-device transfer of its own.

  Yields:
    A list that grows with the name of each launched executable: "jit(f)"
    for a jitted function f, e.g. "jit(apply)" or "jit(_concat_groups)".
  """
  names = []

  def record(name: str, args: Any) -> None:
    names.append(name)
    if host_arguments is not None:
      host_arguments[name] += _host_values(args)

  with _on_launch(record):
    yield names
