"""Eight fake CPU devices: context parallelism (the "context" mesh axis,
each row's tokens split over it in the zig-zag layout) with tensor, fsdp,
data and expert parallelism gives one device's logits, loss and gradients.

Meshes of three axes of size 2 (context with tensor and fsdp, with fsdp
and expert, with data and expert, with data and tensor) for a dense model,
multi-head latent attention, mixture-of-experts models and the Qwen3.5
hybrid, packed and unpacked rows; the Gated DeltaNet layer alone on
context 2 and 4 (its chunk states composed across the axis); the splash
kernel's context path (Pallas interpret mode on the CPU) against the
reference attention; a training run through the trainer against one
without a context axis; and the refusals. The device
count is fixed when JAX starts, so this test has its own target.
"""

from maxtext import workloads
from maxtext.runtime import cpu_devices

cpu_devices.request(8)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import json
import os

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maxtext.config import config_lib
from maxtext.model import gated_deltanet
from maxtext.model import layers
from maxtext.model import zigzag
from maxtext.runtime import mesh as mesh_lib
from testing import mesh_equality
from testing import random_init
from testing import tiny_configs

_DENSE = mesh_equality.DENSE
_MOE = mesh_equality.MOE
_HYBRID = mesh_equality.HYBRID
_MESHES = {
    "fsdp_context_tensor": dict(
        data_parallelism=1, fsdp_parallelism=2, tensor_parallelism=2
    ),
    "fsdp_expert_context": dict(
        data_parallelism=1, fsdp_parallelism=2, expert_parallelism=2
    ),
    "data_expert_context": dict(
        data_parallelism=2, fsdp_parallelism=1, expert_parallelism=2
    ),
    "data_context_tensor": dict(
        data_parallelism=2, fsdp_parallelism=1, tensor_parallelism=2
    ),
}


def _config(preset, mesh):
  """The tiny model with `preset`, context 2 on the mesh `_MESHES[mesh]`."""
  return tiny_configs.model_config(
      *preset,
      max_sequence_length=16,
      global_batch_size=8,
      context_parallelism=2,
      dcn_data_parallelism=1,
      **_MESHES[mesh],
  )


# test_deltanet_layer_equals_one_devices' layer.
_DELTANET = ml_collections.FrozenConfigDict(
    dict(
        emb_dim=12,
        norm_epsilon=1e-6,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=4,
        linear_chunk_size=3,
    )
)


def _deltanet_loss(layer, x, ids, mesh):
  out, _ = gated_deltanet.apply(x, layer, _DELTANET, segment_ids=ids, mesh=mesh)
  return jnp.sum(jnp.sin(out)), out


# The layer's loss and gradients, compiled: one device's (mesh None) as one
# program, not op by op (an eager call traced and compiled its scans again
# each time), and shared by the cases whose one-device inputs are the same
# (c2 and c4_tensor).
_deltanet_grad = jax.jit(
    jax.value_and_grad(_deltanet_loss, (0, 1), has_aux=True),
    static_argnums=3,
)


class ZigzagTest(absltest.TestCase):

  def test_each_device_holds_chunk_i_and_its_mirror(self):
    # 4 devices, 8 chunks of 2: device i holds chunks i and 7 - i.
    np.testing.assert_array_equal(
        zigzag.order(16, 4).reshape(4, 4),
        [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]],
    )
    x = np.arange(2 * 16 * 3).reshape(2, 16, 3)
    laid = zigzag.to_zigzag(jnp.asarray(x), 4)
    np.testing.assert_array_equal(laid, x[:, zigzag.order(16, 4)])
    np.testing.assert_array_equal(zigzag.from_zigzag(laid, 4), x)

  def test_causal_work_is_balanced(self):
    # Keys a query sees under the causal mask, summed per device.
    work = (zigzag.order(64, 4) + 1).reshape(4, -1).sum(axis=1)
    self.assertEqual(len(set(work.tolist())), 1)


class ContextParallelTest(parameterized.TestCase):

  @parameterized.named_parameters(
      dict(testcase_name="dense", preset=(_DENSE,), mesh="fsdp_context_tensor"),
      dict(
          testcase_name="dense_packed",
          preset=(_DENSE,),
          mesh="fsdp_context_tensor",
          packed=True,
      ),
      dict(
          testcase_name="mla_packed",
          preset=(_DENSE, tiny_configs.TINY_MLA),
          mesh="fsdp_context_tensor",
          packed=True,
      ),
      dict(
          testcase_name="moe_fsdp", preset=(_MOE,), mesh="fsdp_expert_context"
      ),
      dict(
          testcase_name="moe_data_packed",
          preset=(_MOE,),
          mesh="data_expert_context",
          packed=True,
      ),
      dict(
          testcase_name="mla_moe",
          preset=(_MOE, tiny_configs.TINY_MLA),
          mesh="fsdp_expert_context",
      ),
      dict(
          testcase_name="hybrid_tensor",
          preset=(_HYBRID,),
          mesh="fsdp_context_tensor",
      ),
      dict(
          testcase_name="hybrid_expert_packed",
          preset=(_HYBRID,),
          mesh="data_expert_context",
          packed=True,
      ),
      dict(
          testcase_name="dense_dot_product",
          preset=(dict(_DENSE, attention="dot_product"),),
          mesh="data_context_tensor",
          packed=True,
      ),
  )
  def test_logits_loss_and_grads_equal_one_devices(
      self, preset, mesh, packed=False
  ):
    config = _config(preset, mesh)
    config_lib.validate(config)
    device_mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    self.assertEqual(device_mesh.shape[mesh_lib.CONTEXT_AXIS], 2)
    self.assertEqual(
        sorted(n for n, size in device_mesh.shape.items() if size == 2),
        sorted(mesh.split("_")),
    )
    # Parameters are split over "context" as over an FSDP axis; the Gated
    # DeltaNet's chunk states are composed as T S + B across it.
    mesh_equality.assert_matches_one_device(
        self, config, device_mesh, packed, mesh_lib.CONTEXT_AXIS
    )

  @parameterized.named_parameters(("unpacked", False), ("packed", True))
  def test_splash_kernel_in_the_zigzag_layout(self, packed):
    # The kernel in Pallas interpret mode: 256-token rows, 128 per device.
    mesh = jax.sharding.Mesh(
        np.asarray(jax.devices()).reshape(4, 2), ("fsdp", "context")
    )
    rng = np.random.default_rng(1)
    q, k, v = (
        jnp.asarray(rng.standard_normal((4, 256, 2, 8)), jnp.float32)
        for _ in range(3)
    )
    ids = None
    if packed:
      ids = jnp.asarray(np.repeat([[1, 2]], [100, 156], axis=1).repeat(4, 0))

    def laid(x):
      return None if x is None else zigzag.to_zigzag(x, 2)

    def loss(q, k, v, implementation, mesh, ids):
      out = layers.attend(q, k, v, implementation, mesh, segment_ids=ids)
      return jnp.sum(jnp.sin(out)), out

    want, want_grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(
        q, k, v, "einsum", None, ids
    )
    got, got_grads = jax.jit(
        jax.value_and_grad(loss, (0, 1, 2), has_aux=True),
        static_argnums=(3, 4),
    )(laid(q), laid(k), laid(v), "splash", mesh, laid(ids))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4)
    np.testing.assert_allclose(
        zigzag.from_zigzag(got[1], 2), want[1], rtol=1e-4, atol=1e-5
    )
    for g, w in zip(got_grads, want_grads):
      np.testing.assert_allclose(
          zigzag.from_zigzag(g, 2), w, rtol=1e-4, atol=1e-5
      )

  @parameterized.named_parameters(
      dict(testcase_name="c2", context=2, ids=None),
      dict(testcase_name="c4_tensor", context=4, ids=None, tensor=2),
      # Sequences starting at a chunk's first token (8 and 24 of 32-token
      # rows in 8 chunks of 4), inside chunks, and a row of one sequence.
      dict(
          testcase_name="c4_packed",
          context=4,
          ids=[[1] * 8 + [2] * 16 + [3] * 8, [4] * 5 + [5] * 22 + [6] * 5] * 2,
      ),
  )
  def test_deltanet_layer_equals_one_devices(self, context, ids, tensor=1):
    # The Gated DeltaNet alone: chunk states composed across the context
    # axis, each chunk's convolution reading the chunk before's last inputs.
    config = _DELTANET
    normal = random_init.scaled_normal(3, count=16)
    layer = jax.tree.map(
        lambda a: a[0],
        gated_deltanet.init_params(config, 1, normal, jnp.float32),
    )
    layer["a_log"] = layer["a_log"] - 1.5 + normal((4,), 1)
    x = jax.random.normal(jax.random.PRNGKey(4), (4, 32, 12), jnp.float32)
    segment_ids = None if ids is None else jnp.asarray(ids, jnp.int32)
    mesh = jax.sharding.Mesh(
        np.asarray(jax.devices()).reshape(
            8 // context // tensor, context, tensor
        ),
        ("fsdp", "context", "tensor"),
    )

    (want, want_out), want_grads = _deltanet_grad(layer, x, segment_ids, None)

    def laid(a):
      return None if a is None else zigzag.to_zigzag(a, context)

    (got, got_out), got_grads = _deltanet_grad(
        layer, laid(x), laid(segment_ids), mesh
    )
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(
        zigzag.from_zigzag(got_out, context), want_out, rtol=1e-4, atol=1e-5
    )
    # The chunk states' T S + B composition sums in its own order: on some
    # CPUs a weight gradient of about 5e-2 differs from one device's by
    # 1.7e-5.
    for name, g in got_grads[0].items():
      np.testing.assert_allclose(
          g, want_grads[0][name], rtol=1e-4, atol=4e-5, err_msg=name
      )
    np.testing.assert_allclose(
        zigzag.from_zigzag(got_grads[1], context),
        want_grads[1],
        rtol=1e-4,
        atol=1e-5,
    )

  def test_refuses_deltanet_chunks_shorter_than_its_kernel(self):
    config = _config((_HYBRID,), "fsdp_context_tensor")
    config.max_sequence_length = 8
    # Before anything is built, from the config...
    with self.assertRaisesRegex(
        ValueError,
        "config.context_parallelism=2: splits max_sequence_length=8 into 4 "
        "chunks of 2 tokens, fewer than the Gated DeltaNet's "
        "linear_conv_kernel_dim - 1 = 3",
    ):
      config_lib.validate(config)
    # ...and while the step is traced, for rows of any length.
    with self.assertRaisesRegex(
        ValueError,
        "gated_deltanet with context_parallelism=2: a 8-token row must "
        "split into 4 equal chunks of at least linear_conv_kernel_dim - 1 = 3",
    ):
      mesh_equality.assert_matches_one_device(
          self,
          config,
          mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config)),
          False,
          mesh_lib.CONTEXT_AXIS,
      )

  def test_refuses_rows_not_split_in_two_chunks_a_device(self):
    config = _config((_DENSE,), "fsdp_context_tensor")
    config.max_sequence_length = 18
    with self.assertRaisesRegex(
        ValueError,
        "max_sequence_length=18 is not divisible by 2 x "
        "context_parallelism=2",
    ):
      mesh_lib.check_batch_layout(
          mesh_lib.BatchLayout.from_config(config),
          mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config)),
      )

  def test_context_must_divide_the_devices(self):
    config = _config((_DENSE,), "fsdp_context_tensor")
    config.context_parallelism = 3
    with self.assertRaisesRegex(
        ValueError, "context_parallelism=3 must be >= 1 and divide"
    ):
      mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))


class TrainingTest(absltest.TestCase):

  def test_training_with_a_context_axis_matches_one_without(self):
    root = self.create_tempdir().full_path

    def losses(name, **mesh):
      config = tiny_configs.tiny_config(
          os.path.join(root, name),
          steps=3,
          gradient_accumulation_steps=1,
          dcn_data_parallelism=1,
          enable_mllog=False,
          **mesh,
      )
      run = workloads.run(config)
      self.assertEqual(run.final_step, 3)
      path = os.path.join(run.run_dir, "metrics.jsonl")
      with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
      return [r["loss"] for r in rows if r["kind"] == "train"]

    plain = losses("plain", data_parallelism=2, fsdp_parallelism=4)
    context = losses(
        "context",
        data_parallelism=2,
        fsdp_parallelism=2,
        context_parallelism=2,
    )
    self.assertLen(plain, 3)
    np.testing.assert_allclose(context, plain, rtol=2e-5)


if __name__ == "__main__":
  absltest.main()
