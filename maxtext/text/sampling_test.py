"""Tests of sampling.SamplingOptions (sampling itself: generate_test)."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.text import sampling


class SamplingOptionsTest(parameterized.TestCase):

  def test_defaults_and_checked_values(self):
    options = sampling.SamplingOptions(max_new_tokens=np.int64(8))
    self.assertEqual(
        options,
        sampling.SamplingOptions(
            max_new_tokens=8, temperature=0.0, top_k=0, seed=0, num_samples=1
        ),
    )
    self.assertIs(type(options.max_new_tokens), int)
    self.assertTrue(options.greedy)
    warm = sampling.SamplingOptions(max_new_tokens=8, temperature=0.5)
    self.assertFalse(warm.greedy)
    with self.assertRaises(dataclasses.FrozenInstanceError):
      warm.temperature = 0.0

  @parameterized.named_parameters(
      ("negative_temperature", dict(temperature=-1.0), "temperature must"),
      ("infinite_temperature", dict(temperature=float("inf")), "temperature"),
      ("negative_top_k", dict(top_k=-1), "top_k must be >= 0"),
      ("no_new_tokens", dict(max_new_tokens=0), "max_new_tokens must"),
      ("no_samples", dict(num_samples=0), "num_samples must"),
      ("negative_seed", dict(seed=-1), "seed must be >= 0"),
  )
  def test_bad_options_are_named(self, changes, message):
    with self.assertRaisesRegex(ValueError, message):
      sampling.SamplingOptions(**dict(dict(max_new_tokens=4), **changes))

  def test_a_float_count_is_a_type_error(self):
    with self.assertRaisesRegex(TypeError, "max_new_tokens"):
      sampling.SamplingOptions(max_new_tokens=2.5)

  def test_sample_takes_only_sampling_options(self):
    with self.assertRaisesRegex(TypeError, "options must be a SamplingOptions"):
      sampling.sample({}, None, [1], dict(max_new_tokens=4))


if __name__ == "__main__":
  absltest.main()
