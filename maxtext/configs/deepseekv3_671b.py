"""MLPerf Training deepseekv3_671b, closed division: DeepSeek-V3's shape.

The model is DeepSeek-V3 as published (its config.json): 61 layers, the
first 3 with a dense MLP, the other 58 mixture-of-experts layers of 256
routed experts (8 per token, sigmoid router scores) beside one shared
expert, multi-head latent attention (128 heads), hidden width 7168, its
129280-entry vocabulary (the benchmark's Llama 3.1 token ids fit in it) and
untied embedding and unembedding: 671B parameters, 37B active per token
(`tools/param_count`). The multi-token-prediction module is not part of
this engine's model. The router's correction bias is held as the
warm-start checkpoint has it (`router_bias_update_rate` 0, the rate of the
end of DeepSeek-V3's own pre-training).

Hyperparameters follow the closed rules of the MLPerf Training 6.1.0 and
6.0.0 rulesets for deepseekv3_671b (closed_deepseekv3_671b.yaml in the
installed mlperf_logging): sequence length 4096, AdamW 0.9/0.95/1e-8 with
weight decay 0.1, clipping at 1.0, warm-up 4 steps and a cosine decay over
12000 - 4 steps to 1e-8, the sequence-wise balance loss weighted 0.01,
evaluation over 1024 samples with target loss 3.6 after every step from the
rule's first evaluation point on. The global batch is an argument of the
config file (default 16384, a reference batch size; at least 15360); the
learning rate 2.4e-5 * sqrt(batch / 16384), rounded to 9 decimal places as
the reference does, and the first evaluation's sample count follow from it:

  tools/bazel run //maxtext:train_main -- \
    --config=maxtext/configs/deepseekv3_671b.py:16384 \
    --config.train_data_path=/data/c4-train.en_6_text_document \
    --config.eval_data_path=/data/c4-validation-91205-samples.en_text_document \
    --config.load_parameters_path=/ckpt/deepseekv3_warm_start

Set the batch through the argument, not --config.global_batch_size: the
learning rate and first_eval_samples are computed from it.

It needs hundreds of accelerators (per-device training state:
`tools/benchmarks/memory_bench --mesh=...`) and the benchmark's data and
warm-start checkpoint (see docs/models.md and docs/mlperf.md).
"""

import math

import ml_collections

from maxtext.configs import base

# The reference batch size: the rule's learning rate is quoted at it.
REFERENCE_BATCH_SIZE = 16384
# The closed rules' least global batch size.
MIN_BATCH_SIZE = 15360
# The rules' learning rate at REFERENCE_BATCH_SIZE, scaled by sqrt(batch).
REFERENCE_LEARNING_RATE = 2.4e-5
# The reference rounds the scaled rate to this many decimal places.
LEARNING_RATE_DECIMALS = 9


def learning_rate(global_batch_size: int) -> float:
  """The closed rule's peak learning rate at a global batch size."""
  scaled = REFERENCE_LEARNING_RATE * math.sqrt(
      global_batch_size / REFERENCE_BATCH_SIZE
  )
  return round(scaled, LEARNING_RATE_DECIMALS)


def first_eval_samples(global_batch_size: int) -> int:
  """Samples before the first evaluation, where the 6.1.0 rule wants it.

  The rule's first eval_accuracy has samples_count
  global_batch_size * floor(42 + 24576 / global_batch_size).
  """
  return global_batch_size * math.floor(42 + 24576 / global_batch_size)


def get_config(batch: str = "") -> ml_collections.ConfigDict:
  """Returns the deepseekv3_671b configuration.

  Args:
    batch: the global batch size as text (the config file argument,
      `--config=deepseekv3_671b.py:<batch>`); "" = REFERENCE_BATCH_SIZE.

  Raises:
    ValueError: `batch` is not an integer of at least MIN_BATCH_SIZE.
  """
  try:
    global_batch_size = int(batch) if batch else REFERENCE_BATCH_SIZE
  except ValueError:
    raise ValueError(
        f"deepseekv3_671b: the config argument (global batch size) must be "
        f"an integer, got {batch!r}"
    ) from None
  if global_batch_size < MIN_BATCH_SIZE:
    raise ValueError(
        f"deepseekv3_671b: global batch size {global_batch_size} is below "
        f"the closed rules' {MIN_BATCH_SIZE}"
    )
  config = base.get_config()

  # DeepSeek-V3 shapes (deepseek-ai/DeepSeek-V3 config.json).
  config.vocab_size = 129280
  config.emb_dim = 7168
  config.num_layers = 61
  config.num_heads = 128
  config.mlp_dim = 18432  # The dense MLP of the first 3 layers.
  config.attention_type = "mla"
  config.q_lora_rank = 1536
  config.kv_lora_rank = 512
  config.qk_nope_head_dim = 128
  config.qk_rope_head_dim = 64
  config.v_head_dim = 128
  # Unused by MLA; set to the query/key head width so nothing reads 0.
  config.num_kv_heads = 128
  config.head_dim = 192
  config.max_sequence_length = 4096
  # Rows are windows of the C4 stream whose attention crosses documents:
  # the reference's reset_attention_mask=False, so no packing.
  config.packing = False
  config.rope_theta = 10000.0
  # The published rotary scaling of the MLA rotary part: YaRN with factor
  # 40 over an original context of 4096, beta 32 / 1, mscale and
  # mscale_all_dim 1 (the cosines unscaled, the softmax scale times
  # (0.1 ln 40 + 1)^2 = 1.874).
  config.rope_scaling = "yarn"
  config.rope_scaling_factor = 40.0
  config.rope_original_max_position = 4096
  config.rope_yarn_beta_fast = 32.0
  config.rope_yarn_beta_slow = 1.0
  config.rope_yarn_mscale = 1.0
  config.rope_yarn_mscale_all_dim = 1.0
  config.norm_epsilon = 1e-6
  config.weight_dtype = "float32"
  config.compute_dtype = "bfloat16"

  # DeepSeekMoE: 256 routed experts of width 2048, 8 per token, 1 shared.
  config.num_experts = 256
  config.num_experts_per_token = 8
  config.num_shared_experts = 1
  config.num_dense_layers = 3
  config.moe_mlp_dim = 2048
  config.router_score = "sigmoid"
  # The published router: a per-expert correction bias steers the choice
  # (e_score_correction_bias; held as the warm-start checkpoint has it), 8
  # groups of 32 experts of which a token uses its best 4 (n_group,
  # topk_group), and the combine weights scaled by 2.5
  # (routed_scaling_factor).
  config.router_bias = True
  config.num_expert_groups = 8
  config.expert_groups_per_token = 4
  config.routed_scaling_factor = 2.5
  config.load_balance_loss = "sequence"
  # The rules' moe_aux_loss_coeff.
  config.load_balance_loss_weight = 0.01
  config.capacity_factor = 0.0

  # The benchmark's tokenized C4 as the reference ships it: Megatron indexed
  # datasets (docs/data.md), the reference's names under its data directory;
  # the directory on the command line. The eval set is the validation
  # prefix's first 1024 sequences, read whole at every evaluation (the MLPerf
  # pre-flight holds a closed run to it: maxtext/mllog/eval_set.py).
  config.dataset_type = "megatron"
  config.train_data_path = "/preproc_data/c4-train.en_6_text_document"
  config.eval_data_path = (
      "/preproc_data/c4-validation-91205-samples.en_text_document"
  )
  config.megatron_eval_samples = 1024

  # 64 micro-batches: one sequence per device per micro-batch on 256
  # devices at the reference batch.
  config.global_batch_size = global_batch_size
  config.gradient_accumulation_steps = 64
  # max_steps: the schedule's length; the target stops the run far earlier.
  config.steps = 12000

  config.learning_rate = learning_rate(global_batch_size)
  config.warmup_steps = 4
  config.lr_schedule_steps = 12000  # Decay over 12000 - warmup steps.
  config.lr_end_fraction = 1e-8 / config.learning_rate  # Ends at 1e-8.
  config.adam_b1 = 0.9
  config.adam_b2 = 0.95
  config.adam_eps = 1e-8
  config.weight_decay = 0.1
  config.grad_clip_norm = 1.0

  # The first evaluation where the rule puts it, then one after every step,
  # over 1024 sequences (4 x 256, one per device on 256 devices); the
  # target is the rules' eval loss.
  config.first_eval_samples = first_eval_samples(global_batch_size)
  config.eval_interval = 1
  config.eval_steps = 4
  config.eval_batch_size = 256
  config.target_eval_loss = 3.6

  config.checkpoint_period = 0  # Only at the end: a checkpoint is ~8 TB.
  config.log_period = 1

  # Experts over 8 devices, every parameter's other dimensions over the
  # rest (FSDP): on 256 devices expert 8 x fsdp 32 holds 49.4 GB of
  # training state per device (expert 32 x fsdp 8: 74.9 GB, too close to an
  # 80 GB device's capacity; memory_bench --mesh).
  config.data_parallelism = 1
  config.fsdp_parallelism = -1
  config.expert_parallelism = 8

  config.hardware = "gpu"
  config.allow_cpu_fallback = False

  config.enable_mllog = True
  config.submission_platform = "gpu"
  config.submission_division = "closed"
  config.submission_benchmark = "deepseekv3_671b"

  return config
