"""The router bias's updates: the layer's loads, the rule, the engine's step
and a training run that balances its experts with them."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from maxtext import workloads
from maxtext.runtime import mesh as mesh_lib
from maxtext.engine import engine_config
from maxtext.engine import model_setup
from maxtext.model import model_config
from maxtext.model import param_statistics
from maxtext.model import moe
from maxtext.model import transformer
from maxtext.generation import generate
from testing import tiny_configs

RATE = 0.01


def _config(**overrides):
  return tiny_configs.model_config(
      tiny_configs.TINY_MOE,
      {"router_bias": True, "router_bias_update_rate": RATE},
      **overrides,
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
      for _ in range(config.gradient_accumulation_steps)
  ]


class LayerLoadTest(absltest.TestCase):

  def test_expert_load_counts_the_routers_choices(self):
    config = _config()
    rng = np.random.default_rng(1)
    e, x = config.emb_dim, config.num_experts
    layer = {
        "router": jnp.asarray(rng.normal(size=(e, x)), jnp.float32),
        "router_bias": jnp.asarray(rng.normal(size=(x,)), jnp.float32),
        "w_gate": jnp.asarray(rng.normal(size=(x, e, 16)), jnp.float32),
        "w_up": jnp.asarray(rng.normal(size=(x, e, 16)), jnp.float32),
        "w_down": jnp.asarray(rng.normal(size=(x, 16, e)), jnp.float32),
        "shared_w_gate": jnp.zeros((e, 16)),
        "shared_w_up": jnp.zeros((e, 16)),
        "shared_w_down": jnp.zeros((16, e)),
    }
    tokens = jnp.asarray(rng.normal(size=(3, 5, e)), jnp.float32)
    _, stats = moe.moe_mlp(tokens, layer, config)
    _, _, experts = moe.route(
        tokens.reshape(15, e) @ layer["router"], config, layer["router_bias"]
    )
    counts = np.bincount(np.asarray(experts).ravel(), minlength=x)
    np.testing.assert_allclose(
        stats["expert_load"], counts / experts.size, rtol=1e-6
    )

  def test_rule_moves_each_bias_against_its_load(self):
    bias = jnp.asarray([[0.5, -0.25, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    load = jnp.asarray([[0.4, 0.1, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]])
    got = moe.update_router_bias(bias, load, 0.1)
    # Layer 0's mean share is 0.25: expert 0 overloaded, 1 underloaded, 2
    # and 3 exactly balanced; layer 1 is balanced throughout.
    np.testing.assert_allclose(
        got, [[0.4, -0.15, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]], rtol=1e-6
    )


class EngineStepTest(absltest.TestCase):

  def test_a_step_moves_the_bias_by_the_steps_loads_and_nothing_else(self):
    config = _config()
    batches = _batches(config)
    setup = model_setup.setup_model(
        model_config.of(config),
        mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config)),
    )
    params = model_setup.init_params(
        engine_config.EngineConfig.from_config(config), setup
    )
    # Each engine its own copy: the step donates the parameters.
    moved = model_setup.make_engine(
        engine_config.EngineConfig.from_config(config),
        setup,
        jax.tree.map(jnp.copy, params),
    )
    held_config = _config(router_bias_update_rate=0.0)
    held = model_setup.make_engine(
        engine_config.EngineConfig.from_config(held_config),
        setup,
        jax.tree.map(jnp.copy, params),
    )
    self.assertEqual(transformer.statistic_rules(held_config), {})
    # The step's loads, from the loss the engine runs, per micro-batch.
    loads = [
        transformer.loss_fn(params, b, config)[1][param_statistics.KEY][
            transformer.ROUTER_BIAS
        ]
        for b in batches
    ]
    mean_load = np.mean(loads, axis=0)
    for engine in (moved, held):
      for b in batches:
        engine.fwd_bwd(b)
      engine.update()
    bias = np.asarray(moved.params["moe_layers"]["router_bias"])
    expected = RATE * np.sign(
        mean_load.mean(axis=-1, keepdims=True) - mean_load
    )
    np.testing.assert_allclose(bias, expected, atol=1e-7)
    self.assertGreater(np.count_nonzero(bias), 0)
    np.testing.assert_array_equal(
        held.params["moe_layers"]["router_bias"], np.zeros_like(bias)
    )
    # Every other parameter took the same optimizer step in both.
    moved_rest = jax.tree_util.tree_leaves_with_path(moved.params)
    held_rest = dict(jax.tree_util.tree_leaves_with_path(held.params))
    for path, value in moved_rest:
      if param_statistics.path_name(path) != transformer.ROUTER_BIAS:
        np.testing.assert_allclose(value, held_rest[path], rtol=1e-6)


class BalancingTest(absltest.TestCase):

  def test_repeated_updates_even_out_a_skewed_router(self):
    # DeepSeek-V3's routing (sigmoid scores, groups) of fixed tokens whose
    # router favours the first experts: the rule, applied to the loads it
    # sees, evens them out.
    config = _config(
        router_score="sigmoid",
        num_experts=8,
        num_experts_per_token=2,
        num_expert_groups=4,
        expert_groups_per_token=2,
    )
    rng = np.random.default_rng(0)
    logits = jnp.asarray(
        rng.normal(size=(512, 8)) + np.linspace(2.0, -2.0, 8), jnp.float32
    )
    bias = jnp.zeros((1, 8), jnp.float32)

    def load_of(bias):
      _, _, experts = moe.route(logits, config, bias[0])
      return np.bincount(np.asarray(experts).ravel(), minlength=8) / (512 * 2)

    def cv(load):
      return float(np.std(load) / np.mean(load))

    start = cv(load_of(bias))
    for _ in range(300):
      bias = moe.update_router_bias(bias, load_of(bias)[None], 0.01)
    self.assertGreater(start, 1.0)
    self.assertLess(cv(load_of(bias)), 0.1 * start)


class TrainingTest(absltest.TestCase):

  def test_train_main_run_updates_and_saves_the_bias(self):
    out = self.create_tempdir().full_path
    steps = 6
    config = tiny_configs.tiny_config(
        out,
        steps=steps,
        **tiny_configs.TINY_MOE,
        num_layers=2,
        router_bias=True,
        router_bias_update_rate=RATE,
        enable_mllog=False,
    )
    result = workloads.run(config)
    self.assertEqual(result.final_step, steps)
    bias = np.asarray(
        generate.load_run(result.run_dir).params["moe_layers"]["router_bias"]
    )
    # Each step moved every entry by -RATE, 0 or +RATE.
    multiples = bias / RATE
    np.testing.assert_allclose(multiples, np.round(multiples), atol=1e-3)
    self.assertLessEqual(float(np.max(np.abs(multiples))), steps + 1e-3)
    self.assertGreater(np.count_nonzero(np.round(multiples)), 0)


if __name__ == "__main__":
  absltest.main()
