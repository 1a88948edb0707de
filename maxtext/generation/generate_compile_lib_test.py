"""Four fake CPU devices: a weight copy's bytes against the copied arrays',
and the rollout's programs compiled on a mesh with a tensor axis.

The device count is fixed when JAX starts, so this test has its own target
and asks for the devices before importing JAX.
"""

from maxtext.runtime import cpu_devices

cpu_devices.request(4)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
from absl.testing import absltest
import jax
import ml_collections

from maxtext.engine import engine_config
from maxtext.engine import model_setup
from maxtext.generation import decode_weights
from maxtext.generation import generate_compile_lib
from maxtext.generation import kv_cache
from maxtext.generation import paged_decoder
from maxtext.generation import paged_model
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.runtime import mesh as mesh_lib
from testing import tiny_configs


def _config(*presets, **layout) -> ml_collections.FrozenConfigDict:
  return ml_collections.FrozenConfigDict(
      tiny_configs.model_config(
          *presets,
          compute_dtype="bfloat16",
          data_parallelism=1,
          fsdp_parallelism=-1,
          **layout,
      )
  )


class WeightCopyTest(absltest.TestCase):

  def _check_against_arrays(self, config):
    """The copy's bytes equal those of the parameters themselves, made on
    the mesh and copied for decoding there (`decode_weights.cast`)."""
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    setup = model_setup.setup_model(model_config.of(config), mesh)
    params = model_setup.init_params(
        engine_config.EngineConfig.from_config(config), setup
    )
    leaves = jax.tree_util.tree_leaves(
        decode_weights.cast(params, config.compute_dtype)
    )
    per_device = {d: 0 for d in mesh.devices.flat}
    for leaf in leaves:
      for shard in leaf.addressable_shards:
        per_device[shard.device] += shard.data.nbytes

    copy = generate_compile_lib.weight_copy(model_config.of(config), setup)

    self.assertEqual(copy.dtype, "bfloat16")
    self.assertEqual(copy.total_bytes, sum(leaf.nbytes for leaf in leaves))
    # The float32 parameters' bytes, less half of the matrices'.
    matrices = jax.tree_util.tree_leaves(transformer.compute_dtype_mask(params))
    float32 = jax.tree_util.tree_leaves(params)
    self.assertEqual(
        copy.total_bytes,
        sum(x.nbytes for x in float32)
        - sum(x.nbytes for x, m in zip(float32, matrices) if m) // 2,
    )
    self.assertEqual(copy.devices, 4)
    self.assertEqual(set(per_device.values()), {copy.device_bytes})
    self.assertEqual(copy.received_bytes, sum(per_device.values()))
    return copy

  def test_fsdp_splits_every_parameter(self):
    copy = self._check_against_arrays(_config())
    # FSDP over all 4 devices: one model in all, a quarter on each.
    self.assertEqual(copy.received_bytes, copy.total_bytes)

  def test_expert_and_tensor_axes(self):
    copy = self._check_against_arrays(
        _config(
            tiny_configs.TINY_MOE, expert_parallelism=2, tensor_parallelism=2
        )
    )
    self.assertLess(copy.device_bytes, copy.total_bytes)


class CompileGenerationTest(absltest.TestCase):

  def test_programs_compile_with_the_pool_split_over_tensor(self):
    config = _config(tiny_configs.TINY_QWEN35, tensor_parallelism=2)
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    self.assertEqual(dict(mesh.shape), {"data": 1, "fsdp": 2, "tensor": 2})
    engine = paged_decoder.EngineOptions(page_size=4)

    result = generate_compile_lib.compile_generation(
        model_config.of(config),
        model_setup.setup_model(model_config.of(config), mesh),
        num_slots=3,
        length=16,
        prompt_length=5,
        engine=engine,
    )

    self.assertIsNone(result.step.out_of_memory)
    self.assertEqual(
        [p.program for p in result.step.programs], ["prefill", "decode"]
    )
    # The engine's default pool: (slots + 1) x the pages of 16 positions.
    self.assertEqual(result.num_pages, 4 * 4)
    # Contexts of 5 ids prefill in the smallest length bucket (the decoder's
    # cache_length: 16 here, the sequences' most).
    self.assertEqual(result.prefill_length, 16)
    # The pool split by its 2 key/value heads over the tensor axis.
    self.assertEqual(
        result.pool_bytes,
        paged_model.pool_bytes(config, result.num_pages, 4) // 2,
    )
    # The slots' DeltaNet states replicated: every slot's on each device.
    self.assertEqual(
        result.state_bytes_per_slot, kv_cache.state_bytes_per_row(config)
    )
    self.assertGreater(result.state_bytes_per_slot, 0)
    self.assertEqual(result.state_bytes, 3 * result.state_bytes_per_slot)
    self.assertEqual(result.param_bytes, result.copy.device_bytes)
    for program in result.step.programs:
      # Each program's arguments hold the parameters and the pool, and the
      # pool it returns reuses the donated one.
      self.assertGreaterEqual(
          program.args, result.param_bytes + result.pool_bytes
      )
      self.assertGreaterEqual(program.alias, result.pool_bytes)
    prefill, decode = result.step.programs
    self.assertEqual(prefill.resident, result.state_bytes + 3 * 32 * 4)
    self.assertEqual(decode.resident, 0)

  def test_programs_compile_split_over_data_replicas(self):
    config = ml_collections.FrozenConfigDict(
        tiny_configs.model_config(
            tiny_configs.TINY_QWEN35,
            compute_dtype="bfloat16",
            data_parallelism=2,
            fsdp_parallelism=1,
            tensor_parallelism=2,
        )
    )
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    self.assertEqual(dict(mesh.shape), {"data": 2, "fsdp": 1, "tensor": 2})

    result = generate_compile_lib.compile_generation(
        model_config.of(config),
        model_setup.setup_model(model_config.of(config), mesh),
        num_slots=3,
        length=16,
        prompt_length=5,
        engine=paged_decoder.EngineOptions(page_size=4),
    )

    self.assertIsNone(result.step.out_of_memory)
    # 3 slots rounded up to 2 per replica; the default pool: (slots +
    # replicas) x the pages of 16 positions.
    self.assertEqual(result.num_slots, 4)
    self.assertEqual(result.num_pages, (4 + 2) * 4)
    # Each device holds its replica's half of the pages, by its half of the
    # key/value heads, and its replica's 2 slots' DeltaNet states.
    self.assertEqual(
        result.pool_bytes,
        paged_model.pool_bytes(config, result.num_pages, 4) // 4,
    )
    self.assertEqual(result.state_bytes, 2 * result.state_bytes_per_slot)
    prefill, decode = result.step.programs
    # Beside the prefill: the states and the [2, V] logits of its slots.
    self.assertEqual(prefill.resident, result.state_bytes + 2 * 32 * 4)
    self.assertEqual(decode.resident, 0)
    for program in result.step.programs:
      self.assertGreaterEqual(
          program.args, result.param_bytes + result.pool_bytes
      )

  def test_bad_shape_is_one_line(self):
    config = _config()
    model = model_config.of(config)
    setup = model_setup.setup_model(
        model, mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    )
    with self.assertRaisesRegex(
        ValueError, r"^prompt_length=16 leaves no new token of length=16$"
    ):
      generate_compile_lib.compile_generation(
          model, setup, num_slots=2, length=16, prompt_length=16
      )
    with self.assertRaisesRegex(
        ValueError, r"^length=32 exceeds max_sequence_length=16$"
    ):
      generate_compile_lib.compile_generation(
          model, setup, num_slots=2, length=32, prompt_length=4
      )


if __name__ == "__main__":
  absltest.main()
