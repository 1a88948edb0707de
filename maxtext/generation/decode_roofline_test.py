"""A decode step's bytes, counted here by hand, and the bandwidth limit."""

from absl.testing import absltest
import jax
import ml_collections

from maxtext.generation import decode_roofline
from maxtext.model import transformer
from testing import tiny_configs

# TINY_MODEL: vocab 32, width 32, 2 layers, 4 query heads and 2 key/value
# heads of 8, MLP 64. A layer: two norm scales (32 each), wq 32 x 32,
# wk and wv 32 x 16, wo 32 x 32, and gate, up and down 32 x 64.
_LAYER = 2 * 32 + 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64
# Both layers, the final norm and the output projection (32 x 32); the
# untied input embedding (32 x 32) is read one row per row.
_READ = 2 * _LAYER + 32 + 32 * 32
_EMBEDDING = 32 * 32
# Keys and values of 2 heads of 8 in 2 layers, bfloat16.
_PER_TOKEN = 2 * 2 * 2 * 8 * 2


def _config(*presets, **overrides):
  return ml_collections.FrozenConfigDict(
      tiny_configs.model_config(*presets, compute_dtype="bfloat16", **overrides)
  )


def _shapes(config):
  return jax.eval_shape(
      lambda k: transformer.init_params(config, k), jax.random.PRNGKey(0)
  )


class StepBytesTest(absltest.TestCase):

  def test_weights_in_the_compute_dtype_without_the_input_embedding(self):
    config = _config()
    # Held in float32 (the config's weight_dtype): counted as bfloat16.
    self.assertEqual(
        decode_roofline.weight_bytes(config, _shapes(config)), 2 * _READ
    )
    tied = _config(tie_word_embeddings=True)
    # Tied, the embedding is the output projection, read whole.
    self.assertEqual(
        decode_roofline.weight_bytes(tied, _shapes(tied)),
        2 * (_READ - 32 * 32 + _EMBEDDING),
    )

  def test_the_mean_cache_of_the_steps_rows(self):
    config = _config()
    # Row 0: 3-id context, 2 ids: steps see 4 and 5 positions. Row 1:
    # 5-id context, 4 ids: 6 + 7 + 8 + 9. Over 4 decode steps.
    step = decode_roofline.step_bytes(
        config, _shapes(config), [3, 5], [2, 4], 4
    )
    self.assertEqual(step.weights, 2 * _READ)
    self.assertEqual(step.cache, _PER_TOKEN * (4 + 5 + 6 + 7 + 8 + 9) / 4)
    self.assertEqual(step.states, 0)
    self.assertEqual(step.total, 2 * _READ + _PER_TOKEN * 39 / 4)

  def test_a_hybrid_row_reads_its_states_every_step_it_runs(self):
    config = _config(tiny_configs.TINY_QWEN35)
    # 2 Gated DeltaNet layers of 2 key heads of 8, 4 value heads of 6,
    # kernel 4: 3 past inputs of q, k (2 x 8 each) and v (4 x 6) in
    # bfloat16, and the 4 x 8 x 6 recurrent state, kept in float32.
    per_row = 2 * (3 * (2 * 8 + 2 * 8 + 4 * 6) * 2 + 4 * 8 * 6 * 4)
    step = decode_roofline.step_bytes(
        config, _shapes(config), [3, 5], [2, 4], 5
    )
    self.assertEqual(step.states, per_row * (2 + 4) / 5)
    # 2 attention layers keep keys and values of 2 heads of 12.
    self.assertEqual(step.cache, 2 * 2 * 2 * 12 * 2 * 39 / 5)

  def test_bad_steps_or_rows(self):
    config = _config()
    with self.assertRaisesRegex(ValueError, "steps=0"):
      decode_roofline.step_bytes(config, _shapes(config), [3], [2], 0)
    with self.assertRaisesRegex(ValueError, "2 context lengths for 1 rows"):
      decode_roofline.step_bytes(config, _shapes(config), [3, 4], [2], 2)


class LimitTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.step = decode_roofline.StepBytes(
        weights=1_638_000, cache=0.0, states=0.0, steps=4
    )

  def test_the_limit_is_the_bytes_over_the_bandwidth(self):
    # 1.638 MB at 819 GB/s: 2 microseconds.
    self.assertAlmostEqual(
        decode_roofline.limit_seconds(self.step, "TPU v5 lite"), 2e-6
    )
    self.assertIsNone(decode_roofline.limit_seconds(self.step, "cpu"))

  def test_the_report_gives_the_fraction_of_the_limit(self):
    # 4 steps in 80 microseconds: 20 a step, a tenth of the limit's speed.
    lines = decode_roofline.report(self.step, "TPU v5 lite", 80e-6)
    self.assertEqual(
        lines,
        [
            "decode step reads: 1638000 weight bytes + 0 cache bytes + 0 "
            "state bytes = 1638000 bytes (mean of 4 steps)",
            "bandwidth limit: TPU v5 lite 819 GB/s: 0.002 ms a step; "
            "measured 0.020 ms a step: 0.100 of the limit",
        ],
    )
    self.assertEqual(
        decode_roofline.report(self.step, "cpu", 80e-6)[1],
        "bandwidth limit: unknown for 'cpu'; measured 0.020 ms a step",
    )


if __name__ == "__main__":
  absltest.main()
