"""The agreement rule: a near-tie within the rounding, and nothing wider."""

import dataclasses

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.generation import greedy_agreement
from maxtext.model import model_config
from maxtext.model import transformer
from testing import tiny_configs

_BF16_EPS = 2.0**-7  # bfloat16: 8 significant bits.


def _config() -> model_config.ModelConfig:
  return model_config.of(tiny_configs.model_config(compute_dtype="bfloat16"))


class NearTieTest(absltest.TestCase):

  def test_the_bound_is_rounding_ulps_of_the_larger_logit(self):
    self.assertEqual(greedy_agreement.ROUNDING_ULPS, 4)
    for larger in (10.0, -10.0, 0.375):
      ulp = _BF16_EPS * abs(larger)
      for ulps, tie in ((0.0, True), (3.9, True), (4.1, False), (50, False)):
        smaller = larger - ulps * ulp if larger > 0 else larger + ulps * ulp
        self.assertEqual(
            greedy_agreement.near_tie(larger, smaller, "bfloat16"),
            tie,
            (larger, ulps),
        )
        # Either order.
        self.assertEqual(
            greedy_agreement.near_tie(smaller, larger, jnp.bfloat16), tie
        )

  def test_float32_rounds_finer(self):
    self.assertTrue(greedy_agreement.near_tie(1.0, 1.0 - 2**-23, "float32"))
    # A bfloat16 near-tie is a clear float32 difference.
    self.assertFalse(greedy_agreement.near_tie(1.0, 1.0 - 2**-8, "float32"))
    self.assertTrue(greedy_agreement.near_tie(1.0, 1.0 - 2**-8, "bfloat16"))

  def test_first_difference(self):
    first = greedy_agreement.first_difference
    self.assertIsNone(first([1, 2, 3], [1, 2, 3]))
    self.assertIsNone(first([], []))
    self.assertEqual(first([1, 2, 3], [1, 5, 3]), 1)
    self.assertEqual(first([4], [1]), 0)
    self.assertEqual(first([1, 2], [1, 2, 3]), 2)


class AgreementTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.config = _config()
    self.params = transformer.init_params(self.config, jax.random.PRNGKey(1))
    self.context = [3, 1, 4, 1, 5]

  def test_float32_logits_are_the_full_pass_at_the_last_position(self):
    config32 = dataclasses.replace(self.config, compute_dtype="float32")
    with jax.default_matmul_precision("highest"):
      full = transformer.apply(
          self.params, jnp.asarray([self.context], jnp.int32), config32
      )
    np.testing.assert_allclose(
        greedy_agreement.float32_logits(self.params, self.config, self.context),
        np.asarray(full[0, -1]),
        rtol=1e-5,
        atol=1e-6,
    )

  def test_a_near_tie_agrees_and_a_clear_difference_does_not(self):
    # After the context and one common id x, the float32 argmax a. Ids b,
    # c, d get output columns a scaled: their logits are those of a times
    # the scale at every context: 3 ulps of bfloat16 below (a near-tie),
    # 5 ulps below (a difference the rounding does not make), and -l_a.
    x = 7
    logits = greedy_agreement.float32_logits(
        self.params, self.config, self.context + [x]
    )
    a = int(np.argmax(logits))
    b, c, d = [i for i in range(self.config.vocab_size) if i != a][:3]
    column = self.params["unembedding"][:, a]
    unembedding = self.params["unembedding"]
    for i, scale in ((b, 1 - 3 * _BF16_EPS), (c, 1 - 5 * _BF16_EPS), (d, -1)):
      unembedding = unembedding.at[:, i].set(column * scale)
    params = {**self.params, "unembedding": unembedding}
    requests = [
        ([x, a, 2], [x, a, 2]),  # the same ids
        ([x, a, 2], [x, b, 9]),  # a near-tie at position 1
        ([x, a], [x, c]),  # 5 ulps apart: a real difference
        ([x, d], [x, a]),  # far apart
        ([x, a], [x, a, 2]),  # one stopped where the other went on
    ]
    result = greedy_agreement.agreement(
        params,
        self.config,
        [self.context] * len(requests),
        [r[0] for r in requests],
        [r[1] for r in requests],
    )
    self.assertEqual(
        result,
        greedy_agreement.Agreement(same=1, within_rounding=2, total=5),
    )

  def test_the_rounding_is_the_compute_dtype_s(self):
    # The same near-tie (3 bfloat16 ulps) is a clear difference for a
    # float32 model.
    x = 7
    logits = greedy_agreement.float32_logits(
        self.params, self.config, self.context + [x]
    )
    a = int(np.argmax(logits))
    b = (a + 1) % self.config.vocab_size
    params = {
        **self.params,
        "unembedding": self.params["unembedding"]
        .at[:, b]
        .set(self.params["unembedding"][:, a] * (1 - 3 * _BF16_EPS)),
    }
    for dtype, within in (("bfloat16", 1), ("float32", 0)):
      config = dataclasses.replace(self.config, compute_dtype=dtype)
      result = greedy_agreement.agreement(
          params, config, [self.context], [[x, a]], [[x, b]]
      )
      self.assertEqual(result.within_rounding, within, dtype)


class RoundingDtypeTest(absltest.TestCase):

  def test_float32_on_a_tpu_rounds_as_bfloat16_at_one_pass(self):
    rounding = greedy_agreement.rounding_dtype
    for precision in (None, "default", "bfloat16", "fastest"):
      self.assertEqual(rounding("float32", "tpu", precision), "bfloat16")
    for precision in ("highest", "float32", "tensorfloat32", "bfloat16_3x"):
      self.assertEqual(rounding("float32", "tpu", precision), "float32")
    self.assertEqual(rounding("float32", "cpu", None), "float32")
    self.assertEqual(rounding(jnp.float32, "cpu", None), "float32")
    self.assertEqual(rounding("bfloat16", "tpu", "highest"), "bfloat16")

  def test_the_defaults_are_this_process_s(self):
    # The suite runs on the CPU at JAX's default precision.
    self.assertEqual(greedy_agreement.rounding_dtype("float32"), "float32")
    with jax.default_matmul_precision("bfloat16"):
      self.assertEqual(
          greedy_agreement.rounding_dtype("float32", platform="tpu"),
          "bfloat16",
      )
    with jax.default_matmul_precision("highest"):
      self.assertEqual(
          greedy_agreement.rounding_dtype("float32", platform="tpu"),
          "float32",
      )


class RoundingErrorsTest(absltest.TestCase):

  def test_the_bound_holds_the_measured_bfloat16_error(self):
    config = _config()
    params = transformer.init_params(config, jax.random.PRNGKey(2))
    tokens = np.random.default_rng(0).integers(
        0, config.vocab_size, (4, config.max_sequence_length)
    )
    errors = greedy_agreement.rounding_errors(params, config, tokens)
    self.assertEqual(errors.shape, (4 * config.max_sequence_length,))
    # bfloat16 moves the difference (it is no float32 pass), within the
    # bound at every position.
    self.assertGreater(np.max(errors), 0.01)
    self.assertLess(np.max(errors), greedy_agreement.ROUNDING_ULPS)


if __name__ == "__main__":
  absltest.main()
