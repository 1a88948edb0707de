"""The Qwen3.5-MoE choices of the one model on its tiny config.

The hybrid layer pattern's tree, logical axes and weight-decay mask; the
grouped scan against the layers run one by one in their order (DeltaNet,
attention, DeltaNet, attention); gradients that reach every parameter;
each unsupported combination refused in one line naming its field.
transformers' model is the reference in `//maxtext/hf:qwen35_logits_test`.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.model import gated_deltanet
from maxtext.model import moe
from maxtext.model import transformer
from testing import tiny_configs


def _config(**overrides):
  return tiny_configs.model_config(tiny_configs.TINY_QWEN35, **overrides)


def _layer(stack, i):
  return {name: a[i] for name, a in stack.items()}


class HybridTest(parameterized.TestCase):

  def test_tree_axes_and_decay(self):
    config = _config()
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    self.assertEqual(
        sorted(params),
        [
            "embedding",
            "final_norm",
            "linear_layers",
            "moe_layers",
            "unembedding",
        ],
    )
    self.assertEqual(params["linear_layers"]["wq"].shape, (2, 32, 2, 8))
    self.assertEqual(params["moe_layers"]["wq_gate"].shape, (2, 32, 4, 12))
    self.assertEqual(params["moe_layers"]["shared_gate"].shape, (2, 32))
    self.assertEqual(params["linear_layers"]["shared_w_up"].shape, (2, 32, 24))
    # Zero-centred norms start at 0 (scale 1); the DeltaNet output norm at 1.
    np.testing.assert_array_equal(params["final_norm"], 0.0)
    np.testing.assert_array_equal(params["moe_layers"]["q_norm"], 0.0)
    np.testing.assert_array_equal(params["linear_layers"]["out_norm"], 1.0)
    decay = transformer.weight_decay_mask(params)
    self.assertTrue(decay["linear_layers"]["conv_q"])
    self.assertTrue(decay["moe_layers"]["wq_gate"])
    for name in ("a_log", "dt_bias", "out_norm", "attn_norm", "shared_gate"):
      self.assertFalse(decay["linear_layers"][name], name)
    self.assertEqual(
        transformer.param_logical_axes(params)["linear_layers"]["conv_v"],
        ("layers", "conv_kernel", "linear_v_heads", "head_dim"),
    )

  def test_grouped_scan_runs_the_layers_in_order(self):
    config = _config()
    params = transformer.init_params(config, jax.random.PRNGKey(1))
    # Norm scales away from their start, so a norm read wrongly shows.
    params = jax.tree_util.tree_map(
        lambda a: a + 0.1 if a.ndim <= 2 else a, params
    )
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 9), 0, 32)
    x = jnp.take(params["embedding"], tokens, axis=0)

    def norm(x, w):
      return transformer.norm(x, w, config)

    for g in range(2):  # Layer 2g: DeltaNet; layer 2g + 1: attention.
      for stack, mix in (
          ("linear_layers", lambda h, l: gated_deltanet.apply(h, l, config)[0]),
          (
              "moe_layers",
              # pylint: disable-next=protected-access  # One layer alone.
              lambda h, l: transformer._attention(
                  h, l, config, None, transformer.Rows()
              ),
          ),
      ):
        layer = _layer(params[stack], g)
        x = x + mix(norm(x, layer["attn_norm"]), layer)
        x = x + moe.moe_mlp(norm(x, layer["mlp_norm"]), layer, config)[0]
    expected = transformer.unembed(
        norm(x, params["final_norm"]), params["unembedding"]
    )
    np.testing.assert_allclose(
        transformer.apply(params, tokens, config), expected, atol=1e-5
    )

  def test_gradients_reach_every_parameter(self):
    config = _config()
    params = transformer.init_params(config, jax.random.PRNGKey(3))
    tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 8), 0, 32)
    batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1)}
    grads = jax.jit(
        jax.grad(lambda p: transformer.loss_fn(p, batch, config)[0])
    )(params)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
      self.assertGreater(
          float(jnp.abs(g).max()), 0.0, jax.tree_util.keystr(path)
      )

  @parameterized.named_parameters(
      (
          "dense",
          dict(num_experts=0),
          "config.full_attention_interval=2: needs experts",
      ),
      ("dense_layers", dict(num_dense_layers=1), "config.num_dense_layers=1"),
      ("layers", dict(num_layers=3), "config.num_layers=3: must be a multiple"),
      ("bias", dict(router_bias=True), "config.router_bias=True"),
      (
          "rotary",
          dict(partial_rotary_factor=0.3),
          "config.partial_rotary_factor=0.3",
      ),
      ("gate", dict(num_shared_experts=0), "config.shared_expert_gate=True"),
      (
          "mla",
          dict(tiny_configs.TINY_MLA, full_attention_interval=0, qk_norm=False),
          "config.attention_output_gate=True: needs attention_type 'gqa'",
      ),
  )
  def test_unsupported_combinations_are_refused(self, overrides, message):
    config = _config(**overrides)
    with self.assertRaisesRegex(ValueError, message) as raised:
      transformer.init_params(config, jax.random.PRNGKey(0))
    self.assertNotIn("\n", str(raised.exception))


if __name__ == "__main__":
  absltest.main()
