"""Eight fake CPU devices: the cached decoders and the scorer on a mesh.

The device count is fixed when JAX starts, so this test has its own target
and sets XLA_FLAGS before importing JAX. Parameters are sharded as the
trainer shards them (`model_setup`: FSDP, and experts over the expert
axis), the rows over the batch axes; the reference is the same call with
the parameters on one device, in the same process.
"""

from maxtext.runtime import cpu_devices

cpu_devices.request(8)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
from absl.testing import absltest
from absl.testing import parameterized
import jax
import ml_collections
import numpy as np

from maxtext.runtime import mesh as mesh_lib
from maxtext.engine import engine_config
from maxtext.engine import model_setup
from maxtext.model import model_config
from maxtext.generation import decoder
from maxtext.generation import paged_decoder
from maxtext.generation import scoring
from maxtext.model import transformer
from maxtext.generation import sampling
from testing import tiny_configs

# float32 results of the sharded and the one-device programs agree to this
# (absolute): only the order of sums differs.
_ATOL = 1e-4


def _on_one_device(sharded):
  """The same parameters gathered onto one (the default) device: the same
  values exactly, and no eager initialisation compiling op by op."""
  return jax.device_put(jax.device_get(sharded))


class DecoderMultiDeviceTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    jax.config.update(
        "jax_compilation_cache_dir", tiny_configs.compilation_cache_dir()
    )

  @parameterized.named_parameters(
      ("gqa_data_fsdp", (), dict(data_parallelism=2, fsdp_parallelism=4)),
      (
          "mla_moe_experts",
          (tiny_configs.TINY_MLA, tiny_configs.TINY_MOE),
          dict(data_parallelism=2, fsdp_parallelism=2, expert_parallelism=2),
      ),
  )
  def test_sharded_generation_matches_one_device(self, presets, layout):
    self.assertEqual(jax.device_count(), 8)
    config = ml_collections.FrozenConfigDict(
        tiny_configs.model_config(*presets, **layout)
    )
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    setup = model_setup.setup_model(model_config.of(config), mesh)
    sharded = model_setup.init_params(
        engine_config.EngineConfig.from_config(config), setup
    )
    # The parameters are split over the devices as in training.
    self.assertTrue(
        any(
            not x.sharding.is_fully_replicated
            for x in jax.tree_util.tree_leaves(sharded)
        )
    )
    single = _on_one_device(sharded)
    rng = np.random.default_rng(6)
    prompts = [list(rng.integers(0, 32, size=n)) for n in (1, 3, 5, 7)]
    for options in (
        sampling.SamplingOptions(max_new_tokens=6, num_samples=2),
        sampling.SamplingOptions(
            max_new_tokens=6, temperature=1.0, top_k=8, seed=2, num_samples=2
        ),
    ):
      got = decoder.generate(sharded, config, prompts, options, mesh=mesh)
      want = decoder.generate(single, config, prompts, options)
      np.testing.assert_array_equal(got.ids, want.ids)
      np.testing.assert_allclose(got.log_probs, want.log_probs, atol=_ATOL)
    rows = [p for p in prompts for _ in range(2)]
    completions = [list(r) for r in got.ids]
    np.testing.assert_allclose(
        scoring.score(sharded, config, rows, completions, mesh=mesh),
        scoring.score(single, config, rows, completions),
        atol=_ATOL,
    )

  def test_paged_decoder_splits_the_pool_over_tensor(self):
    # The hybrid: a pool of the attention layers' pages split by its 2
    # key/value heads over the tensor axis, the DeltaNet states replicated.
    config = ml_collections.FrozenConfigDict(
        tiny_configs.model_config(
            tiny_configs.TINY_QWEN35,
            data_parallelism=1,
            fsdp_parallelism=4,
            tensor_parallelism=2,
        )
    )
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    self.assertEqual(
        paged_decoder.pool_sharding(config, mesh).spec,
        jax.sharding.PartitionSpec(None, None, None, "tensor", None),
    )
    setup = model_setup.setup_model(model_config.of(config), mesh)
    sharded = model_setup.init_params(
        engine_config.EngineConfig.from_config(config), setup
    )
    single = _on_one_device(sharded)
    rng = np.random.default_rng(7)
    prompts = [list(rng.integers(0, 32, size=n)) for n in (2, 5, 3)]
    options = sampling.SamplingOptions(
        max_new_tokens=6, temperature=1.0, seed=3, num_samples=2
    )
    # Sequences of up to 11 positions, the 16-position bucket: tables of 2
    # pages of 8 (decode programs for views of 1 and 2 pages; pages of 4
    # would add a view of 4).
    engine = paged_decoder.EngineOptions(num_slots=4, page_size=8)
    got = paged_decoder.generate(
        sharded, config, prompts, options, engine=engine, mesh=mesh
    )
    want = decoder.generate(single, config, prompts, options)
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_allclose(got.log_probs, want.log_probs, atol=_ATOL)

  def test_rows_must_split_over_the_batch_shards(self):
    config = ml_collections.FrozenConfigDict(
        tiny_configs.model_config(data_parallelism=2, fsdp_parallelism=4)
    )
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    with self.assertRaisesRegex(
        ValueError,
        "3 prompts x num_samples=1 = 3 rows is not divisible by the "
        "mesh's 8 batch shards",
    ):
      decoder.generate(
          params,
          config,
          [[1], [2], [3]],
          sampling.SamplingOptions(max_new_tokens=2),
          mesh=mesh,
      )


if __name__ == "__main__":
  absltest.main()
