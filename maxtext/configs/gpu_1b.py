"""A 1B-class model on one NVIDIA GPU (H200, 141 GB): seq 2048, batch 32.

The shape of the accelerators issue's measurements: width 2048, 16 layers,
16 query heads sharing 8 key/value heads of 128, SwiGLU 8192, vocabulary
32768, about 1.3B parameters. Weights and optimizer state stay float32 (the
update's precision); activations and matmuls run in bfloat16. The memory
settings below come from `tools/benchmarks/memory_bench` (its table for this
file is in docs/PERFORMANCE.md): with them a global batch of 32 compiles
well inside one H200 without gradient accumulation.

Synthetic data by default, so it runs anywhere:
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 tools/bazel run --config=gpu \
    //maxtext:train_main -- --config=maxtext/configs/gpu_1b.py
On tokenized data add --config.dataset_type=tokens_file and the two paths.
"""

import ml_collections

from maxtext.configs import base


def get_config() -> ml_collections.ConfigDict:
  """Returns the 1B GPU configuration: base.py with the overrides below."""
  config = base.get_config()

  config.vocab_size = 32768
  config.emb_dim = 2048
  config.num_layers = 16
  config.num_heads = 16
  config.num_kv_heads = 8  # Grouped-query attention: 2 query heads per kv.
  config.head_dim = 128
  config.mlp_dim = 8192
  config.max_sequence_length = 2048
  config.weight_dtype = "float32"
  config.compute_dtype = "bfloat16"

  # "auto" is cuDNN's fused flash attention on the GPU: no [B, N, S, S]
  # scores in memory (einsum on a CPU, where memory_bench also runs).
  config.attention = "auto"
  # Keep q/k/v, the attention context and the attention and MLP outputs of
  # each block, recompute the rest (norms, RoPE, the SwiGLU gate): most of
  # full remat's memory saving for a fraction of its recomputation.
  config.remat_policy = "save_named"
  # The loss 512 positions at a time: the float32 logits of a batch of 32
  # (8.6 GB at once) never exist, 2.1 GB per chunk instead.
  config.loss_chunk_size = 512
  # The logits written in bfloat16 (1.1 GB a chunk), reduced in float32:
  # MaxText's numerics, and 60.5% MFU against 59.9% in float32 at 8 x 2048
  # on one v5e chip (docs/PERFORMANCE.md, "The loss's logits in bfloat16").
  config.logits_dtype = "bfloat16"

  # 32 sequences of 2048 tokens per step, no accumulation.
  config.global_batch_size = 32
  config.gradient_accumulation_steps = 1
  config.steps = 1000
  config.learning_rate = 3e-4
  config.warmup_steps = 100
  config.eval_interval = 200
  config.eval_steps = 4
  config.eval_batch_size = 32
  config.checkpoint_period = 500

  # Whatever accelerator JAX finds (logged at start-up); one GPU is a 1x1
  # mesh, several shard parameters and optimizer state (FSDP).
  config.hardware = "auto"
  config.data_parallelism = 1
  config.fsdp_parallelism = -1
  config.submission_platform = "gpu"

  return config
