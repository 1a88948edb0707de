"""The model `//tools/benchmarks:decode_bench` generates with on the CPU.

`default.py` with a model of about 19M parameters (6 layers of width 384,
6 query heads sharing 2 key/value heads of 64, MLP 1536, a vocabulary of
8192) that sees 512 positions: long enough that a windowed sampler's
full-window pass per token and a cache's one-token step differ as they do
for real models.

  tools/bazel run //tools/benchmarks:decode_bench

With the argument `hybrid` (`--config=maxtext/configs/decode_bench.py:hybrid`)
the same width as a Qwen3.5-style hybrid: two groups of two Gated DeltaNet
layers (2 key and 4 value heads of 64, kernel 4, chunks of 64) and one gated
attention layer (per-head q/k norms, rotary on a quarter of each head), every
layer a mixture of 8 experts of width 384 (2 per token, renormalised) with a
gated shared expert of 384, zero-centred norms.
"""

import ml_collections

from maxtext.configs import default


def get_config(model: str = "") -> ml_collections.ConfigDict:
  """Returns default.py with the benchmark's model.

  Args:
    model: "" (grouped-query attention) or "hybrid" (module docstring).

  Raises:
    ValueError: another model name.
  """
  if model not in ("", "hybrid"):
    raise ValueError(
        f"decode_bench.py: the config argument must be '' or 'hybrid', got "
        f"{model!r}"
    )
  config = default.get_config()
  config.vocab_size = 8192
  config.emb_dim = 384
  config.num_layers = 6
  config.num_heads = 6
  config.num_kv_heads = 2
  config.head_dim = 64
  config.mlp_dim = 1536
  config.max_sequence_length = 512
  if model == "hybrid":
    config.full_attention_interval = 3
    config.norm_zero_centered = True
    config.attention_output_gate = True
    config.partial_rotary_factor = 0.25
    config.qk_norm = True
    config.linear_num_key_heads = 2
    config.linear_num_value_heads = 4
    config.linear_key_head_dim = 64
    config.linear_value_head_dim = 64
    config.linear_conv_kernel_dim = 4
    config.linear_chunk_size = 64
    config.num_experts = 8
    config.num_experts_per_token = 2
    config.moe_mlp_dim = 384
    config.num_dense_layers = 0
    config.router_score = "softmax"
    config.router_norm_topk = True
    config.capacity_factor = 0.0
    config.num_shared_experts = 1
    config.shared_expert_mlp_dim = 384
    config.shared_expert_gate = True
  return config
