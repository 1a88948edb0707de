"""Tests for decode_memory: the decoders' programs compiled on the CPU."""

from absl.testing import absltest
import jax
import ml_collections

from maxtext.configs import decode_bench
from tools.benchmarks import decode_memory


class DecodeMemoryTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = decode_bench.get_config()
    config.num_layers = 2
    cls.config = ml_collections.FrozenConfigDict(config)
    cls.device = decode_memory.target_device("")

  def test_the_static_prefill_runs_over_the_prompts_not_the_cache(self):
    short = decode_memory.static(self.config, self.device, 8, 256, 16)
    long = decode_memory.static(self.config, self.device, 8, 256, 200)
    # The same parameters (the prompts' ids differ by 8 KiB); a prefill over
    # 16 positions holds less than one over 256 (a prefill over the whole
    # cache would make them equal).
    self.assertAlmostEqual(short["args_mib"], long["args_mib"], delta=0.05)
    self.assertLess(short["temp_mib"], 0.8 * long["temp_mib"])

  def test_the_paged_program_compiles_and_the_kernel_is_refused_off_a_tpu(
      self,
  ):
    figures = decode_memory.paged(
        self.config, self.device, 4, 128, 16, "gather"
    )
    self.assertGreater(figures["args_mib"], 0)
    self.assertGreater(figures["bytes_accessed_mib"], 0)
    with self.assertRaisesRegex(
        ValueError, "attention='kernel': .*head_dim|attention='kernel': .*TPU"
    ):
      decode_memory.paged(self.config, self.device, 4, 128, 16, "kernel")

  def test_the_target_is_the_default_backends_device(self):
    self.assertEqual(decode_memory.target_device(""), jax.devices()[0])


if __name__ == "__main__":
  absltest.main()
