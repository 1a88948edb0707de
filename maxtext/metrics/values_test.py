"""Tests for maxtext.metrics.values, the one check of a metric's value."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.metrics import values


class ValuesTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("float32", jnp.float32),
      ("bfloat16", jnp.bfloat16),
      ("int8", np.int8),
      ("uint32", np.uint32),
      ("float64", np.float64),
  )
  def test_integer_and_floating_dtypes_are_accepted(self, dtype):
    self.assertIsNone(values.dtype_problem(np.dtype(dtype)))
    for shape in ((), (1,)):
      values.check_scalar("m", np.dtype(dtype), shape, None)

  @parameterized.named_parameters(
      ("boolean", np.bool_, "boolean dtype is not accepted"),
      ("complex", np.complex64, "complex dtype is not accepted"),
      ("string", np.str_, "dtype <U1 is not numeric"),
      ("object", np.object_, "dtype object is not numeric"),
  )
  def test_other_dtypes_are_refused_with_a_type_error(self, dtype, words):
    value = np.zeros((), dtype)
    with self.assertRaisesRegex(TypeError, "metric 'm': value " + words):
      values.check_scalar("m", value.dtype, value.shape, value)

  def test_a_shape_other_than_a_scalars_is_a_value_error(self):
    value = jnp.zeros((2,), jnp.float32)
    with self.assertRaisesRegex(
        ValueError,
        r"metric 'm': packed must have shape \(\) or \(1,\); got "
        r"jax.Array\(shape=\(2,\), dtype=float32\)",
    ):
      values.check_scalar("m", value.dtype, value.shape, value, "packed")

  def test_a_traced_value_is_described_not_read(self):
    def step(x):
      values.check_scalar("m", x.dtype, x.shape, x)
      return x

    with self.assertRaisesRegex(ValueError, r"got tracer\(shape=\(3,\)"):
      jax.jit(step)(jnp.zeros(3))


if __name__ == "__main__":
  absltest.main()
