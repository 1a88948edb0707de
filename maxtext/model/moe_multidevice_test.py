"""Eight fake CPU devices: experts sharded over the "expert" mesh axis, the
other weights over fsdp x expert.

The device count is fixed when JAX starts, so this test has its own target and
sets XLA_FLAGS before importing JAX. The references are the same layer, and
the same training, on one device, in the same process.
"""

from maxtext.runtime import cpu_devices

cpu_devices.request(8)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

from maxtext.engine import engine as engine_lib
from maxtext.runtime import mesh as mesh_lib
from maxtext.model import moe
from maxtext.model import transformer
from maxtext.configs import moe_tiny
from maxtext.metrics import recorder as metrics_recorder
from maxtext.runtime import axis_rules
from maxtext.storage import checkpointing
from testing import random_init
from testing import tiny_configs

_STEPS = 2


def _config(**overrides):
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
  )
  config.update(overrides)
  return config


def _layer_config(data, fsdp, expert, **overrides):
  """moe_tiny's MoE layer widened to 8 experts (1 shared), on a data x fsdp
  x expert mesh of 8 devices."""
  config = moe_tiny.get_config()
  config.update(
      emb_dim=16,
      mlp_dim=32,
      moe_mlp_dim=8,
      num_experts=8,
      num_experts_per_token=2,
      num_shared_experts=1,
      data_parallelism=data,
      fsdp_parallelism=fsdp,
      expert_parallelism=expert,
      dcn_data_parallelism=1,
  )
  config.update(overrides)
  return config


def _objective(config, mesh):
  """A scalar of the layer's output and balance loss, and both."""

  def objective(x, layer):
    out, stats = moe.moe_mlp(x, layer, config, mesh)
    probe = jnp.cos(jnp.arange(out.size, dtype=out.dtype).reshape(out.shape))
    return jnp.sum(out * probe) + stats["aux_loss"], (out, stats)

  return jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))


def _on_mesh(x, layer, mesh):
  """x split over every mesh axis; experts over "expert", the rest whole."""
  expert = P(mesh_lib.EXPERT_AXIS) if mesh_lib.expert_size(mesh) > 1 else P()
  return (
      jax.device_put(x, mesh_lib.batch_sharding(mesh)),
      {
          name: jax.device_put(
              value,
              NamedSharding(mesh, expert if name.startswith("w_") else P()),
          )
          for name, value in layer.items()
      },
  )


def _batches(config, seed=0):
  rng = np.random.default_rng(seed)
  micro = config.global_batch_size // config.gradient_accumulation_steps
  shape = (micro, config.max_sequence_length)
  return [
      {
          "inputs": rng.integers(0, config.vocab_size, shape, np.int32),
          "targets": rng.integers(0, config.vocab_size, shape, np.int32),
      }
      for _ in range(_STEPS * config.gradient_accumulation_steps)
  ]


def _engine(config, params, shardings=None, batch_sharding=None, mesh=None):
  return engine_lib.Engine(
      functools.partial(transformer.loss_fn, config=config, mesh=mesh),
      params,
      optax.adamw(1e-2),
      1e-2,
      metrics_recorder.MetricsRecorder(),
      config.gradient_accumulation_steps,
      param_shardings=shardings,
      batch_sharding=batch_sharding,
  )


def _steps(engine, config, batch_sharding=None, seed=0):
  """Runs _STEPS engine steps; returns each step's metrics."""
  records = []
  batches = iter(_batches(config, seed))
  for _ in range(_STEPS):
    for _ in range(config.gradient_accumulation_steps):
      batch = next(batches)
      if batch_sharding is not None:
        batch = jax.device_put(batch, batch_sharding)
      engine.fwd_bwd(batch)
    records.append(metrics_recorder.reduce_buffer(engine.update()))
  return records


def _train(config, params, shardings=None, batch_sharding=None, mesh=None):
  """Runs _STEPS engine steps; returns the engine and each step's metrics."""
  engine = _engine(config, params, shardings, batch_sharding, mesh)
  return engine, _steps(engine, config, batch_sharding)


def _shardings(params, mesh, rules=axis_rules.PARAMETERS):
  """The parameters' shardings on `mesh` under the logical-axis `rules`."""
  return mesh_lib.param_shardings(
      transformer.param_partition_specs(
          params,
          mesh.shape[mesh_lib.FSDP_AXIS],
          expert_size=mesh_lib.expert_size(mesh),
          rules=rules,
      ),
      mesh,
  )


def _abstract(state, mesh):
  """What a checkpoint restores onto: `state`'s shapes and shardings (the
  step counter, a host value, replicated), as the trainer's resume asks."""
  replicated = NamedSharding(mesh, P())
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(
          np.shape(x),
          x.dtype,
          sharding=getattr(x, "sharding", None) or replicated,
      ),
      state,
  )


_METRICS = (
    "loss",
    "moe/aux_loss",
    "moe/dropped_tokens",
    "moe/load_max",
    "moe/router_entropy",
    "grad_norm",
)


def _assert_same_training(got_records, want_records, got, want):
  """Equal step metrics and final parameters (float tolerance: the
  reductions run in another order)."""
  for got_step, want_step in zip(got_records, want_records, strict=True):
    for name in _METRICS:
      np.testing.assert_allclose(
          got_step[name], want_step[name], rtol=2e-5, atol=1e-6, err_msg=name
      )
  chex.assert_trees_all_close(
      jax.device_get(got.params),
      jax.device_get(want.params),
      atol=2e-5,
      rtol=2e-5,
  )


def _shard_elements(tree) -> int:
  """Elements one device holds of a pytree of arrays."""
  return sum(
      x.addressable_shards[0].data.size for x in jax.tree_util.tree_leaves(tree)
  )


class MoeMultiDeviceTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    jax.config.update(
        "jax_compilation_cache_dir", tiny_configs.compilation_cache_dir()
    )

  def _layer(self, config):
    """One layer's parameters (a random router bias when it has one) and
    16 sequences of 4 positions."""
    params = moe.init_params(config, 1, random_init.scaled_normal(0, count=8))
    layer = jax.tree.map(lambda a: a[0], params)
    if config.router_bias:
      layer["router_bias"] = jax.random.uniform(
          jax.random.PRNGKey(5), layer["router_bias"].shape, maxval=0.5
      )
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4, config.emb_dim))
    return x, layer

  @parameterized.named_parameters(
      ("experts_over_2", (2, 2, 2), {}),
      ("experts_over_8", (1, 1, 8), {}),
      ("fsdp_only", (1, 8, 1), {}),
      (
          "sigmoid_sequence_top3",
          (1, 4, 2),
          dict(
              router_score="sigmoid",
              load_balance_loss="sequence",
              num_experts_per_token=3,
          ),
      ),
      (
          "deepseek_bias_groups",
          (2, 1, 4),
          dict(
              router_score="sigmoid",
              router_bias=True,
              num_expert_groups=4,
              expert_groups_per_token=2,
              routed_scaling_factor=2.5,
          ),
      ),
  )
  def test_per_device_dispatch_matches_one_device(self, shape, overrides):
    config = _layer_config(*shape, **overrides)
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    self.assertEqual(mesh_lib.expert_size(mesh), shape[2])
    x, layer = self._layer(config)
    (want_value, (want_out, want_stats)), want_grads = _objective(config, None)(
        x, layer
    )
    (got_value, (got_out, got_stats)), got_grads = _objective(config, mesh)(
        *_on_mesh(x, layer, mesh)
    )
    # Each device routed only its own tokens: the output keeps the batch
    # split over every axis.
    self.assertTrue(
        got_out.sharding.is_equivalent_to(mesh_lib.batch_sharding(mesh), 3),
        got_out.sharding,
    )
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_value, want_value, rtol=1e-5)
    chex.assert_trees_all_close(got_stats, want_stats, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(
        jax.device_get(got_grads),
        jax.device_get(want_grads),
        rtol=1e-4,
        atol=1e-5,  # Sums in another order; the gradients are O(1).
    )

  def test_capacity_counts_the_expert_groups_tokens(self):
    config = _layer_config(1, 4, 2, capacity_factor=0.5)
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    x, layer = self._layer(config)
    (_, (got_out, got_stats)), _ = _objective(config, mesh)(
        *_on_mesh(x, layer, mesh)
    )
    # The batch's rows go to the devices in order, expert axis last, so
    # the 4 expert groups hold 4 consecutive rows each: one call per group
    # on one device is the reference.
    # One device's layer as one program (the 4 groups share it), not op by
    # op.
    one_device = jax.jit(lambda rows, layer: moe.moe_mlp(rows, layer, config))
    outs, dropped = [], 0.0
    for rows in np.split(np.asarray(x), 4):
      out, stats = one_device(jnp.asarray(rows), layer)
      outs.append(out)
      dropped += float(stats["dropped"])
    self.assertGreater(dropped, 0)
    np.testing.assert_allclose(
        got_out, np.concatenate(outs), rtol=1e-5, atol=1e-6
    )
    self.assertEqual(float(got_stats["dropped"]), dropped)
    # One group for the whole batch drops differently: the grouping is
    # what the test checks.
    _, whole = one_device(x, layer)
    self.assertNotEqual(float(whole["dropped"]), dropped)

  @parameterized.named_parameters(("k1", 1), ("k2", 2))
  def test_expert_sharded_run_matches_one_device(self, accumulation):
    self.assertEqual(jax.device_count(), 8)
    # One sequence per device per micro-batch.
    config = _config(
        global_batch_size=8 * accumulation,
        gradient_accumulation_steps=accumulation,
    )
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    self.assertEqual(dict(mesh.shape), {"data": 2, "fsdp": 2, "expert": 2})
    self.assertEqual(mesh_lib.expert_size(mesh), 2)
    # On the host: each engine places (and may donate) its own copy.
    params = jax.device_get(
        transformer.init_params(config, jax.random.PRNGKey(0))
    )
    batch_sharding = mesh_lib.batch_sharding(mesh)
    sharded, sharded_records = _train(
        config, params, _shardings(params, mesh), batch_sharding, mesh
    )
    # Experts are split over the expert axis (and their embed dim over fsdp).
    w_up = sharded.params["moe_layers"]["w_up"]
    self.assertEqual(w_up.shape, (1, 4, 16, 8))
    self.assertEqual(w_up.addressable_shards[0].data.shape, (1, 2, 8, 8))
    self.assertEqual(w_up.sharding.spec, P(None, "expert", "fsdp", None))
    # Every other weight over fsdp x expert: the dense layer's MLP, the
    # MoE layer's attention, the embedding; and AdamW's moments with them.
    fsdp_expert = ("fsdp", "expert")
    dense_up = sharded.params["layers"]["w_up"]
    self.assertEqual(dense_up.sharding.spec, P(None, None, fsdp_expert))
    self.assertEqual(dense_up.addressable_shards[0].data.shape, (1, 16, 8))
    self.assertEqual(
        sharded.params["moe_layers"]["wq"].sharding.spec,
        P(None, fsdp_expert, None, None),
    )
    self.assertEqual(
        sharded.params["embedding"].sharding.spec, P(fsdp_expert, None)
    )
    moments = sharded.opt_state[0]
    for tree in (moments.mu, moments.nu):
      self.assertEqual(tree["layers"]["w_up"].sharding, dense_up.sharding)
      self.assertEqual(tree["moe_layers"]["w_up"].sharding, w_up.sharding)
    # Batches over all three axes: 8 rows, one per device.
    batch = jax.device_put(_batches(config)[0], batch_sharding)
    self.assertEqual(batch["inputs"].addressable_shards[0].data.shape, (1, 8))

    # On the default device, uncommitted as the engine's step counter and
    # flags are: committed parameters with uncommitted scalars compiled
    # each step program a second time at the second call.
    single, single_records = _train(config, jax.device_put(params))
    _assert_same_training(sharded_records, single_records, sharded, single)

    # The layout before (non-expert weights over fsdp only, repeated in
    # each expert group) trains the same, holding more per device.
    old, old_records = _train(
        config,
        params,
        _shardings(params, mesh, axis_rules.FSDP_ONLY),
        batch_sharding,
        mesh,
    )
    self.assertEqual(
        old.params["layers"]["w_up"].sharding.spec, P(None, None, "fsdp")
    )
    _assert_same_training(sharded_records, old_records, sharded, old)
    self.assertLess(
        _shard_elements(sharded.params), _shard_elements(old.params)
    )
    self.assertLess(
        _shard_elements(sharded.opt_state), _shard_elements(old.opt_state)
    )

  @parameterized.named_parameters(
      ("old_to_new", axis_rules.FSDP_ONLY, axis_rules.PARAMETERS),
      ("new_to_old", axis_rules.PARAMETERS, axis_rules.FSDP_ONLY),
  )
  def test_a_checkpoint_restores_in_the_other_layout(self, saved, restored):
    config = _config()
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    params = jax.device_get(
        transformer.init_params(config, jax.random.PRNGKey(0))
    )
    batch_sharding = mesh_lib.batch_sharding(mesh)
    writer, _ = _train(
        config, params, _shardings(params, mesh, saved), batch_sharding, mesh
    )
    directory = self.create_tempdir().full_path
    with checkpointing.Checkpointer(
        directory, save_period=1, max_to_keep=1
    ) as ckpt:
      self.assertTrue(ckpt.save(writer.step, writer.state, {}))
    # A fresh engine in the other layout resumes from it, as a run does.
    shardings = _shardings(params, mesh, restored)
    reader = _engine(config, params, shardings, batch_sharding, mesh)
    with checkpointing.Checkpointer(
        directory, save_period=1, max_to_keep=1
    ) as ckpt:
      got = ckpt.restore_newest(_abstract(reader.state, mesh))
    self.assertEqual(got.step, _STEPS)
    reader.set_state(got.state)
    self.assertEqual(reader.step, writer.step)
    jax.tree.map(
        lambda x, s: self.assertEqual(x.sharding, s), reader.params, shardings
    )
    chex.assert_trees_all_equal(
        jax.device_get(reader.state), jax.device_get(writer.state)
    )
    # And both train on alike.
    _assert_same_training(
        _steps(reader, config, batch_sharding, seed=1),
        _steps(writer, config, batch_sharding, seed=1),
        reader,
        writer,
    )


if __name__ == "__main__":
  absltest.main()
