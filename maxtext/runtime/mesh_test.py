"""Tests for the mesh layout rules.

One CPU device here; mesh_8dev_test runs them on 8 devices. With the TPU
package set (`--config=tpu`: the target's `--tpu` argument) it also lays
meshes out on TPU slices that libtpu describes.
"""

import os
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from maxtext.configs import base
from maxtext.runtime import mesh as mesh_lib
from maxtext.runtime import topology

# `args` of the Bazel target: present when the build has the TPU packages.
_TPU_ARG = "--tpu"


def _config(**overrides):
  """The mesh's settings: base.py's, updated by `overrides`."""
  return mesh_lib.MeshConfig(**overrides)


_BATCH = mesh_lib.BatchLayout(
    global_batch_size=16, gradient_accumulation_steps=2, eval_batch_size=8
)


class MeshConfigTest(parameterized.TestCase):

  def test_made_from_the_run_config_by_name(self):
    config = base.get_config()
    config.fsdp_parallelism = -1
    config.data_parallelism = 2
    self.assertEqual(
        mesh_lib.MeshConfig.from_config(config, generation_devices=4),
        mesh_lib.MeshConfig(
            data_parallelism=2, fsdp_parallelism=-1, generation_devices=4
        ),
    )

  @parameterized.named_parameters(
      (
          "zero",
          dict(data_parallelism=0),
          r"^config\.data_parallelism=0: must be -1 \(all remaining devices\)",
      ),
      (
          "two_rests",
          dict(data_parallelism=-1, fsdp_parallelism=-1),
          r"^config\.fsdp_parallelism=-1: only one of data_parallelism and",
      ),
      (
          "dcn_zero",
          dict(dcn_fsdp_parallelism=0),
          r"^config\.dcn_fsdp_parallelism=0: must be -1 \(all remaining slices",
      ),
      (
          "dcn_two_rests",
          dict(dcn_fsdp_parallelism=-1),
          r"^config\.dcn_fsdp_parallelism=-1: only one of dcn_data_parallelism",
      ),
  )
  def test_bad_sizes_are_one_line_naming_the_field(self, overrides, message):
    config = base.get_config()
    config.update(overrides)
    with self.assertRaisesRegex(ValueError, message):
      mesh_lib.MeshConfig.from_config(config)


class MeshShapeTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("data_rest", -1, 2, 8, (4, 2)),
      ("fsdp_rest", 2, -1, 8, (2, 4)),
      ("explicit", 8, 1, 8, (8, 1)),
      ("one_device", -1, 1, 1, (1, 1)),
  )
  def test_resolves_sizes(self, data, fsdp, devices, expected):
    self.assertEqual(mesh_lib.mesh_shape(data, fsdp, devices), expected)

  @parameterized.named_parameters(
      (
          "not_dividing",
          -1,
          3,
          8,
          r"fsdp_parallelism=3 does not divide the 8 devices",
      ),
      (
          "wrong_product",
          2,
          2,
          8,
          r"data_parallelism=2 x fsdp_parallelism=2 = 4 does "
          r"not match the 8 devices",
      ),
      ("two_rests", -1, -1, 8, r"at most one"),
      ("zero", 0, 1, 8, r"data_parallelism must be -1 or positive, got 0"),
  )
  def test_impossible_layouts_name_the_numbers(
      self, data, fsdp, devices, message
  ):
    with self.assertRaisesRegex(ValueError, message):
      mesh_lib.mesh_shape(data, fsdp, devices)

  def test_slices_name_the_dcn_fields(self):
    with self.assertRaisesRegex(
        ValueError,
        "dcn_data_parallelism=1 x dcn_fsdp_parallelism=3 = 3 does not "
        "match the 2 slices",
    ):
      mesh_lib.mesh_shape(1, 3, 2, prefix="dcn_", unit="slices")


class BatchLayoutTest(absltest.TestCase):

  def test_cpu_devices_are_one_slice(self):
    self.assertEqual(mesh_lib.num_slices(jax.devices()), 1)

  def test_one_device_mesh(self):
    mesh = mesh_lib.make_mesh(_config())
    self.assertEqual(dict(mesh.shape), {"data": 1, "fsdp": 1})
    mesh_lib.check_batch_layout(_BATCH, mesh)

  def test_expert_axis_only_when_asked_and_must_divide_devices(self):
    mesh = mesh_lib.make_mesh(_config())
    self.assertNotIn(mesh_lib.EXPERT_AXIS, mesh.axis_names)
    self.assertEqual(mesh_lib.expert_size(mesh), 1)
    self.assertEqual(mesh_lib.batch_axes(mesh), ("data", "fsdp"))
    with self.assertRaisesRegex(ValueError, "expert_parallelism=2"):
      mesh_lib.make_mesh(_config(expert_parallelism=2))

  def test_global_batch_is_sharded_over_batch_axes(self):
    mesh = mesh_lib.make_mesh(_config())
    sharding = mesh_lib.batch_sharding(mesh)
    batch = mesh_lib.global_batch(
        {"inputs": np.arange(8, dtype=np.int32).reshape(2, 4)}, sharding
    )
    self.assertEqual(batch["inputs"].shape, (2, 4))
    self.assertEqual(batch["inputs"].sharding, sharding)
    np.testing.assert_array_equal(
        jax.device_get(batch["inputs"]), np.arange(8).reshape(2, 4)
    )


class TpuMeshTest(absltest.TestCase):
  """Meshes on libtpu's description of TPU slices (TPU package set only)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"

  def test_fsdp_axis_is_a_ring_on_the_torus(self):
    # v5e:4x4, FSDP over all 16 chips: each device's neighbours on the mesh
    # axis (and the last's, the first) are its neighbours on the chips'
    # links. A plain reshape of the device list (x fastest) would jump from
    # (3, 0) to (0, 1).
    devices = topology.abstract_devices(topology.parse("v5e:4x4"))
    mesh = mesh_lib.make_mesh(
        _config(data_parallelism=1, fsdp_parallelism=-1), devices
    )
    ring = list(mesh.devices[0])
    self.assertLen(ring, 16)
    for a, b in zip(ring, ring[1:] + ring[:1]):
      distance = sum(abs(p - q) for p, q in zip(a.coords, b.coords))
      self.assertEqual(distance, 1, (a.coords, b.coords))

  def test_data_parallelism_spans_slices_by_default(self):
    devices = topology.abstract_devices(topology.parse("v5e:2x2"), 2)
    self.assertEqual(mesh_lib.num_slices(devices), 2)
    mesh = mesh_lib.make_mesh(
        _config(data_parallelism=1, fsdp_parallelism=-1), devices
    )
    self.assertEqual(dict(mesh.shape), {"data": 2, "fsdp": 4})
    for i, row in enumerate(mesh.devices):
      self.assertEqual({d.slice_index for d in row}, {i})

  def test_fsdp_across_slices_when_asked(self):
    devices = topology.abstract_devices(topology.parse("v5e:2x2"), 2)
    mesh = mesh_lib.make_mesh(
        _config(
            data_parallelism=1,
            fsdp_parallelism=-1,
            dcn_data_parallelism=1,
            dcn_fsdp_parallelism=-1,
        ),
        devices,
    )
    self.assertEqual(dict(mesh.shape), {"data": 1, "fsdp": 8})
    self.assertEqual(
        [d.slice_index for d in mesh.devices[0]], [0] * 4 + [1] * 4
    )


if __name__ == "__main__":
  if _TPU_ARG in sys.argv:
    sys.argv.remove(_TPU_ARG)
  else:
    del TpuMeshTest  # The CPU package set has no libtpu.
  absltest.main()
