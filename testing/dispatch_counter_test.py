"""Tests for testing.dispatch_counter."""

import collections

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax._src import pjit as jax_pjit
from jax._src.interpreters import pxla
import jax.numpy as jnp
import numpy as np

from testing import dispatch_counter


def _plain_jit():
  return jax.jit(lambda x: x * 2.0 + 1.0)


def _jit_with_explicit_attributes():
  # An explicit out_shardings puts the function in JAX's other C++ cache.
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.jit(lambda x: x * 2.0 + 1.0, out_shardings=sharding)


class CountDispatchesTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("plain_jit_1", _plain_jit, 1),
      ("plain_jit_7", _plain_jit, 7),
      ("explicit_attributes_5", _jit_with_explicit_attributes, 5),
  )
  def test_counts_every_call_of_a_warm_function(self, make_fn, n):
    fn = make_fn()
    x = jnp.arange(4, dtype=jnp.float32)
    # Calls before the block give the C++ cache launch data for this
    # signature; calls inside must still be counted.
    for _ in range(3):
      jax.block_until_ready(fn(x))
    with dispatch_counter.count_dispatches() as count:
      self.assertEqual(count[0], 0)
      for _ in range(n):
        x = fn(x)
      jax.block_until_ready(x)
    self.assertEqual(count[0], n)

  def test_counts_eager_ops(self):
    a = jnp.ones((3,))
    b = jnp.full((3,), 2.0)
    jax.block_until_ready(a + b)
    with dispatch_counter.count_dispatches() as count:
      c = a + b
      d = c * b
      jax.block_until_ready(d)
    self.assertEqual(count[0], 2)

  def test_host_work_is_not_counted(self):
    fn = _plain_jit()
    x = jax.block_until_ready(fn(jnp.ones((2,))))
    with dispatch_counter.count_dispatches() as count:
      host = [float(v) for v in jax.device_get(x)]
    self.assertEqual(host, [3.0, 3.0])
    self.assertEqual(count[0], 0)

  def test_restores_jax_after_the_block(self):
    original_call = pxla.ExecuteReplicated.__call__
    # The jax internals that count_dispatches patches must be put back.
    # pylint: disable=protected-access
    original_fastpath = jax_pjit._get_fastpath_data
    fn = _plain_jit()
    x = jnp.ones((2,))
    with dispatch_counter.count_dispatches() as count:
      jax.block_until_ready(fn(x))
    self.assertEqual(count[0], 1)
    self.assertIs(pxla.ExecuteReplicated.__call__, original_call)
    self.assertIs(jax_pjit._get_fastpath_data, original_fastpath)
    # Calls after the block are not counted.
    jax.block_until_ready(fn(x))
    self.assertEqual(count[0], 1)

  def test_restores_jax_when_the_block_raises(self):
    original_call = pxla.ExecuteReplicated.__call__
    with self.assertRaisesRegex(RuntimeError, "boom"):
      with dispatch_counter.count_dispatches():
        raise RuntimeError("boom")
    self.assertIs(pxla.ExecuteReplicated.__call__, original_call)

  def test_nested_counters_both_count(self):
    fn = _plain_jit()
    x = jnp.ones((2,))
    with dispatch_counter.count_dispatches() as outer:
      jax.block_until_ready(fn(x))
      with dispatch_counter.count_dispatches() as inner:
        jax.block_until_ready(fn(x))
      jax.block_until_ready(fn(x))
    self.assertEqual(inner[0], 1)
    self.assertEqual(outer[0], 3)

  def test_record_launches_names_them_in_order(self):
    def double(x):
      return x * 2.0

    def increment(x):
      return x + 1.0

    double_fn, increment_fn = jax.jit(double), jax.jit(increment)
    x = jax.block_until_ready(increment_fn(double_fn(jnp.ones((2,)))))
    with dispatch_counter.record_launches() as names:
      x = increment_fn(double_fn(increment_fn(x)))
      jax.block_until_ready(x)
    self.assertEqual(names, ["jit(increment)", "jit(double)", "jit(increment)"])

  def test_record_launches_counts_host_arguments(self):
    add = jax.jit(lambda x, y, z: x + y + z)
    x = jax.block_until_ready(add(jnp.ones((2,)), np.ones((2,)), 1.0))
    host = collections.Counter()
    with dispatch_counter.record_launches(host_arguments=host) as names:
      # A NumPy array and a Python scalar are placed by the launch; the
      # device array is not.
      jax.block_until_ready(add(x, np.ones((2,), np.float32), 2.0))
      jax.block_until_ready(add(x, x, x))
    self.assertEqual(names, ["jit(<lambda>)", "jit(<lambda>)"])
    self.assertEqual(host, {"jit(<lambda>)": 2})


if __name__ == "__main__":
  absltest.main()
