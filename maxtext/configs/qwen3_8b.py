"""Qwen3-8B's shape (Hugging Face Qwen3ForCausalLM), to fine-tune from its
published weights.

The model is Qwen/Qwen3-8B as its config.json states it: 36 layers of
grouped-query attention (32 query heads, 8 key/value heads of width 128)
with an RMSNorm over each query and key head before the rotary embedding
(`qk_norm`), a SwiGLU MLP of width 12288, hidden width 4096, a 151936-entry
vocabulary, untied embedding and unembedding, rotary base 1e6: 8.19B
parameters (`tools/param_count`, equal to transformers' count of the same
config). The other Qwen3 configs import this one and change the shape.

Import the published checkpoint (its shapes checked against this file),
then train from it; export back to Hugging Face:

  tools/bazel run //tools:param_count -- --config=maxtext/configs/qwen3_8b.py
  tools/bazel run //tools:import_checkpoint -- --input=/models/Qwen3-8B \\
      --output_dir=/ckpt/qwen3_8b --config=maxtext/configs/qwen3_8b.py
  tools/bazel run //maxtext:train_main -- \\
      --config=maxtext/configs/qwen3_8b.py \\
      --config.load_parameters_path=/ckpt/qwen3_8b \\
      --config.dataset_type=tokens_file --config.train_data_path=/data/train.npy
  tools/bazel run //tools:export_checkpoint -- --run_dir=/runs/<run> \\
      --output_dir=/models/qwen3_8b_ft --dtype=bfloat16

It needs accelerators (the training state of 8B parameters in float32
with AdamW is about 130 GB, sharded over every device by FSDP).
"""

import ml_collections

from maxtext.configs import base


def get_config() -> ml_collections.ConfigDict:
  """Returns the Qwen3-8B configuration: base.py with the overrides below."""
  config = base.get_config()

  # Qwen3-8B shapes (Qwen/Qwen3-8B config.json).
  config.vocab_size = 151936
  config.emb_dim = 4096
  config.num_layers = 36
  config.num_heads = 32
  config.num_kv_heads = 8
  # Qwen3's head width is its own (not emb_dim / num_heads).
  config.head_dim = 128
  config.mlp_dim = 12288
  config.qk_norm = True
  config.tie_word_embeddings = False
  config.rope_theta = 1_000_000.0
  config.norm_epsilon = 1e-6
  # The model's context is 40960 tokens; training sequences as the import
  # writes them (at most 8192).
  config.max_sequence_length = 8192
  config.weight_dtype = "float32"
  config.compute_dtype = "bfloat16"

  # Memory: flash attention where there is one, only each block's input
  # kept for the backward pass, the loss over the 151936-entry vocabulary
  # 1024 positions at a time.
  config.attention = "auto"
  config.remat_policy = "full"
  config.loss_chunk_size = 1024

  # Shard parameters and optimizer state over every device.
  config.data_parallelism = 1
  config.fsdp_parallelism = -1
  return config
