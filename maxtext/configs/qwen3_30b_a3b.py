"""Qwen3-30B-A3B's shape (Hugging Face Qwen3MoeForCausalLM).

`qwen3_8b.py` with Qwen/Qwen3-30B-A3B's config.json shape: 48 layers, 32
query heads and 4 key/value heads of width 128, hidden width 2048, and
every layer a mixture-of-experts layer: 128 routed experts of width 768, a
softmax router choosing 8 per token whose probabilities are renormalised
to sum to 1 (`router_norm_topk`, its norm_topk_prob), no shared expert:
30.53B parameters, 3.35B active per token (`tools/param_count`; the total
equals transformers' count of the same config).

  tools/bazel run //tools:param_count -- \\
      --config=maxtext/configs/qwen3_30b_a3b.py
  tools/bazel run //tools:import_checkpoint -- \\
      --input=/models/Qwen3-30B-A3B --output_dir=/ckpt/qwen3_30b_a3b \\
      --config=maxtext/configs/qwen3_30b_a3b.py
"""

import ml_collections

from maxtext.configs import qwen3_8b


def get_config() -> ml_collections.ConfigDict:
  """Returns the Qwen3-30B-A3B configuration: qwen3_8b.py with its shape."""
  config = qwen3_8b.get_config()
  config.emb_dim = 2048
  config.num_layers = 48
  config.num_heads = 32
  config.num_kv_heads = 4
  # Qwen3-MoE's dense MLP width (intermediate_size); with no dense layer
  # (mlp_only_layers empty) no parameter has it.
  config.mlp_dim = 6144

  config.num_experts = 128
  config.num_experts_per_token = 8
  config.moe_mlp_dim = 768
  config.num_shared_experts = 0
  config.num_dense_layers = 0
  config.router_score = "softmax"
  config.router_norm_topk = True
  config.router_bias = False
  # Its router_aux_loss_coef.
  config.load_balance_loss = "switch"
  config.load_balance_loss_weight = 0.001
  config.capacity_factor = 0.0
  return config
