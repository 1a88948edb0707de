"""Tests of the cache layout and its size per token."""

from absl.testing import absltest
import jax

from maxtext.generation import kv_cache
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

  def test_hybrid_model_is_refused_in_one_line(self):
    config = tiny_configs.model_config(tiny_configs.TINY_QWEN35)
    with self.assertRaisesRegex(
        ValueError, "config.full_attention_interval=2: the cached decoder"
    ):
      kv_cache.init(config, 1, 8)

  def test_moe_stacks_follow_the_parameters(self):
    config = tiny_configs.model_config(tiny_configs.TINY_MOE)
    cache = kv_cache.init(config, 2, 4)
    self.assertEqual(sorted(cache), ["layers", "moe_layers"])
    self.assertEqual(cache["moe_layers"]["k"].shape, (1, 2, 4, 2, 8))


if __name__ == "__main__":
  absltest.main()
