"""Eight fake CPU devices: tensor parallelism (the "tensor" mesh axis) with
fsdp, data and expert parallelism gives one device's logits, loss and
gradients.

Meshes of three axes of size 2 (tensor with fsdp and data, tensor with
fsdp and expert, tensor with data and expert) for a dense model, multi-head
latent attention, mixture-of-experts models, and packed rows. The
parameters are placed by the logical-axis rules (`axis_rules.PARAMETERS`:
heads and hidden widths over "tensor"), the batch over the other axes; the
reference is the same model on one device, in the same process. The device
count is fixed when JAX starts, so this test has its own target.
"""

from maxtext.runtime import cpu_devices

cpu_devices.request(8)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from maxtext.engine import model_setup
from maxtext.model import transformer
from maxtext.runtime import mesh as mesh_lib
from testing import tiny_configs

_DENSE = dict(num_heads=4, num_kv_heads=2, mlp_dim=64)
_MOE = dict(
    tiny_configs.TINY_MOE, num_heads=4, num_kv_heads=2, capacity_factor=0.0
)
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


def _batch(config, packed):
  """8 random rows; with `packed` two sequences a row."""
  rng = np.random.default_rng(0)
  shape = (8, config.max_sequence_length)
  batch = {
      "inputs": rng.integers(0, config.vocab_size, shape).astype(np.int32),
      "targets": rng.integers(0, config.vocab_size, shape).astype(np.int32),
  }
  if packed:  # Two sequences a row: 6 and 10 tokens.
    ids = np.repeat([1, 2], [6, 10])
    positions = np.concatenate([np.arange(6), np.arange(10)])
    batch["segment_ids"] = np.tile(ids, (8, 1)).astype(np.int32)
    batch["positions"] = np.tile(positions, (8, 1)).astype(np.int32)
  return batch


def _loss_and_grads(config, mesh):
  return jax.jit(
      jax.value_and_grad(
          functools.partial(transformer.loss_fn, config=config, mesh=mesh),
          has_aux=True,
      )
  )


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
  )
  def test_logits_loss_and_grads_equal_one_devices(
      self, preset, mesh, packed=False
  ):
    config = _config(preset, mesh)
    device_mesh = mesh_lib.make_mesh(config)
    self.assertEqual(device_mesh.shape[mesh_lib.TENSOR_AXIS], 2)
    self.assertEqual(
        sorted(n for n, size in device_mesh.shape.items() if size == 2),
        sorted(mesh.split("_")),
    )
    setup = model_setup.setup_model(config, device_mesh)
    # The heads and hidden widths are split over "tensor" by the rules.
    specs = jax.tree_util.tree_leaves(
        jax.tree_util.tree_map(lambda s: s.spec, setup.param_shardings),
        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
    )
    self.assertGreaterEqual(
        sum(mesh_lib.TENSOR_AXIS in tuple(spec) for spec in specs), 3
    )
    params = model_setup.init_params(config, setup)
    single = jax.device_get(params)
    batch = _batch(config, packed)
    placed = mesh_lib.global_batch(batch, setup.batch_sharding)

    rows = transformer.Rows.of(batch)
    want_logits = jax.jit(
        functools.partial(transformer.apply, config=config, rows=rows)
    )(single, batch["inputs"])
    got_logits = jax.jit(
        functools.partial(
            transformer.apply,
            config=config,
            mesh=device_mesh,
            rows=transformer.Rows.of(placed),
        )
    )(params, placed["inputs"])
    np.testing.assert_allclose(got_logits, want_logits, rtol=2e-5, atol=2e-5)

    (want_loss, want_aux), want_grads = _loss_and_grads(config, None)(
        single, batch
    )
    (got_loss, got_aux), got_grads = _loss_and_grads(config, device_mesh)(
        params, placed
    )
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(
        got_aux["loss_sum"], want_aux["loss_sum"], rtol=1e-5
    )
    jax.tree_util.tree_map(
        lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6),
        jax.device_get(got_grads),
        want_grads,
    )

  def test_tensor_must_divide_the_heads(self):
    config = _config(
        (dict(_DENSE, num_heads=3, num_kv_heads=1),), "data_fsdp_tensor"
    )
    with self.assertRaisesRegex(
        ValueError, "tensor_parallelism=2 does not divide the 1 kv_heads"
    ):
      model_setup.setup_model(config, mesh_lib.make_mesh(config))

  def test_tensor_must_divide_the_devices(self):
    config = _config((_DENSE,), "data_fsdp_tensor")
    config.tensor_parallelism = 3
    with self.assertRaisesRegex(ValueError, "tensor_parallelism=3 must be"):
      mesh_lib.make_mesh(config)


if __name__ == "__main__":
  absltest.main()
