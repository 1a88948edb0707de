"""Tests for testing/random_init.py."""

from absl.testing import absltest
import numpy as np

from testing import random_init


class ScaledNormalTest(absltest.TestCase):

  def test_draws_are_scaled_by_fan_in_and_each_call_is_new(self):
    normal = random_init.scaled_normal(seed=0, count=2)
    first = np.asarray(normal((200, 100), 16))
    second = np.asarray(normal((200, 100), 16))
    self.assertEqual(first.dtype, np.float32)
    self.assertAlmostEqual(float(first.std()), 0.25, delta=0.01)
    self.assertFalse(np.allclose(first, second))

  def test_a_seed_reproduces_its_draws_until_the_keys_are_spent(self):
    a = random_init.scaled_normal(seed=3, count=1)
    b = random_init.scaled_normal(seed=3, count=1)
    other = random_init.scaled_normal(seed=4, count=1)
    draw = np.asarray(a((4,), 1))
    np.testing.assert_array_equal(draw, b((4,), 1))
    self.assertFalse(np.allclose(draw, other((4,), 1)))
    with self.assertRaises(StopIteration):
      a((4,), 1)


if __name__ == "__main__":
  absltest.main()
