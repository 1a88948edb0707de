"""Tests of the cache layout and its size per token."""

from absl.testing import absltest
import jax
import jax.numpy as jnp

from maxtext.generation import kv_cache
from maxtext.model import gated_deltanet
from testing import tiny_configs


class KvCacheTest(absltest.TestCase):

  def test_gqa_layout_and_bytes(self):
    config = tiny_configs.model_config()  # 2 layers, 2 kv heads of 8
    cache = kv_cache.init(config, 3, 16)
    shapes = jax.tree_util.tree_map(lambda x: x.shape, cache)
    self.assertEqual(
        shapes, {"layers": {"k": (2, 3, 16, 2, 8), "v": (2, 3, 16, 2, 8)}}
    )
    self.assertEqual(kv_cache.bytes_per_token(config), 2 * 2 * 2 * 8 * 4)
    self.assertEqual(
        kv_cache.total_bytes(cache), kv_cache.bytes_per_token(config) * 48
    )

  def test_mla_keeps_the_latent_and_the_rotary_key(self):
    config = tiny_configs.model_config(tiny_configs.TINY_MLA)
    cache = kv_cache.init(config, 1, 8)
    shapes = jax.tree_util.tree_map(lambda x: x.shape, cache)
    # kv_lora_rank 12, qk_rope_head_dim 4.
    self.assertEqual(
        shapes,
        {"layers": {"kv_latent": (2, 1, 8, 12), "k_rope": (2, 1, 8, 4)}},
    )
    self.assertEqual(kv_cache.bytes_per_token(config), 2 * (12 + 4) * 4)
    # Expanded keys (8 + 4) and values (6) of 4 heads: 72 numbers a layer.
    self.assertEqual(kv_cache.expanded_bytes_per_token(config), 2 * 72 * 4)

  def test_hybrid_keeps_entries_for_attention_and_states_for_deltanet(self):
    # 4 layers, attention every 2nd: 2 attention layers with keys and
    # values, 2 Gated DeltaNet layers with a state per row (kernel 4: 3
    # inputs of each convolution; 2 key heads of 8, 4 value heads of 6).
    config = tiny_configs.model_config(tiny_configs.TINY_QWEN35)
    self.assertEqual(config.compute_dtype, "float32")
    k, d = config.num_kv_heads, config.head_dim
    cache = kv_cache.init(config, 3, 8)
    shapes = jax.tree_util.tree_map(lambda x: x.shape, cache)
    self.assertEqual(
        shapes["moe_layers"], {"k": (2, 3, 8, k, d), "v": (2, 3, 8, k, d)}
    )
    self.assertEqual(
        shapes["linear_layers"],
        gated_deltanet.State(
            conv_q=(2, 3, 3, 2, 8),
            conv_k=(2, 3, 3, 2, 8),
            conv_v=(2, 3, 3, 4, 6),
            recurrent=(2, 3, 4, 8, 6),
        ),
    )
    self.assertEqual(cache["linear_layers"].recurrent.dtype, jnp.float32)
    self.assertEqual(kv_cache.bytes_per_token(config), 2 * 2 * k * d * 4)
    per_layer = (3 * 2 * 8 * 2 + 3 * 4 * 6 + 4 * 8 * 6) * 4
    self.assertEqual(kv_cache.state_bytes_per_row(config), 2 * per_layer)
    self.assertEqual(
        kv_cache.total_bytes(cache),
        3 * 8 * kv_cache.bytes_per_token(config)
        + 3 * kv_cache.state_bytes_per_row(config),
    )
    # The paged pool holds the attention entries only.
    self.assertEqual(
        sorted(kv_cache.init_entries(config, 5, 4)), ["moe_layers"]
    )
    self.assertEqual(
        kv_cache.state_bytes_per_row(tiny_configs.model_config()), 0
    )

  def test_moe_stacks_follow_the_parameters(self):
    config = tiny_configs.model_config(tiny_configs.TINY_MOE)
    cache = kv_cache.init(config, 2, 4)
    self.assertEqual(sorted(cache), ["layers", "moe_layers"])
    self.assertEqual(cache["moe_layers"]["k"].shape, (1, 2, 4, 2, 8))


if __name__ == "__main__":
  absltest.main()
