"""MLPerf Training llama31_8b, closed division: a Llama-3.1-8B-shaped model.

Hyperparameters follow the closed-division rules of the MLPerf Training 6.1.0
ruleset for llama31_8b (sequence length, AdamW betas/epsilon/weight decay,
gradient clipping, step count, eval samples, eval target) and the reference
batch size 32 with its learning rate and warmup. The model matches
Llama 3.1 8B's shapes (without Llama 3.1's rope frequency scaling).

Its target is one TPU v5p-8 slice: 4 chips (v5p:2x2x1), 95.74 GiB of HBM
each, FSDP over the 4, the smallest v5p slice. The training state
(parameters, float32 gradients and AdamW moments) takes 30 GiB of each
chip; the memory settings below make the reference batch's activations fit
beside it in one micro-batch. The TPU compiler's figures for them
(docs/PERFORMANCE.md) come from any host, without a TPU:
  tools/bazel run --config=tpu //tools:train_compile -- \
    --config=maxtext/configs/llama31_8b.py --topology=v5p-8

It needs the accelerators and a tokenized corpus:
  tools/bazel run --config=tpu //maxtext:train_main -- \
    --config=maxtext/configs/llama31_8b.py \
    --config.train_data_path=/data/c4_train.npy \
    --config.eval_data_path=/data/c4_validation.npy
"""

import ml_collections

from maxtext.configs import base


def get_config() -> ml_collections.ConfigDict:
  """Returns the llama31_8b configuration: base.py with the overrides below."""
  config = base.get_config()

  # Llama 3.1 8B shapes.
  config.vocab_size = 128256
  config.emb_dim = 4096
  config.num_layers = 32
  config.num_heads = 32
  config.num_kv_heads = 8
  config.head_dim = 128
  config.mlp_dim = 14336
  config.max_sequence_length = 8192
  config.rope_theta = 500000.0
  config.norm_epsilon = 1e-5
  config.weight_dtype = "float32"
  config.compute_dtype = "bfloat16"

  # Tokenized C4 (see the docstring); the paths are given on the command line.
  config.dataset_type = "tokens_file"
  config.train_data_path = "/path/to/c4_train.npy"
  config.eval_data_path = "/path/to/c4_validation.npy"

  # Memory, for the v5p-8 (the TPU compiler's figures, per chip: peak 68.5
  # of 95.74 GiB, 27.2 GiB to spare):
  # "auto" is the splash kernel on a TPU (flash attention: the [S, S] scores
  # of 8192 tokens never exist; XLA attention would need terabytes).
  config.attention = "auto"
  # Keep only each block's input for the backward pass: without remat the
  # activations of 32 layers of 8 sequences of 8192 tokens per chip do not
  # fit. The recomputation costs about a third more FLOPs.
  config.remat_policy = "full"
  # The loss 1024 positions at a time: the float32 logits of 8 sequences per
  # chip over the 128256-entry vocabulary (31 GiB) never exist at once.
  config.loss_chunk_size = 1024
  # The MLP's [8, 8192, 14336] bfloat16 hidden activations per chip (1.75
  # GiB each: gate, up, their product and their gradients) in 4 groups of
  # positions, one at a time, in the backward pass of each layer, where the
  # step's memory peaks.
  config.mlp_chunks = 4

  # Reference batch: 32 sequences of 8192 tokens, no accumulation (one
  # forward-backward program per step).
  config.global_batch_size = 32
  config.gradient_accumulation_steps = 1
  config.steps = 1_200_000  # max_steps of the rules; the target stops earlier.

  # Reference learning rate and warmup for batch 32 (4096 samples = 128 steps);
  # cosine decay over the whole step budget to 10% of the peak.
  config.learning_rate = 8e-4
  config.warmup_steps = 128
  config.lr_schedule_steps = 0
  config.lr_end_fraction = 0.1
  config.adam_b1 = 0.9
  config.adam_b2 = 0.95
  config.adam_eps = 1e-5
  config.weight_decay = 0.1
  config.grad_clip_norm = 1.0

  # Eval every 12288 samples (384 steps of 32) over 1024 samples (32 x 32);
  # the target is the rules' eval loss.
  config.eval_interval = 384
  config.eval_steps = 32
  config.eval_batch_size = 32
  config.target_eval_loss = 3.3

  config.checkpoint_period = 384
  config.log_period = 10

  # Shard parameters and optimizer state over every device.
  config.data_parallelism = 1
  config.fsdp_parallelism = -1

  config.hardware = "tpu"
  config.allow_cpu_fallback = False

  config.enable_mllog = True
  config.submission_platform = "tpu"
  config.submission_division = "closed"
  config.submission_benchmark = "llama31_8b"

  return config
