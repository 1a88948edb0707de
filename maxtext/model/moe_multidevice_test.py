"""Eight fake CPU devices: experts sharded over the "expert" mesh axis.

The device count is fixed when JAX starts, so this test has its own target and
sets XLA_FLAGS before importing JAX. The reference is the same training on one
device (an engine without shardings), in the same process.
"""

from maxtext import cpu_devices

cpu_devices.request(8)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import functools

from absl.testing import absltest
import chex
import jax
import numpy as np
import optax

from maxtext import engine as engine_lib
from maxtext import mesh as mesh_lib
from maxtext.model import transformer
from maxtext.configs import moe_tiny
from maxtext.metrics import recorder as metrics_recorder
from testing import tiny_configs

_STEPS = 2


def _config():
  """moe_tiny shrunk, on a 2 x 2 x 2 (data, fsdp, expert) mesh."""
  config = moe_tiny.get_config()
  config.update(
      vocab_size=32,
      emb_dim=16,
      num_heads=2,
      num_kv_heads=1,
      head_dim=8,
      mlp_dim=32,
      moe_mlp_dim=8,
      num_layers=2,
      num_dense_layers=1,
      max_sequence_length=8,
      global_batch_size=8,
      gradient_accumulation_steps=1,
      data_parallelism=2,
      fsdp_parallelism=2,
      expert_parallelism=2,
      capacity_factor=1.0,
  )
  return config


def _batches(config):
  rng = np.random.default_rng(0)
  micro = config.global_batch_size // config.gradient_accumulation_steps
  shape = (micro, config.max_sequence_length)
  return [
      {
          "inputs": rng.integers(0, config.vocab_size, shape, np.int32),
          "targets": rng.integers(0, config.vocab_size, shape, np.int32),
      }
      for _ in range(_STEPS * config.gradient_accumulation_steps)
  ]


def _train(config, params, shardings=None, batch_sharding=None):
  """Runs _STEPS engine steps; returns the engine and each step's metrics."""
  engine = engine_lib.Engine(
      functools.partial(transformer.loss_fn, config=config),
      params,
      optax.adamw(1e-2),
      1e-2,
      metrics_recorder.MetricsRecorder(),
      config.gradient_accumulation_steps,
      param_shardings=shardings,
      batch_sharding=batch_sharding,
  )
  records = []
  batches = iter(_batches(config))
  for _ in range(_STEPS):
    for _ in range(config.gradient_accumulation_steps):
      batch = next(batches)
      if batch_sharding is not None:
        batch = jax.device_put(batch, batch_sharding)
      engine.fwd_bwd(batch)
    records.append(metrics_recorder.reduce_buffer(engine.update()))
  return engine, records


class MoeMultiDeviceTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    jax.config.update(
        "jax_compilation_cache_dir", tiny_configs.compilation_cache_dir()
    )

  def test_expert_sharded_run_matches_one_device(self):
    self.assertEqual(jax.device_count(), 8)
    config = _config()
    mesh = mesh_lib.make_mesh(config)
    self.assertEqual(dict(mesh.shape), {"data": 2, "fsdp": 2, "expert": 2})
    self.assertEqual(mesh_lib.expert_size(mesh), 2)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    specs = transformer.param_partition_specs(
        params, 2, expert_size=mesh_lib.expert_size(mesh)
    )
    shardings = mesh_lib.param_shardings(specs, mesh)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    sharded, sharded_records = _train(config, params, shardings, batch_sharding)
    # Experts are split over the expert axis (and their embed dim over fsdp).
    w_up = sharded.params["moe_layers"]["w_up"]
    self.assertEqual(w_up.shape, (1, 4, 16, 8))
    self.assertEqual(w_up.addressable_shards[0].data.shape, (1, 2, 8, 8))
    self.assertEqual(
        w_up.sharding.spec,
        jax.sharding.PartitionSpec(None, "expert", "fsdp", None),
    )
    # Batches over all three axes: 8 rows, one per device.
    batch = jax.device_put(_batches(config)[0], batch_sharding)
    self.assertEqual(batch["inputs"].addressable_shards[0].data.shape, (1, 8))

    one = jax.devices()[0]
    single, single_records = _train(config, jax.device_put(params, one))
    for got, want in zip(sharded_records, single_records):
      for name in (
          "loss",
          "moe/aux_loss",
          "moe/dropped_tokens",
          "moe/load_max",
          "moe/router_entropy",
          "grad_norm",
      ):
        np.testing.assert_allclose(
            got[name], want[name], rtol=2e-5, atol=1e-6, err_msg=name
        )
    chex.assert_trees_all_close(
        jax.device_get(sharded.params),
        jax.device_get(single.params),
        atol=2e-5,
        rtol=2e-5,
    )


if __name__ == "__main__":
  absltest.main()
