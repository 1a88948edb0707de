"""Tests of the model with multi-head latent attention (maxtext/model/mla.py).

Dense and mixture-of-experts MLA models train through `transformer.loss_fn`, the
remat policies give the same gradients, every parameter has a partition
spec, and a run sharded over four fake CPU devices (fixed when JAX starts,
so this test has its own target and sets XLA_FLAGS before importing JAX)
computes the one-device gradients. The layer itself is tested in
mla_test.py.
"""

from maxtext.runtime import cpu_devices

cpu_devices.request(4)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.runtime import mesh as mesh_lib
from maxtext.model import transformer
from testing import tiny_configs

# pylint: enable=wrong-import-position,wrong-import-order,ungrouped-imports


def _model_config(*presets, **overrides):
  """The tiny test model with MLA attention, then `presets` and `overrides`."""
  return tiny_configs.model_config(tiny_configs.TINY_MLA, *presets, **overrides)


def _batch(config, batch=4, seed=0):
  rng = np.random.default_rng(seed)
  shape = (batch, config.max_sequence_length)
  return {
      "inputs": jnp.asarray(rng.integers(0, config.vocab_size, shape)),
      "targets": jnp.asarray(rng.integers(0, config.vocab_size, shape)),
  }


def _loss_and_grads(config, params, batch):
  return jax.jit(
      jax.value_and_grad(
          functools.partial(transformer.loss_fn, config=config), has_aux=True
      )
  )(params, batch)


class MlaModelTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("dense_full_rank_q", dict(q_lora_rank=0)),
      ("experts_low_rank_q", tiny_configs.TINY_MOE),
  )
  def test_trains(self, overrides):
    config = _model_config(overrides)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    attention = params["moe_layers" if "num_experts" in overrides else "layers"]
    self.assertIn("wkv_b", attention)
    self.assertNotIn("wk", attention)
    batch = _batch(config)
    tx = optax.adam(1e-2)

    @jax.jit
    def step(params, opt_state):
      (loss, _), grads = jax.value_and_grad(transformer.loss_fn, has_aux=True)(
          params, batch, config
      )
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    opt_state = tx.init(params)
    losses = []
    for _ in range(8):
      params, opt_state, loss = step(params, opt_state)
      losses.append(float(loss))
    chex.assert_tree_all_finite(params)
    self.assertLess(losses[-1], 0.8 * losses[0], losses)

  def test_remat_grads_match_no_remat(self):
    reference = _model_config()
    params = transformer.init_params(reference, jax.random.PRNGKey(2))
    batch = _batch(reference)
    (ref_loss, _), ref_grads = _loss_and_grads(reference, params, batch)
    # "full" recomputes everything; "save_named" keeps the names MLA tags.
    # ("save_dots" keeps matmul outputs, attention-agnostic: model_test.)
    for policy in ("full", "save_named"):
      config = _model_config(remat_policy=policy)
      (loss, _), grads = _loss_and_grads(config, params, batch)
      np.testing.assert_allclose(loss, ref_loss, rtol=1e-6, err_msg=policy)
      chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-7)

  def test_block_tags_the_saved_names(self):
    # save_named keeps what the block tags; MLA tags what gqa does.
    config = _model_config()
    params = jax.eval_shape(
        lambda: transformer.init_params(config, jax.random.PRNGKey(0))
    )
    jaxpr = str(
        jax.make_jaxpr(functools.partial(transformer.loss_fn, config=config))(
            params, _batch(config)
        )
    )
    for name in transformer.SAVED_NAMES:
      self.assertIn(f"name={name}", jaxpr)


class MlaShardingTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("low_rank_q", dict()), ("full_rank_q", dict(q_lora_rank=0))
  )
  def test_every_parameter_has_a_partition_spec(self, overrides):
    config = _model_config(tiny_configs.TINY_MOE, overrides)
    shapes = jax.eval_shape(
        lambda: transformer.init_params(config, jax.random.PRNGKey(0))
    )
    specs = transformer.param_partition_specs(shapes, 4, expert_size=2)
    jax.tree.map(
        lambda x, spec: self.assertLen(spec, x.ndim),
        shapes,
        specs,
        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
    )
    for stack in ("layers", "moe_layers"):
      self.assertIn("wkv_b", specs[stack])

  @parameterized.named_parameters(("experts", tiny_configs.TINY_MOE, 2, 2))
  def test_sharded_gradients_match_one_device(self, overrides, fsdp, experts):
    config = _model_config(overrides)
    params = transformer.init_params(config, jax.random.PRNGKey(3))
    specs = transformer.param_partition_specs(params, fsdp, expert_size=experts)
    axes = transformer.param_logical_axes(params)
    jax.tree.map(
        lambda x, names: self.assertLen(names, x.ndim),
        params,
        axes,
        is_leaf=lambda x: isinstance(x, tuple),
    )
    # The big attention matrices are really split, over fsdp x expert
    # (every axis that holds a share of the batch but "data").
    stack = params["moe_layers" if experts > 1 else "layers"]
    stack_specs = specs["moe_layers" if experts > 1 else "layers"]
    for name in ("wkv_a", "wkv_b", "wo"):
      self.assertIn(("fsdp", "expert"), tuple(stack_specs[name]), name)
    mesh = jax.sharding.Mesh(
        devices=np.array(jax.devices()[:4]).reshape((1, fsdp, experts)),
        axis_names=("data", "fsdp", "expert"),
    )
    sharded = jax.device_put(params, mesh_lib.param_shardings(specs, mesh))
    sharded_stack = sharded["moe_layers" if experts > 1 else "layers"]
    for name in ("wkv_a", "wkv_b", "wo"):
      shard = sharded_stack[name].addressable_shards[0].data
      self.assertEqual(shard.size * fsdp * experts, stack[name].size, name)
    batch = _batch(config)
    (loss, _), grads = _loss_and_grads(config, sharded, batch)
    (ref_loss, _), ref_grads = _loss_and_grads(config, params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-4, atol=1e-6)


if __name__ == "__main__":
  absltest.main()
