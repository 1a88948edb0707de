"""Tests of sampling.SamplingOptions (sampling itself: generate_test)."""

import dataclasses
import types

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.generation import sampling


class SamplingOptionsTest(parameterized.TestCase):

  def test_defaults_and_checked_values(self):
    options = sampling.SamplingOptions(max_new_tokens=np.int64(8))
    self.assertEqual(
        options,
        sampling.SamplingOptions(
            max_new_tokens=8,
            temperature=0.0,
            top_k=0,
            top_p=1.0,
            seed=0,
            num_samples=1,
            stop_ids=(),
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
      ("zero_top_p", dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
      ("large_top_p", dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
      ("negative_stop_id", dict(stop_ids=(3, -1)), "stop id must be >= 0"),
  )
  def test_bad_options_are_named(self, changes, message):
    with self.assertRaisesRegex(ValueError, message):
      sampling.SamplingOptions(**dict(dict(max_new_tokens=4), **changes))

  def test_stop_ids_must_be_a_sequence_of_ints(self):
    with self.assertRaisesRegex(TypeError, "stop_ids must be a tuple"):
      sampling.SamplingOptions(max_new_tokens=2, stop_ids=3)
    options = sampling.SamplingOptions(max_new_tokens=2, stop_ids=[np.int64(4)])
    self.assertEqual(options.stop_ids, (4,))
    self.assertFalse(options.filtered)
    self.assertTrue(
        sampling.SamplingOptions(
            max_new_tokens=2, temperature=1.0, top_p=0.5
        ).filtered
    )

  def test_a_float_count_is_a_type_error(self):
    with self.assertRaisesRegex(TypeError, "max_new_tokens"):
      sampling.SamplingOptions(max_new_tokens=2.5)

  def test_sample_many_takes_prompts_of_one_length(self):
    config = types.SimpleNamespace(vocab_size=32, max_sequence_length=16)
    with self.assertRaisesRegex(
        ValueError, "prompts of 2 and 1 tokens: the windowed sampler"
    ):
      sampling.sample_many(
          {}, config, [[1, 2], [3]], sampling.SamplingOptions(max_new_tokens=2)
      )

  def test_sample_takes_only_sampling_options(self):
    with self.assertRaisesRegex(TypeError, "options must be a SamplingOptions"):
      sampling.sample({}, None, [1], dict(max_new_tokens=4))


class FilterTest(parameterized.TestCase):

  # probabilities at temperature 1: 0.5, 0.25, 0.125, 0.0625, 0.0625.
  _LOGITS = np.log([[0.125, 0.5, 0.0625, 0.25, 0.0625]]).astype(np.float32)

  def _kept(self, top_k, top_p, temperature=1.0):
    out = sampling.filter_logits(
        jnp.asarray(self._LOGITS),
        jnp.float32(temperature),
        jnp.int32(top_k),
        jnp.float32(top_p),
    )
    return sorted(np.flatnonzero(np.isfinite(np.asarray(out)[0])).tolist())

  @parameterized.named_parameters(
      ("all", 0, 1.0, [0, 1, 2, 3, 4]),
      ("top_2", 2, 1.0, [1, 3]),
      ("top_4_keeps_the_tie", 4, 1.0, [0, 1, 2, 3, 4]),
      ("nucleus_half", 0, 0.5, [1]),
      ("nucleus_0.6", 0, 0.6, [1, 3]),
      ("nucleus_0.8", 0, 0.8, [0, 1, 3]),
      ("tiny_nucleus_keeps_the_argmax", 0, 1e-6, [1]),
      ("top_3_then_nucleus", 3, 0.8, [1, 3]),
  )
  def test_kept_ids(self, top_k, top_p, expected):
    self.assertEqual(self._kept(top_k, top_p), expected)

  def test_the_nucleus_is_taken_after_temperature(self):
    # At temperature 0.5 the probabilities are 16:4:1:(1/4):(1/4) / 21.5;
    # 0.74 of the mass is the first id alone.
    self.assertEqual(self._kept(0, 0.74, temperature=0.5), [1])
    self.assertEqual(self._kept(0, 0.76, temperature=0.5), [1, 3])

  def test_per_row_keys_draw_per_row(self):
    logits = jnp.zeros((2, 1000), jnp.float32)
    key = jax.random.PRNGKey(0)
    one = jnp.float32(1.0)
    same = sampling.choose(
        logits,
        jnp.stack([key, key]),
        one,
        jnp.int32(0),
        one,
        greedy=False,
        filtered=False,
    )
    self.assertEqual(int(same[0]), int(same[1]))
    differ = sampling.choose(
        logits,
        jnp.stack([key, jax.random.PRNGKey(1)]),
        one,
        jnp.int32(0),
        one,
        greedy=False,
        filtered=False,
    )
    self.assertNotEqual(int(differ[0]), int(differ[1]))

  def test_mask_after_stop(self):
    ids, lengths = sampling.mask_after_stop(
        np.array([[5, 3, 7, 3], [1, 2, 4, 4]]), (3, 9)
    )
    np.testing.assert_array_equal(ids, [[5, 3, 0, 0], [1, 2, 4, 4]])
    np.testing.assert_array_equal(lengths, [2, 4])


if __name__ == "__main__":
  absltest.main()
