"""Tests of maxtext/model/moe.py: sorted dispatch against a dense reference."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maxtext.model import moe
from testing import random_init


def _config(**overrides):
  """A small MoE layer config with `overrides` applied."""
  config = ml_collections.ConfigDict(
      dict(
          emb_dim=8,
          mlp_dim=16,
          moe_mlp_dim=6,
          num_experts=4,
          num_experts_per_token=2,
          num_shared_experts=0,
          shared_expert_mlp_dim=0,
          shared_expert_gate=False,
          router_score="softmax",
          router_norm_topk=False,
          load_balance_loss="switch",
          capacity_factor=0.0,
          router_bias=False,
          num_expert_groups=1,
          expert_groups_per_token=1,
          routed_scaling_factor=1.0,
      )
  )
  config.update(overrides)
  return config


def _layer(config, seed=0):
  params = moe.init_params(config, 1, random_init.scaled_normal(seed, count=8))
  layer = jax.tree.map(lambda x: x[0], params)
  if config.router_bias:
    # A bias large enough to change choices (zero as initialised).
    layer["router_bias"] = jax.random.uniform(
        jax.random.PRNGKey(seed + 5), layer["router_bias"].shape, maxval=0.5
    )
  return layer


def _deepseek_routing(logits, bias, config):
  """DeepSeek-V3's published router, written from its definition in NumPy:
  sigmoid scores; the choice ranks scores + bias within the best groups (a
  group's rank: the sum of its two best biased scores); the weights are the
  chosen unbiased scores normalised to sum 1, times the scaling factor."""
  logits = np.asarray(logits, np.float64)
  scores = 1 / (1 + np.exp(-logits))
  choice = scores + np.asarray(bias)
  t, x = scores.shape
  g = config.num_expert_groups
  per_group = x // g
  experts = np.zeros((t, config.num_experts_per_token), np.int64)
  for row in range(t):
    grouped = choice[row].reshape(g, per_group)
    group_rank = np.sort(grouped, axis=1)[:, -2:].sum(axis=1)
    best = np.argsort(-group_rank, kind="stable")[
        : config.expert_groups_per_token
    ]
    eligible = np.full(x, -np.inf)
    for group in best:
      span = slice(group * per_group, (group + 1) * per_group)
      eligible[span] = choice[row, span]
    experts[row] = np.argsort(-eligible, kind="stable")[
        : config.num_experts_per_token
    ]
  top = np.take_along_axis(scores, experts, axis=1)
  weights = top / top.sum(axis=1, keepdims=True) * config.routed_scaling_factor
  return weights, experts


def _inputs(seed=1, shape=(2, 5, 8)):
  return jax.random.normal(jax.random.PRNGKey(seed), shape)


_CHOICES = (
    ("softmax_switch", dict()),
    (
        "sigmoid_sequence",
        dict(router_score="sigmoid", load_balance_loss="sequence"),
    ),
    ("top1_shared", dict(num_experts_per_token=1, num_shared_experts=2)),
    (
        "gated_shared_of_its_width",
        dict(
            num_shared_experts=1,
            shared_expert_mlp_dim=10,
            shared_expert_gate=True,
        ),
    ),
    ("capacity_drops", dict(capacity_factor=0.5)),
    (
        "deepseek_bias_groups_scale",
        dict(
            num_experts=8,
            router_score="sigmoid",
            router_bias=True,
            num_expert_groups=4,
            expert_groups_per_token=2,
            routed_scaling_factor=2.5,
        ),
    ),
    (
        "sigmoid_capacity_top3",
        dict(
            router_score="sigmoid",
            num_experts_per_token=3,
            capacity_factor=0.75,
        ),
    ),
)


class MoeTest(parameterized.TestCase):

  @parameterized.named_parameters(*_CHOICES)
  def test_values_and_gradients_match_dense_reference(self, overrides):
    config = _config(**overrides)
    layer, x = _layer(config), _inputs()
    probe = _inputs(seed=7)

    def objective(fn):
      def f(x, p):
        out = fn(x, p)
        return jnp.sum(out * probe), out

      return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))

    (_, got_out), got = objective(lambda x, p: moe.moe_mlp(x, p, config)[0])(
        x, layer
    )
    (_, want_out), want = objective(
        lambda x, p: moe.dense_reference(x, p, config)
    )(x, layer)
    chex.assert_shape(got_out, x.shape)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(got, want, rtol=1e-4, atol=1e-5)

  @parameterized.named_parameters(
      ("switch", "switch"), ("sequence", "sequence")
  )
  def test_balance_loss_and_its_gradient(self, kind):
    # Reference written from the definition, one group at a time.
    config = _config(load_balance_loss=kind)
    logits = jax.random.normal(jax.random.PRNGKey(3), (2, 5, 4))

    def loss(logits):
      probs, _, experts = moe.route(logits.reshape(10, 4), config)
      return moe.balance_loss(
          probs.reshape(2, 5, 4), experts.reshape(2, 5, 2), 4, kind
      )

    def reference(logits):
      groups = [logits.reshape(10, 4)] if kind == "switch" else list(logits)
      total = 0.0
      for group in groups:
        probs = jax.nn.softmax(group, axis=-1)
        chosen = np.asarray(jax.lax.top_k(probs, 2)[1])
        fraction = np.zeros(4)
        for row in chosen:
          for expert in row:
            fraction[expert] += 1.0 / chosen.size
        total = total + 4 * jnp.sum(fraction * jnp.mean(probs, axis=0))
      return total / len(groups)

    # The layer's loss jitted, value and gradient in one program (eagerly,
    # each of its operations compiled apart); the reference stays eager.
    value, grad = jax.jit(jax.value_and_grad(loss))(logits)
    np.testing.assert_allclose(value, reference(logits), rtol=1e-6)
    np.testing.assert_allclose(
        grad,
        jax.grad(reference)(logits),
        rtol=1e-5,
        atol=1e-7,
    )

  def test_uniform_routing_has_balance_loss_one(self):
    probs = jnp.full((1, 4, 4), 0.25)
    experts = jnp.array([[[0], [1], [2], [3]]])
    self.assertAlmostEqual(
        float(moe.balance_loss(probs, experts, 4, "switch")), 1.0, places=6
    )

  def test_sigmoid_weights_are_normalised(self):
    config = _config(router_score="sigmoid", num_experts_per_token=3)
    logits = jax.random.normal(jax.random.PRNGKey(4), (6, 4))
    probs, weights, _ = moe.route(logits, config)
    np.testing.assert_allclose(jnp.sum(weights, -1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(jnp.sum(probs, -1), 1.0, rtol=1e-6)

  def test_softmax_top_k_renormalised_with_router_norm_topk(self):
    # Qwen3-MoE: softmax over all experts, top-k, then the k probabilities
    # divided by their sum; without router_norm_topk they stay as they are.
    logits = jax.random.normal(jax.random.PRNGKey(5), (6, 4))
    probs, plain, experts = moe.route(logits, _config(num_experts_per_token=3))
    _, normed, same = moe.route(
        logits, _config(num_experts_per_token=3, router_norm_topk=True)
    )
    np.testing.assert_array_equal(experts, same)
    chosen = np.take_along_axis(np.asarray(probs), np.asarray(experts), -1)
    np.testing.assert_allclose(plain, chosen, rtol=1e-6)
    np.testing.assert_allclose(
        normed, chosen / chosen.sum(-1, keepdims=True), rtol=1e-6
    )
    self.assertTrue(np.all(np.sum(np.asarray(plain), -1) < 1.0 - 1e-3))

  def test_deepseek_routing_matches_its_definition(self):
    config = _config(
        num_experts=16,
        num_experts_per_token=4,
        router_score="sigmoid",
        router_bias=True,
        num_expert_groups=4,
        expert_groups_per_token=2,
        routed_scaling_factor=2.5,
    )
    logits = jax.random.normal(jax.random.PRNGKey(8), (32, 16))
    bias = jax.random.uniform(jax.random.PRNGKey(9), (16,), maxval=0.3)
    _, weights, experts = moe.route(logits, config, bias)
    want_weights, want_experts = _deepseek_routing(logits, bias, config)
    np.testing.assert_array_equal(experts, want_experts)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-5)
    # Every choice lies in two groups of four consecutive experts.
    for row in np.asarray(experts):
      self.assertLessEqual(len(set(row // 4)), 2)
    # The bias steers the choice, never the weights' values.
    _, unbiased_weights, unbiased = moe.route(logits, config)
    self.assertFalse(np.array_equal(unbiased, experts))
    scores = jax.nn.sigmoid(logits)
    chosen = jnp.take_along_axis(scores, experts, axis=1)
    np.testing.assert_allclose(
        weights, 2.5 * chosen / jnp.sum(chosen, -1, keepdims=True), rtol=1e-5
    )
    del unbiased_weights

  def test_stats(self):
    config = _config(capacity_factor=0.5)
    layer, x = _layer(config), _inputs()

    def stats_of(config):
      # Jitted: one compile, not one per operation of the layer.
      return jax.jit(lambda x, layer: moe.moe_mlp(x, layer, config)[1])(
          x, layer
      )

    stats = stats_of(config)
    self.assertEqual(set(stats), set(moe.STAT_NAMES) | {"expert_load"})
    self.assertEqual(stats["expert_load"].shape, (4,))
    self.assertAlmostEqual(float(jnp.sum(stats["expert_load"])), 1.0, 6)
    # 10 tokens x 2 slots over 4 experts at capacity ceil(0.5*10*2/4) = 3:
    # at most 12 assignments are kept, so at least 8 of 20 are dropped.
    self.assertGreaterEqual(float(stats["dropped"]), 8.0)
    self.assertLessEqual(float(stats["load_min"]), 0.25)
    self.assertGreaterEqual(float(stats["load_max"]), 0.25)
    self.assertGreater(float(stats["router_entropy"]), 0.0)
    self.assertLessEqual(float(stats["router_entropy"]), math.log(4) + 1e-6)
    no_drop = stats_of(_config())
    self.assertEqual(float(no_drop["dropped"]), 0.0)

  def test_summarize_reduces_over_layers(self):
    per_layer = {name: jnp.array([1.0, 3.0]) for name in moe.STAT_NAMES}
    summary = moe.summarize(per_layer)
    self.assertEqual(float(summary["aux_loss"]), 2.0)
    self.assertEqual(float(summary["load_max"]), 3.0)
    self.assertEqual(float(summary["load_min"]), 1.0)
    self.assertEqual(float(summary["dropped"]), 4.0)

  def test_unknown_choices_raise(self):
    with self.assertRaisesRegex(ValueError, "router_score='cosine'"):
      moe.route(jnp.zeros((2, 4)), _config(router_score="cosine"))
    with self.assertRaisesRegex(ValueError, "load_balance_loss='z'"):
      moe.balance_loss(
          jnp.zeros((1, 2, 4)), jnp.zeros((1, 2, 1), jnp.int32), 4, "z"
      )


if __name__ == "__main__":
  absltest.main()
