"""Tests for decode_memory: the decoders' programs compiled on the CPU, and
(with the TPU package set, `--tpu`) for a v5e chip."""

import os
import sys

from absl.testing import absltest
from absl.testing import parameterized
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

  def test_pool_copies_counts_copies_of_a_pool_leaf(self):
    pool = {"kv": jax.ShapeDtypeStruct((2, 40, 16, 4, 128), "bfloat16")}
    text = "\n".join(
        [
            "%region_1.2 (arg: bf16[2,40,16,4,128]) -> bf16[2,40,16,4,128] {",
            "  %copy.1 = bf16[2,40,16,4,128]{4,2,3,1,0:T(8,128)} copy(%p)",
            "}",
            "",
            "ENTRY %main.3 (p: bf16[2,40,16,4,128]) -> bf16[2,40,16,4,128] {",
            "  %cs = (bf16[2,40,16,4,128]{4,3,2,1,0},"
            " bf16[2,40,16,4,128]{4,3,2,1,0}, u32[]) copy-start(%q)",
            # A layer's, and one of another type: neither counts.
            "  %copy.2 = bf16[40,16,4,128]{3,2,1,0} copy(%r)",
            "  %copy.3 = f32[2,40,16,4,128]{4,3,2,1,0} copy(%s)",
            "  %add = bf16[2,40,16,4,128]{4,3,2,1,0} add(%t, %u)",
        ]
    )
    self.assertEqual(decode_memory.pool_copies(text, pool), (1, 1))


_TPU_ARG = "--tpu"


class TpuDecodeProgramTest(parameterized.TestCase):
  """The decode program compiled for a v5e chip (TPU package set only)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    cls.device = decode_memory.target_device("v5e:2x2")
    cls.config = ml_collections.FrozenConfigDict(decode_bench.get_config())

  @parameterized.parameters("kernel", "gather")
  def test_the_decode_loop_never_copies_the_pool(self, attention):
    # The pool passed through the loop's conditional (the queue's take)
    # once made the TPU compiler copy all of it twice a step.
    figures = decode_memory.paged(
        self.config, self.device, 16, 512, 64, attention
    )
    self.assertGreater(figures["temp_mib"], 0)
    self.assertEqual(figures["pool_copies_step"], 0)
    # Calls run until the queue needs the host where the kernel reads the
    # pool; a gathered view spans the chunk's positions, so shorter there.
    self.assertEqual(figures["chunk"], 256 if attention == "kernel" else 32)


if __name__ == "__main__":
  if _TPU_ARG in sys.argv:
    sys.argv.remove(_TPU_ARG)
  else:
    del TpuDecodeProgramTest  # The CPU package set has no libtpu.
  absltest.main()
