"""Qwen3-0.6B's shape (Hugging Face Qwen3ForCausalLM, tied embeddings).

`qwen3_8b.py` with Qwen/Qwen3-0.6B's config.json shape: 28 layers, 16
query heads and 8 key/value heads of width 128 (wider together than the
hidden width 1024), a SwiGLU MLP of width 3072, and the unembedding tied
to the embedding: 0.60B parameters (`tools/param_count`, equal to
transformers' count of the same config).

  tools/bazel run //tools:param_count -- --config=maxtext/configs/qwen3_0_6b.py
  tools/bazel run //tools:import_checkpoint -- --input=/models/Qwen3-0.6B \\
      --output_dir=/ckpt/qwen3_0_6b --config=maxtext/configs/qwen3_0_6b.py
"""

import ml_collections

from maxtext.configs import qwen3_8b


def get_config() -> ml_collections.ConfigDict:
  """Returns the Qwen3-0.6B configuration: qwen3_8b.py with its shape."""
  config = qwen3_8b.get_config()
  config.emb_dim = 1024
  config.num_layers = 28
  config.num_heads = 16
  config.num_kv_heads = 8
  config.mlp_dim = 3072
  config.tie_word_embeddings = True
  # Full remat but for the attention's context (the splash kernel's output
  # and log-sum-exp), so the backward pass does not run the forward kernel
  # again: at 4 x 2048 on one v5e chip a step is 5% shorter than at full
  # remat, and batch 8 x 2048 still fits there (docs/PERFORMANCE.md, "Full
  # remat but the attention's context").
  config.remat_policy = "save_context"
  # The loss's logits over the 151936-entry vocabulary 512 positions at a
  # time, written in bfloat16 and reduced in float32 (MaxText's numerics;
  # half the traffic of float32 logits, a step 1% faster at 4 x 2048 on one
  # v5e chip: docs/PERFORMANCE.md, "The loss's logits in bfloat16"). At
  # batch 8 x 2048 on one v5e chip (15.75 GiB) a step fits with 512-position
  # chunks (14.68 GiB), not with 1,024 (17.00)
  # (`tools/train_compile --topology=v5litepod-1`).
  config.loss_chunk_size = 512
  config.logits_dtype = "bfloat16"
  return config
