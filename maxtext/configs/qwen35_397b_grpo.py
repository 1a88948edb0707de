"""MLPerf Training qwen35_397b_grpo: closed hyperparameters, a stand-in model.

The hyperparameters are the closed rules of MLPerf Training 6.1.0 for
qwen35_397b_grpo (closed_qwen35_397b_grpo.yaml and rcps_qwen35_397b_grpo.json
of the installed mlperf_logging): 16 completions per prompt, sequences of
65536 tokens (prompt and completion), AdamW 0.9 / 0.999 / 1e-8 without
weight decay at a constant learning rate 1e-6 * sqrt(batch / 256) with no
warm-up, clipping at 0.125 * sqrt(256 / batch), rollouts at temperature 1.0
and top-p 1.0, evaluations of 251 held-out prompts at temperature 0.1 and
top-p 0.95, the first after batch * ceil(2.5 + 3840 / batch) samples and
then after every step, until held-out pass@1 exceeds 0.69. The global batch
(prompts x 16) is the config file's argument (default 256, a reference batch
size; the reference points are 256, 512 and 1024):

  tools/bazel run //maxtext:grpo_main -- \
    --config=maxtext/configs/qwen35_397b_grpo.py:256 \
    --config.load_parameters_path=/ckpt/warm_start

The model is NOT Qwen3.5-397B-A17B: that model (a mixture of experts with
linear-attention layers beside full attention) is not one this engine can
build. The config uses the Llama-3.1-8B-shaped model of `llama31_8b.py`
(its 128256-entry vocabulary holds the built-in progression task's 65536-term
sequences), and the task is the built-in progression task
(`maxtext/grpo/progression_task.py`), not the benchmark's. So this config
proves the log's header against the closed rules (`header_proof`, the
pre-flight of every run with a log); it is not a closed submission, which
needs the reference model, data set and checkpoint (docs/mlperf.md).
"""

import math

import ml_collections

from maxtext.configs import llama31_8b

# The reference batch size: the rules' learning rate and clip are quoted at it.
REFERENCE_BATCH_SIZE = 256
REFERENCE_LEARNING_RATE = 1e-6
REFERENCE_CLIP_NORM = 0.125
# Completions per prompt (the closed rules fix it).
GENERATIONS = 16
# Sequences per micro-batch (the reference points' batch / accumulation).
MICRO_BATCH = 8
# Prompt and completion together (the closed rules' max_sequence_length).
SEQUENCE = 65536
PROMPT_LENGTH = 2048
# Held-out pass@1 must exceed this (the rules' target accuracy).
RULES_TARGET = 0.69


def learning_rate(global_batch_size: int) -> float:
  """The closed rule's learning rate at a global batch size."""
  return REFERENCE_LEARNING_RATE * math.sqrt(
      global_batch_size / REFERENCE_BATCH_SIZE
  )


def grad_clip_norm(global_batch_size: int) -> float:
  """The closed rule's gradient clipping norm at a global batch size."""
  return REFERENCE_CLIP_NORM * math.sqrt(
      REFERENCE_BATCH_SIZE / global_batch_size
  )


def first_eval_samples(global_batch_size: int) -> int:
  """Samples before the first evaluation, where the 6.1.0 rule wants it:
  global_batch_size * ceil(2.5 + 3840 / global_batch_size)."""
  return global_batch_size * math.ceil(2.5 + 3840 / global_batch_size)


def get_config(batch: str = "") -> ml_collections.ConfigDict:
  """Returns the qwen35_397b_grpo configuration.

  Args:
    batch: the global batch size as text (the config file argument,
      `--config=qwen35_397b_grpo.py:<batch>`); "" = REFERENCE_BATCH_SIZE.

  Raises:
    ValueError: `batch` is not a positive multiple of GENERATIONS.
  """
  try:
    global_batch_size = int(batch) if batch else REFERENCE_BATCH_SIZE
  except ValueError:
    raise ValueError(
        f"qwen35_397b_grpo: the config argument (global batch size) must be "
        f"an integer, got {batch!r}"
    ) from None
  if global_batch_size < 1 or global_batch_size % GENERATIONS:
    raise ValueError(
        f"qwen35_397b_grpo: global batch size {global_batch_size} is not a "
        f"positive multiple of {GENERATIONS} (prompts x completions)"
    )
  # The model (see the docstring); its data set fields are not read: a GRPO
  # run's prompts come from the built-in task.
  config = llama31_8b.get_config()
  config.workload = "grpo"
  config.dataset_type = "synthetic"
  config.train_data_path = ""
  config.eval_data_path = ""
  config.max_sequence_length = SEQUENCE

  config.global_batch_size = global_batch_size
  config.grpo_num_generations = GENERATIONS
  config.gradient_accumulation_steps = max(global_batch_size // MICRO_BATCH, 1)
  config.grpo_num_iterations = 1
  # max_steps: a budget; the target ends the run first (the reference
  # points converge within 18 steps at 256).
  config.steps = 100

  config.lr_schedule = "constant"
  config.learning_rate = learning_rate(global_batch_size)
  config.warmup_steps = 0
  config.lr_schedule_steps = 0
  config.adam_b1 = 0.9
  config.adam_b2 = 0.999
  config.adam_eps = 1e-8
  config.weight_decay = 0.0
  config.grad_clip_norm = grad_clip_norm(global_batch_size)

  config.grpo_prompt_length = PROMPT_LENGTH
  config.grpo_max_completion_length = SEQUENCE - PROMPT_LENGTH
  config.grpo_temperature = 1.0
  config.grpo_top_p = 1.0
  config.grpo_top_k = 0
  config.grpo_eval_temperature = 0.1
  config.grpo_eval_top_p = 0.95
  config.grpo_eval_prompts = 251
  config.grpo_reward_functions = "maxtext.grpo.progression_task:exact_match"
  config.grpo_beta = 0.0

  # The first evaluation where the rule puts it, then one after every step.
  config.first_eval_samples = first_eval_samples(global_batch_size)
  config.eval_interval = 1
  # The run stops at pass@1 >= this: the least float above the rules' 0.69,
  # so it stops exactly when the rules' "above 0.69" holds.
  config.grpo_target_pass_rate = math.nextafter(RULES_TARGET, 1.0)

  config.checkpoint_period = 0
  config.log_period = 1

  config.enable_mllog = True
  config.submission_platform = "gpu"
  config.hardware = "gpu"
  config.submission_division = "closed"
  config.submission_benchmark = "qwen35_397b_grpo"
  return config
