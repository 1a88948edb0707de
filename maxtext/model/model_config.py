"""The model's own config: the fields the network reads, frozen.

The compiled programs that run the model outside the training step (the
cached decoder, the teacher-forced scorer, the windowed sampler, GRPO's
reference pass) take the config as a static argument: JAX keys their compile
cache on its hash and equality. A run's config holds every field of
`maxtext/configs/base.py` (its name, learning rate, paths ...); a model
config holds only the network's, so changing any other field compiles
nothing anew (`model_config_test`).
"""

from typing import Any

import ml_collections

# Every field that maxtext/model/ and maxtext/generation/ read from a config
# (`model_config_test` checks this against their sources).
FIELDS = (
    "attention",
    "attention_output_gate",
    "attention_type",
    "capacity_factor",
    "compute_dtype",
    "emb_dim",
    "expert_groups_per_token",
    "full_attention_interval",
    "head_dim",
    "kv_lora_rank",
    "linear_chunk_size",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_value_head_dim",
    "load_balance_loss",
    "load_balance_loss_weight",
    "loss_chunk_size",
    "max_sequence_length",
    "mlp_chunks",
    "mlp_dim",
    "moe_mlp_dim",
    "norm_epsilon",
    "norm_zero_centered",
    "num_dense_layers",
    "num_expert_groups",
    "num_experts",
    "num_experts_per_token",
    "num_heads",
    "num_kv_heads",
    "num_layers",
    "num_shared_experts",
    "packing",
    "partial_rotary_factor",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_norm",
    "qk_rope_head_dim",
    "remat_policy",
    "rope_high_freq_factor",
    "rope_low_freq_factor",
    "rope_original_max_position",
    "rope_scaling",
    "rope_scaling_factor",
    "rope_theta",
    "rope_yarn_beta_fast",
    "rope_yarn_beta_slow",
    "rope_yarn_mscale",
    "rope_yarn_mscale_all_dim",
    "routed_scaling_factor",
    "router_bias",
    "router_bias_update_rate",
    "router_norm_topk",
    "router_score",
    "shared_expert_gate",
    "shared_expert_mlp_dim",
    "tie_word_embeddings",
    "v_head_dim",
    "vocab_size",
    "weight_dtype",
)


def of(config: Any) -> ml_collections.FrozenConfigDict:
  """The model config of `config`: its `FIELDS` (those it has), frozen.

  Args:
    config: a run's config (ConfigDict or FrozenConfigDict), or a model
      config already (returned as it is).

  Returns:
    A FrozenConfigDict of the model's fields: hashable, equal for any two
    configs whose model fields are equal.
  """
  if isinstance(config, ml_collections.FrozenConfigDict) and set(
      config.keys()
  ) <= set(FIELDS):
    return config
  return ml_collections.FrozenConfigDict(
      {name: config[name] for name in FIELDS if name in config}
  )
