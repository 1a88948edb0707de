"""Eight fake CPU devices: the paged engine's data-parallel replicas.

On a mesh with a "data" axis of R devices the engine runs R replicas, each
with its own slots and its own block of the page pool
(`replica_layout`). The references are the static decoder and the engine
on one device, in the same process, with the parameters unsharded: the
ids must be the same and the log-probabilities the same up to float32
summation order. The device count is fixed when JAX starts, so this test
has its own target and sets XLA_FLAGS before importing JAX.
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

from maxtext.engine import engine_config
from maxtext.engine import model_setup
from maxtext.model import model_config
from maxtext.generation import decoder
from maxtext.generation import paged_decoder
from maxtext.generation import paged_model
from maxtext.generation import paged_sizes
from maxtext.generation import sampling
from maxtext.runtime import mesh as mesh_lib
from testing import tiny_configs

# float32 results of the sharded and the one-device programs agree to this
# (absolute): only the order of sums differs.
_ATOL = 1e-4

# The engines' pages and decode chunk (`paged_decoder.EngineOptions`).
_PAGE = 8
_CHUNK = 4

_DATA2_FSDP2_TENSOR2 = dict(
    data_parallelism=2, fsdp_parallelism=2, tensor_parallelism=2
)


# repr((presets, layout)) -> _setup's result: the cases of one model and mesh
# share its parameters (no case changes them) and so the programs compiled
# for them.
_SETUPS = {}


def _setup(presets, layout):
  """(config, mesh, parameters split as the trainer splits them, the same
  parameters gathered onto one device)."""
  key = repr((presets, sorted(layout.items())))
  if key not in _SETUPS:
    config = ml_collections.FrozenConfigDict(
        tiny_configs.model_config(*presets, max_sequence_length=32, **layout)
    )
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    sharded = model_setup.init_params(
        engine_config.EngineConfig.from_config(config),
        model_setup.setup_model(model_config.of(config), mesh),
    )
    # Uncommitted, on the default device, as a one-device run's parameters
    # are: committed ones would make the one-device engine compile some of
    # its decode programs again after its warm-up (they meet a pool its own
    # programs committed).
    single = jax.device_put(jax.device_get(sharded))
    _SETUPS[key] = config, mesh, sharded, single
  return _SETUPS[key]


class PagedReplicasTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    jax.config.update(
        "jax_compilation_cache_dir", tiny_configs.compilation_cache_dir()
    )

  @parameterized.named_parameters(
      ("gqa_data2_fsdp2_tensor2", (), _DATA2_FSDP2_TENSOR2),
      ("gqa_data4_fsdp2", (), dict(data_parallelism=4, fsdp_parallelism=2)),
      # Qwen3.5's hybrid: per-slot Gated DeltaNet states split with the
      # slots.
      (
          "hybrid_data2_fsdp2_tensor2",
          (tiny_configs.TINY_QWEN35,),
          _DATA2_FSDP2_TENSOR2,
      ),
      (
          "mla_moe_data2_fsdp2_expert2",
          (tiny_configs.TINY_MLA, tiny_configs.TINY_MOE),
          dict(data_parallelism=2, fsdp_parallelism=2, expert_parallelism=2),
      ),
  )
  def test_replicas_match_one_device(self, presets, layout):
    config, mesh, sharded, single = _setup(presets, layout)
    replicas = mesh.shape["data"]
    self.assertGreater(replicas, 1)
    rng = np.random.default_rng(8)
    # Pages of 8: the context of 8 ids shares all its pages with its
    # continuations, the others end in a partial page each continuation
    # copies.
    prompts = [
        [int(i) for i in rng.integers(0, 32, size=n)] for n in (6, 4, 2, 8, 5)
    ]
    g = 2
    # The longest context and max_new_tokens fit the shortest cache length
    # bucket (16 positions, 2 pages): each engine compiles a decode program
    # for table views of 1 and 2 pages (pages of 4 would add a view of 4,
    # a program more per engine, and check the replicas no differently).
    options = sampling.SamplingOptions(
        max_new_tokens=8, temperature=1.0, seed=4, num_samples=g
    )
    # Long-tailed limits: most rows stop within a step or two, a few run
    # on past a decode call's chunk of 4 steps, so replicas empty at
    # different times.
    limits = (8, 1, 1, 2, 1, 7, 1, 1, 3, 1)
    want = decoder.generate(single, config, prompts, options)
    # 1 slot: one per replica; 2R + 1: rounded up to 3 per replica, more
    # slots than rows on 4 replicas.
    for slots in (1, 2 * replicas + 1):
      engine = paged_decoder.EngineOptions(
          num_slots=slots, page_size=_PAGE, chunk=_CHUNK
      )
      got = paged_decoder.generate(
          sharded,
          config,
          prompts,
          options,
          max_new_tokens=limits,
          engine=engine,
          mesh=mesh,
      )
      np.testing.assert_array_equal(got.lengths, limits)
      for row, length in enumerate(limits):
        np.testing.assert_array_equal(
            got.ids[row, :length], want.ids[row, :length]
        )
        np.testing.assert_allclose(
            got.log_probs[row, :length],
            want.log_probs[row, :length],
            atol=_ATOL,
        )
      self.assertTrue(np.all(got.ids[got.ids != sampling.PAD_ID] >= 0))
      self.assertEqual(got.prefill_passes, len(prompts))
      # The four contexts of 6, 4, 2 and 5 ids copy their partial last
      # page for all but their last continuation.
      self.assertEqual(got.page_copies, 4 * (g - 1))
      if slots == 1:
        one = paged_decoder.generate(
            single,
            config,
            prompts,
            options,
            max_new_tokens=limits,
            engine=paged_decoder.EngineOptions(
                num_slots=replicas, page_size=_PAGE, chunk=_CHUNK
            ),
        )
        np.testing.assert_array_equal(got.ids, one.ids)
        np.testing.assert_allclose(got.log_probs, one.log_probs, atol=_ATOL)

  def test_fewer_rows_than_replicas(self):
    # One context and one continuation on 4 replicas: three replicas idle
    # (their prefill rows empty, their slots inactive) while one decodes.
    config, mesh, sharded, single = _setup(
        (), dict(data_parallelism=4, fsdp_parallelism=2)
    )
    options = sampling.SamplingOptions(
        max_new_tokens=7, temperature=1.0, seed=9, stop_ids=(5,)
    )
    prompts = [[3, 1, 4, 1, 5, 9]]
    # The pages and chunk of test_replicas_match_one_device's engines: on
    # this model and mesh its one-slot engine's programs serve this call
    # too (one slot per replica, the same pool, buckets and draws' shapes).
    got = paged_decoder.generate(
        sharded,
        config,
        prompts,
        options,
        engine=paged_decoder.EngineOptions(page_size=_PAGE, chunk=_CHUNK),
        mesh=mesh,
    )
    want = decoder.generate(single, config, prompts, options)
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_allclose(got.log_probs, want.log_probs, atol=_ATOL)
    # One slot rounded up to one per replica; the default pool holds each
    # replica's slot's longest sequence and one waiting context: two
    # tables' pages per replica.
    width = paged_sizes.table_width(config, 6 + 7, _PAGE)
    self.assertEqual(
        got.cache_bytes, paged_model.pool_bytes(config, 4 * 2 * width, _PAGE)
    )
    self.assertEqual(got.prefill_passes, 1)

  def test_a_replica_too_small_for_one_sequence_is_refused(self):
    # 6 pages would hold the sequence's 4, but each replica has 3.
    config, mesh, sharded, _ = _setup(
        (), dict(data_parallelism=2, fsdp_parallelism=4)
    )
    with self.assertRaisesRegex(
        ValueError,
        r"^num_pages=6 pages of 4 \(3 for each of 2 data replicas\) cannot "
        r"hold one sequence",
    ):
      paged_decoder.generate(
          sharded,
          config,
          [[1] * 9],
          sampling.SamplingOptions(max_new_tokens=6),
          engine=paged_decoder.EngineOptions(page_size=4, num_pages=5),
          mesh=mesh,
      )

  @parameterized.named_parameters(
      ("gqa_data2_fsdp2_tensor2", (), _DATA2_FSDP2_TENSOR2, 2, 2),
      (
          "mla_data4_fsdp2",
          (tiny_configs.TINY_MLA,),
          dict(data_parallelism=4, fsdp_parallelism=2),
          4,
          1,
      ),
  )
  def test_each_device_holds_its_replicas_block_of_the_pool(
      self, presets, layout, replicas, heads_split
  ):
    config = ml_collections.FrozenConfigDict(
        tiny_configs.model_config(*presets, **layout)
    )
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    sharding = paged_decoder.pool_sharding(config, mesh)
    pages = 8
    pool = jax.jit(
        lambda: paged_model.init_pool(config, pages, 4),
        out_shardings=sharding,
    )()
    for leaf in jax.tree_util.tree_leaves(pool):
      want = list(leaf.shape)
      want[1] //= replicas
      if leaf.ndim == 5:
        want[3] //= heads_split
      for shard in leaf.addressable_shards:
        self.assertEqual(list(shard.data.shape), want)
      # Each replica's devices hold pages r * N / R ..: its own block.
      blocks = {shard.index[1].start or 0 for shard in leaf.addressable_shards}
      self.assertEqual(blocks, set(range(0, pages, pages // replicas)))


if __name__ == "__main__":
  absltest.main()
