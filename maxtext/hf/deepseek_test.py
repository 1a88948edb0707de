"""DeepSeek-V3's config.json as published -> the project's fields and back;
the rotary reordering; the tensor names; refusals (no torch needed)."""

import copy

from absl.testing import absltest
import jax
import numpy as np

from maxtext.configs import deepseekv3_671b
from maxtext.config import config_lib
from maxtext.hf import deepseek
from maxtext.model import layers
from maxtext.model import transformer

# config.json of the published DeepSeek-V3 (deepseek-ai/DeepSeek-V3), the
# fields the conversion reads or checks.
PUBLISHED = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "v_head_dim": 128,
    "vocab_size": 129280,
}


class DeepseekTest(absltest.TestCase):

  def test_published_config_gives_the_671b_config(self):
    fields = deepseek.config_fields(PUBLISHED, "config.json")
    config = config_lib.base_with(fields)  # Validates.
    reference = deepseekv3_671b.get_config()
    for key, value in fields.items():
      if key == "max_sequence_length":  # The run's choice, not the model's.
        continue
      self.assertEqual(reference[key], value, key)
    self.assertEqual(config.rope_scaling, "yarn")
    self.assertEqual(config.num_dense_layers, 3)

  def test_exported_config_reads_back_as_the_same_fields(self):
    fields = deepseek.config_fields(PUBLISHED, "config.json")
    config = config_lib.base_with(fields)
    document = deepseek.hf_config(config, "bfloat16")
    self.assertEqual(deepseek.config_fields(document, "exported"), fields)
    for key in ("n_group", "topk_group", "first_k_dense_replace"):
      self.assertEqual(document[key], PUBLISHED[key], key)
    self.assertEqual(document["rope_parameters"]["rope_type"], "yarn")
    self.assertEqual(document["rope_parameters"]["factor"], 40.0)
    self.assertEqual(document["num_nextn_predict_layers"], 0)
    self.assertTrue(document["rope_interleave"])
    no_bottleneck = config_lib.base_with({**fields, "q_lora_rank": 0})
    self.assertIsNone(
        deepseek.hf_config(no_bottleneck, "float32")["q_lora_rank"]
    )

  def test_export_refusals_name_the_field(self):
    fields = deepseek.config_fields(PUBLISHED, "config.json")
    for key, value, message in (
        ("router_score", "softmax", "config.router_score='softmax'"),
        ("router_bias", False, "config.router_bias=False"),
        ("capacity_factor", 1.25, "config.capacity_factor=1.25"),
        ("rope_scaling", "llama3", "config.rope_scaling='llama3'"),
    ):
      config = config_lib.base_with({**fields, key: value})
      with self.assertRaisesRegex(deepseek.UnsupportedError, message):
        deepseek.hf_config(config, "float32")

  def test_multi_token_prediction_is_named_in_a_warning(self):
    (line,) = deepseek.notes(PUBLISHED)
    self.assertIn("model.layers.61..61", line)
    self.assertEqual(
        deepseek.notes({**PUBLISHED, "num_nextn_predict_layers": 0}), []
    )

  def test_refusals_name_the_field(self):
    for key, value, message in (
        ("scoring_func", "softmax", "scoring_func='softmax'"),
        ("topk_method", "greedy", "topk_method='greedy'"),
        ("norm_topk_prob", False, "norm_topk_prob=False"),
        ("hidden_act", "gelu", "hidden_act='gelu'"),
        ("n_routed_experts", None, "n_routed_experts=None"),
    ):
      hf = {**PUBLISHED, key: value}
      with self.assertRaisesRegex(deepseek.UnsupportedError, message):
        deepseek.config_fields(hf, "config.json")
    hf = copy.deepcopy(PUBLISHED)
    hf["rope_scaling"]["type"] = "dynamic"
    with self.assertRaisesRegex(
        deepseek.UnsupportedError, "rope_type 'dynamic' is not supported"
    ):
      deepseek.config_fields(hf, "config.json")
    hf = copy.deepcopy(PUBLISHED)
    hf["quantization_config"]["fmt"] = "e5m2"
    with self.assertRaisesRegex(deepseek.UnsupportedError, "fmt='e5m2'"):
      deepseek.config_fields(hf, "config.json")

  def test_reordering_turns_interleaved_rotation_into_halves(self):
    # DeepSeek's rotation of interleaved pairs, on x, equals this project's
    # rotation of halves on the reordered x, reordered the same way.
    rope_dim, theta = 8, 10000.0
    x = np.random.default_rng(0).normal(size=(1, 5, 1, rope_dim))
    positions = np.arange(5)[None]
    inv_freq = 1.0 / theta ** (np.arange(0, rope_dim, 2) / rope_dim)
    angles = positions[..., None, None] * inv_freq  # [1, S, 1, R/2]
    even, odd = x[..., 0::2], x[..., 1::2]
    interleaved = np.empty_like(x)
    interleaved[..., 0::2] = even * np.cos(angles) - odd * np.sin(angles)
    interleaved[..., 1::2] = odd * np.cos(angles) + even * np.sin(angles)
    order = deepseek.interleave_permutation(rope_dim)
    np.testing.assert_array_equal(order, [0, 2, 4, 6, 1, 3, 5, 7])
    halves = np.asarray(
        layers.rope(x[..., order].astype(np.float32), positions, theta)
    )
    np.testing.assert_allclose(halves, interleaved[..., order], atol=1e-5)

  def test_tensor_names(self):
    hf = {
        **PUBLISHED,
        "hidden_size": 32,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "num_hidden_layers": 4,
        "first_k_dense_replace": 2,
        "num_attention_heads": 2,
        "n_routed_experts": 4,
        "n_group": 2,
        "topk_group": 1,
        "num_experts_per_tok": 2,
        "q_lora_rank": None,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "vocab_size": 64,
    }
    config = config_lib.base_with(deepseek.config_fields(hf, "c"))
    self.assertEqual(config.q_lora_rank, 0)
    abstract = jax.eval_shape(
        lambda key: transformer.init_params(config, key),
        jax.random.PRNGKey(0),
    )
    tensors = {t.hf_name: t for t in deepseek.tensors(abstract, config, hf)}
    q = tensors["model.layers.1.self_attn.q_proj.weight"]
    self.assertEqual((q.path, q.layer), (("layers", "wq"), 1))
    expert = tensors["model.layers.3.mlp.experts.2.down_proj.weight"]
    self.assertEqual(
        (expert.path, expert.layer, expert.expert),
        (("moe_layers", "w_down"), 1, 2),
    )
    bias = tensors["model.layers.2.mlp.gate.e_score_correction_bias"]
    self.assertEqual(
        (bias.path, bias.layer), (("moe_layers", "router_bias"), 0)
    )
    self.assertNotIn("model.layers.0.mlp.gate.weight", tensors)
    self.assertFalse(any(n.startswith("model.layers.4.") for n in tensors))
    # Every parameter element comes from exactly one tensor.
    sizes = {}
    for t in tensors.values():
      shape = t.layout.hf_shape(
          tuple(
              _leaf(abstract, t.path).shape[
                  (t.layer is not None) + (t.expert is not None) :
              ]
          )
      )
      sizes[t.path] = sizes.get(t.path, 0) + int(np.prod(shape))
    for path, size in sizes.items():
      self.assertEqual(size, _leaf(abstract, path).size, path)
    self.assertLen(sizes, len(jax.tree_util.tree_leaves(abstract)))


def _leaf(tree, path):
  for key in path:
    tree = tree[key]
  return tree


if __name__ == "__main__":
  absltest.main()
