"""Tests for maxtext.runtime.topology: the slice names users type.

With the TPU package set (`--config=tpu`: the target's `--tpu` argument)
it also asks libtpu for each generation's devices and checks the HBM table
against the TPU compiler itself.
"""

import os
import sys

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.runtime import topology
from maxtext.metrics import throughput

# `args` of the Bazel target: present when the build has the TPU packages.
_TPU_ARG = "--tpu"


class ParseTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("jax_v5p", "v5p:2x2x1", "v5p:2x2x1", 4, 4),
      ("cloud_v5p_counts_cores", "v5p-8", "v5p:2x2x1", 4, 4),
      ("cloud_v5p_128", "v5p-128", "v5p:4x4x4", 64, 64),
      ("cloud_v5p_32", "v5p-32", "v5p:2x2x4", 16, 16),
      ("cloud_v5e_counts_chips", "v5e-16", "v5e:4x4", 16, 16),
      ("cloud_v5litepod", "v5litepod-16", "v5e:4x4", 16, 16),
      ("cloud_v5e_256", "v5e-256", "v5e:16x16", 256, 256),
      ("cloud_v6e_8", "v6e-8", "v6e:2x4", 8, 8),
      ("cloud_v4_8", "v4-8", "v4:2x2x1", 4, 4),
      ("tpu7x_two_devices_per_chip", "tpu7x-8", "tpu7x:2x2x1", 4, 8),
      ("v7x_alias", "v7x:2x2x2", "tpu7x:2x2x2", 8, 16),
      ("upper_case", "V5E:2X2", "v5e:2x2", 4, 4),
      ("two_d_with_trailing_one", "v6e:2x2x1", "v6e:2x2", 4, 4),
      ("fake_cpu", "cpu:8", "cpu:8", 8, 8),
      ("cloud_v5litepod_one_chip", "v5litepod-1", "v5e:1x1", 1, 1),
      ("cloud_v5e_one_chip", "v5e-1", "v5e:1x1", 1, 1),
      ("jax_v5e_one_chip", "v5e:1x1", "v5e:1x1", 1, 1),
      ("jax_v5e_one_chip_three_axes", "v5e:1x1x1", "v5e:1x1", 1, 1),
      ("cloud_v6e_one_chip", "v6e-1", "v6e:1x1", 1, 1),
  )
  def test_names(self, text, name, chips, devices):
    tpu_slice = topology.parse(text)
    self.assertEqual(tpu_slice.name, name)
    self.assertEqual(tpu_slice.chips, chips)
    self.assertEqual(tpu_slice.devices, devices)

  @parameterized.named_parameters(
      ("unknown_generation", "v9-8", "unknown TPU generation 'v9'"),
      ("malformed", "v5p", "expected GENERATION:SHAPE"),
      ("count_not_power_of_two", "v5p-24", "12 chips"),
      ("odd_core_count", "v5p-9", "count TensorCores"),
      ("too_few_chips", "v5e-2", "not 1 or a power of two of at least 4"),
      ("no_one_chip_v5p_slice", "v5p-2", r"2 TensorCores \(1 chips\) is not a"),
      ("wrong_axes", "v5p:2x2", "has 3 axes"),
      ("not_whole_hosts", "v5p:3x2x1", "whole hosts of 2x2x1 chips;"),
      ("no_one_chip_v5p_shape", "v5p:1x1x1", "whole hosts of 2x2x1 chips;"),
      ("half_a_host", "v5e:2x1", r"2x2 chips \(or one chip, v5e:1x1\)"),
  )
  def test_bad_names_name_the_value(self, text, message):
    with self.assertRaisesRegex(ValueError, f"--topology='{text}'.*{message}"):
      topology.parse(text)

  @parameterized.named_parameters(
      ("one_chip", "v5litepod-1", (1, 1, 1)),
      ("one_host", "v5e-4", (2, 2, 1)),
      ("many_hosts", "v5p-128", (2, 2, 1)),
  )
  def test_chips_per_host(self, text, chips_per_host):
    self.assertEqual(topology.parse(text).chips_per_host, chips_per_host)

  def test_every_generation_has_a_peak_for_mfu(self):
    for generation in topology.GENERATIONS:
      self.assertIsNotNone(
          throughput.peak_flops_per_device(generation.device_kind),
          generation.name,
      )

  def test_device_kinds_find_their_generation(self):
    self.assertEqual(topology.by_device_kind("TPU v5").name, "v5p")
    self.assertEqual(topology.by_device_kind("TPU v5 lite").name, "v5e")
    self.assertIsNone(topology.by_device_kind("NVIDIA H200"))


class LibtpuTest(parameterized.TestCase):
  """What libtpu says about the slices (the TPU package set only)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"

  @parameterized.named_parameters(
      (g.name, g.name) for g in topology.GENERATIONS
  )
  def test_devices_and_hbm_match_the_compiler(self, generation):
    # The parsing tests need no JAX; it loads here, with libtpu.
    # pylint: disable=import-outside-toplevel
    import jax
    import jax.numpy as jnp
    import numpy as np

    # pylint: enable=import-outside-toplevel
    counts_cores = topology.parse(f"{generation}:2x2x1").generation
    tpu_slice = topology.parse(
        f"{generation}-{8 if counts_cores.counts_cores else 4}"
    )
    devices = topology.abstract_devices(tpu_slice)
    self.assertLen(devices, tpu_slice.devices)
    self.assertEqual(devices[0].device_kind, tpu_slice.generation.device_kind)
    mesh = jax.sharding.Mesh(np.asarray(devices[:1]), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def compiles(nbytes):
      # A program whose argument and output are each half of `nbytes`.
      arg = jax.ShapeDtypeStruct((nbytes // 2,), jnp.int8, sharding=sharding)
      try:
        jax.jit(lambda a: a + 1, out_shardings=sharding).lower(arg).compile()
        return True
      except jax.errors.JaxRuntimeError as e:
        self.assertIn("RESOURCE_EXHAUSTED", str(e))
        return False

    hbm = tpu_slice.generation.hbm_bytes
    margin = 64 * 2**20
    self.assertTrue(compiles(hbm - margin))
    self.assertFalse(compiles(hbm + margin))

  @parameterized.named_parameters(("v5e", "v5litepod-1"), ("v6e", "v6e-1"))
  def test_one_chip(self, text):
    tpu_slice = topology.parse(text)
    devices = topology.abstract_devices(tpu_slice)
    self.assertLen(devices, 1)
    self.assertEqual(devices[0].device_kind, tpu_slice.generation.device_kind)
    self.assertEqual(list(devices[0].coords), [0, 0, 0])

  def test_two_slices(self):
    devices = topology.abstract_devices(topology.parse("v5e:2x2"), 2)
    self.assertEqual([d.slice_index for d in devices], [0] * 4 + [1] * 4)


if __name__ == "__main__":
  if _TPU_ARG in sys.argv:
    sys.argv.remove(_TPU_ARG)
  else:
    del LibtpuTest  # The CPU package set has no libtpu.
  absltest.main()
