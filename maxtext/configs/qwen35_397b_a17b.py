"""Qwen3.5-397B-A17B's shape (Hugging Face Qwen3_5MoeForCausalLM, the text
model of Qwen3_5MoeForConditionalGeneration): the model of MLPerf Training
6.1's qwen35_397b_grpo.

60 layers in 15 groups of 3 Gated DeltaNet linear-attention layers and one
gated full-attention layer (`full_attention_interval` 4); hidden width
4096; full attention with 32 query and 2 key/value heads of width 256,
per-head q/k norms, a sigmoid output gate per head and channel, and the
rotary embedding on the first quarter of each head (base 1e7); Gated
DeltaNet with 16 key heads and 64 value heads of width 128, a causal
convolution of kernel 4; every layer a mixture of experts: 512 routed
experts of width 1024, a softmax router choosing 10 per token and
renormalising their probabilities, and one shared expert of width 1024
gated by a sigmoid; norms zero-centred (scale 1 + w) except the DeltaNet
output norm; a 248320-entry vocabulary, untied. `tools/param_count` prints
the total and active counts (the published "397B" and "17B" are rounded;
`param_count_hf_test` checks the total against transformers' count of the
same config).

  tools/bazel run //tools:param_count -- \\
      --config=maxtext/configs/qwen35_397b_a17b.py
  tools/bazel run //tools:import_checkpoint -- \\
      --input=/models/Qwen3.5-397B-A17B --output_dir=/ckpt/qwen35_397b \\
      --config=maxtext/configs/qwen35_397b_a17b.py

Weight decay (`transformer.weight_decay_mask`, matrices only): the
projections, expert weights and the DeltaNet convolution kernels are
decayed; the norm scales, `a_log`, `dt_bias` and the shared expert's gate
vector are not (per-channel constants, as biases and norms are).
"""

import ml_collections

from maxtext.configs import qwen3_30b_a3b


def get_config() -> ml_collections.ConfigDict:
  """Returns the Qwen3.5-397B-A17B configuration: qwen3_30b_a3b.py (the
  Qwen3-MoE router: softmax, top-k renormalised, switch load-balancing
  loss, no capacity limit) with its shape and the Qwen3.5 choices."""
  config = qwen3_30b_a3b.get_config()
  config.vocab_size = 248320
  config.emb_dim = 4096
  config.num_layers = 60
  config.num_heads = 32
  config.num_kv_heads = 2
  config.head_dim = 256
  config.rope_theta = 10_000_000.0
  config.partial_rotary_factor = 0.25
  config.qk_norm = True
  config.norm_zero_centered = True
  config.attention_output_gate = True
  config.norm_epsilon = 1e-6
  config.tie_word_embeddings = False

  config.full_attention_interval = 4
  config.linear_num_key_heads = 16
  config.linear_num_value_heads = 64
  config.linear_key_head_dim = 128
  config.linear_value_head_dim = 128
  config.linear_conv_kernel_dim = 4
  config.linear_chunk_size = 64

  config.num_experts = 512
  config.num_experts_per_token = 10
  config.moe_mlp_dim = 1024
  # No layer has a dense MLP; the field is the expert width for clarity.
  config.mlp_dim = 1024
  config.num_shared_experts = 1
  config.shared_expert_mlp_dim = 1024
  config.shared_expert_gate = True
  return config
