"""Eight fake CPU devices: tensor parallelism (the "tensor" mesh axis) with
fsdp, data and expert parallelism gives one device's logits, loss and
gradients.

Meshes of three axes of size 2 (tensor with fsdp and data, tensor with
fsdp and expert, tensor with data and expert) for a dense model, multi-head
latent attention, mixture-of-experts models, the Qwen3.5 hybrid (Gated
DeltaNet heads over "tensor" too), and packed rows. The
parameters are placed by the logical-axis rules (`axis_rules.PARAMETERS`:
heads and hidden widths over "tensor"), the batch over the other axes; the
reference is the same model on one device, in the same process. The device
count is fixed when JAX starts, so this test has its own target.
"""

from maxtext.runtime import cpu_devices

cpu_devices.request(8)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
from absl.testing import absltest
from absl.testing import parameterized
from maxtext.engine import model_setup
from maxtext.model import model_config
from maxtext.runtime import mesh as mesh_lib
from testing import mesh_equality
from testing import tiny_configs

_DENSE = mesh_equality.DENSE
_MOE = mesh_equality.MOE
_HYBRID = mesh_equality.HYBRID
_MESHES = {
    "data_fsdp_tensor": dict(data_parallelism=2, fsdp_parallelism=2),
    "fsdp_expert_tensor": dict(
        data_parallelism=1, fsdp_parallelism=2, expert_parallelism=2
    ),
    "data_expert_tensor": dict(
        data_parallelism=2, fsdp_parallelism=1, expert_parallelism=2
    ),
}


def _config(preset, mesh):
  """The tiny model with `preset`, tensor 2 on the mesh `_MESHES[mesh]`."""
  config = tiny_configs.model_config(
      *preset,
      max_sequence_length=16,
      global_batch_size=8,
      tensor_parallelism=2,
      dcn_data_parallelism=1,
      **_MESHES[mesh],
  )
  return config


class TensorParallelTest(parameterized.TestCase):

  @parameterized.named_parameters(
      dict(testcase_name="dense", preset=(_DENSE,), mesh="data_fsdp_tensor"),
      dict(
          testcase_name="dense_packed",
          preset=(_DENSE,),
          mesh="data_fsdp_tensor",
          packed=True,
      ),
      dict(
          testcase_name="mla",
          preset=(_DENSE, tiny_configs.TINY_MLA),
          mesh="data_fsdp_tensor",
      ),
      dict(testcase_name="moe_fsdp", preset=(_MOE,), mesh="fsdp_expert_tensor"),
      dict(
          testcase_name="moe_data_packed",
          preset=(_MOE,),
          mesh="data_expert_tensor",
          packed=True,
      ),
      dict(
          testcase_name="mla_moe",
          preset=(_MOE, tiny_configs.TINY_MLA),
          mesh="fsdp_expert_tensor",
      ),
      dict(
          testcase_name="hybrid_fsdp",
          preset=(_HYBRID,),
          mesh="fsdp_expert_tensor",
      ),
      dict(
          testcase_name="hybrid_data_packed",
          preset=(_HYBRID,),
          mesh="data_expert_tensor",
          packed=True,
      ),
  )
  def test_logits_loss_and_grads_equal_one_devices(
      self, preset, mesh, packed=False
  ):
    config = _config(preset, mesh)
    device_mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    self.assertEqual(device_mesh.shape[mesh_lib.TENSOR_AXIS], 2)
    self.assertEqual(
        sorted(n for n, size in device_mesh.shape.items() if size == 2),
        sorted(mesh.split("_")),
    )
    # The heads and hidden widths are split over "tensor" by the rules.
    mesh_equality.assert_matches_one_device(
        self, config, device_mesh, packed, mesh_lib.TENSOR_AXIS
    )

  def test_tensor_must_divide_the_heads(self):
    config = _config(
        (dict(_DENSE, num_heads=3, num_kv_heads=1),), "data_fsdp_tensor"
    )
    with self.assertRaisesRegex(
        ValueError, "tensor_parallelism=2 does not divide the 1 kv_heads"
    ):
      model_setup.setup_model(
          model_config.of(config),
          mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config)),
      )

  def test_tensor_must_divide_the_devices(self):
    config = _config((_DENSE,), "data_fsdp_tensor")
    config.tensor_parallelism = 3
    with self.assertRaisesRegex(ValueError, "tensor_parallelism=3 must be"):
      mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))


if __name__ == "__main__":
  absltest.main()
