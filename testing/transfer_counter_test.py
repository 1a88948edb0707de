"""Tests for testing.transfer_counter."""

from absl.testing import absltest
import jax
from jax._src import array as jax_array
import jax.numpy as jnp
import numpy as np

from testing import transfer_counter


class CountTransfersTest(absltest.TestCase):

  def test_counts_calls_and_the_arrays_they_move(self):
    a, b = jnp.ones((3,)), jnp.zeros((2,), jnp.int32)
    with transfer_counter.count_transfers() as counts:
      jax.device_get((a, b, a))
      jax.device_put({"x": np.ones((2,)), "y": np.int32(3)})
      jax.device_put(a)  # Already on the device: nothing moves.
    self.assertEqual(counts.calls, {"jax.device_get": 1, "jax.device_put": 2})
    self.assertEqual((counts.to_host, counts.to_device), (3, 2))

  def test_host_reads_count_outside_transfer_calls_only(self):
    a = jnp.arange(4)
    with transfer_counter.count_transfers() as counts:
      float(a[0])
      int(a[1])
      a.tolist()
      jax.device_get(a)  # Reads its array itself: one call, one array.
    self.assertEqual(
        counts.calls,
        {
            "host read (__float__)": 1,
            "host read (__int__)": 1,
            "host read (tolist)": 1,
            "jax.device_get": 1,
        },
    )
    self.assertEqual((counts.to_host, counts.to_device), (4, 0))

  def test_counts_only_while_active_and_restores_jax(self):
    original_get = jax.device_get
    original_read = jax_array.ArrayImpl.__array__
    on = [False]
    with transfer_counter.count_transfers(lambda: on[0]) as counts:
      jax.device_get(jnp.ones((2,)))
      on[0] = True
      jax.device_get(jnp.ones((2,)))
    jax.device_get(jnp.ones((2,)))
    self.assertEqual(counts.calls, {"jax.device_get": 1})
    self.assertIs(jax.device_get, original_get)
    self.assertIs(jax_array.ArrayImpl.__array__, original_read)


if __name__ == "__main__":
  absltest.main()
