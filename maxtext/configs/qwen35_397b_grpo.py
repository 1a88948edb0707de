"""MLPerf Training qwen35_397b_grpo: closed hyperparameters, Qwen3.5-397B.

The hyperparameters are the closed rules of MLPerf Training 6.1.0 for
qwen35_397b_grpo (closed_qwen35_397b_grpo.yaml and rcps_qwen35_397b_grpo.json
of the installed mlperf_logging): 16 completions per prompt, sequences of
65536 tokens (an episode's whole conversation), AdamW 0.9 / 0.999 / 1e-8 without
weight decay at a constant learning rate 1e-6 * sqrt(batch / 256) with no
warm-up, clipping at 0.125 * sqrt(256 / batch), rollouts at temperature 1.0
and top-p 1.0, evaluations of 251 held-out prompts at temperature 0.1 and
top-p 0.95, the first after batch * ceil(2.5 + 3840 / batch) samples and
then after every step, until held-out grouped pass@4 (4 samples per task, a
task passing if any does) exceeds 0.69. The global batch (prompts x 16) is
the config file's argument (default 256, a reference batch size; the
reference points are 256, 512 and 1024), as in the command below.

The model is the benchmark's, Qwen3.5-397B-A17B (`qwen35_397b_a17b.py`:
Gated DeltaNet layers beside gated attention, 512-expert MoE); import the
published checkpoint with `//tools:import_checkpoint` and pass it as
`load_parameters_path`: its tokenizer files, copied beside it, are the
policy's tokenizer and Qwen3.5's own chat template (`grpo_tokenizer_path`
""). Rollouts run on the paged decoder, which carries each Gated DeltaNet
layer's state per sequence.

The episodes are the benchmark's (`maxtext/env/benchmark_task.py`):
R2E-Gym-shaped software tasks, each played in its image's root filesystem
under bubblewrap with the OpenHands-style tools (execute_bash,
str_replace_editor, finish), tool calls read in the qwen3_xml form, the
reward 1 when the task's tests pass. As the reference's recipe
(grpo_qwen35_397b_swe_openhands_async.yaml): at most 30 model turns, each
episode 1800 s of its own, and 65536 tokens per episode in all, its first
prompt counted (a turn may take all that is left). The benchmark's files
are fields: a run without them is refused in one line before any device
work (docs/grpo.md, "The benchmark's inputs"):

  tools/bazel run //maxtext:grpo_main -- \
    --config=maxtext/configs/qwen35_397b_grpo.py:256 \
    --config.load_parameters_path=/ckpt/warm_start \
    --config.grpo_task_curriculum_path=/data/curriculum.jsonl \
    --config.grpo_task_curriculum_sha256=<published digest> \
    --config.grpo_task_validation_path=/data/validation.jsonl \
    --config.grpo_task_validation_sha256=<published digest> \
    --config.grpo_task_rootfs_dir=/data/rootfs

This config proves the log's header against the closed rules
(`header_proof`, the pre-flight of every run with a log); a closed
submission needs the reference's files as well (docs/mlperf.md).

The loss is the reference's (NeMo-RL's GRPO as mlcommons/training
llm_post_training configures it; docs/grpo.md has the table of settings,
fields and tests): the leave-one-out baseline over the other completions'
std (ddof 1), the PPO ratio forced to 1 with each token weighted by
pi_train / pi_generator, sequence-mask truncated importance sampling in
[0.999, 1.002], sequences with a log-probability error above 2.0 masked,
overlong completions filtered, no KL term, the MoE router frozen. As the
reference's (`max_trajectory_age_steps` 1), rollouts are drawn one step
ahead (`grpo_max_age` 1): rollout s + 1 is drawn with the parameters
before update s while update s runs.
"""

import math

import ml_collections

from maxtext.configs import qwen35_397b_a17b

# The reference batch size: the rules' learning rate and clip are quoted at it.
REFERENCE_BATCH_SIZE = 256
REFERENCE_LEARNING_RATE = 1e-6
REFERENCE_CLIP_NORM = 0.125
# Completions per prompt (the closed rules fix it).
GENERATIONS = 16
# Sequences per micro-batch (the reference points' batch / accumulation).
MICRO_BATCH = 8
# An episode's tokens in all, its first prompt counted (the closed rules'
# max_sequence_length, the reference's max_total_sequence_length).
SEQUENCE = 65536
# A first prompt of at least this many tokens can use the whole SEQUENCE:
# the loss reads SEQUENCE - PROMPT_LENGTH columns after a first prompt
# (`episode_rollout`). The benchmark's first prompts (system prompt, the
# three tools' schemas in the template, the issue) are longer; a shorter
# one ends its episode below SEQUENCE by the difference.
PROMPT_LENGTH = 256
# The reference recipe's agent_max_turns and swebench_agent_timeout.
MAX_TURNS = 30
EPISODE_SECONDS = 1800.0
# Held-out grouped pass@4 must exceed this (the rules' target accuracy).
RULES_TARGET = 0.69
# Samples per held-out task of the reference's validation (pass@4).
EVAL_SAMPLES_PER_TASK = 4
# Held-out tasks: what the pinned 6.1.0 checker requires of eval_samples
# (the reference README's validation file has 256; docs/mlperf.md).
EVAL_TASKS = 251
# The reference's stop id in Qwen3.5's vocabulary: overlong filtering needs
# one.
STOP_ID = 248046


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
  # run's prompts come from its task.
  config = qwen35_397b_a17b.get_config()
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
  config.grpo_eval_prompts = EVAL_TASKS
  config.grpo_eval_samples_per_prompt = EVAL_SAMPLES_PER_TASK
  config.grpo_eval_target_metric = f"pass@{EVAL_SAMPLES_PER_TASK}"
  config.grpo_stop_ids = str(STOP_ID)

  # The benchmark's episodes (see the docstring). Its files are the user's:
  # the grpo_task_* paths and digests stay base.py's "" here, and
  # benchmark_task refuses a run that leaves any of them so (a prompt
  # template is optional: "" is the task's built-in one).
  config.grpo_task = "maxtext.env.benchmark_task:make_task"
  # "": the tokenizer and chat template imported beside the checkpoint.
  config.grpo_tokenizer_path = ""
  config.grpo_max_turns = MAX_TURNS
  # 0: a turn may take all that is left of the episode.
  config.grpo_max_turn_tokens = 0
  config.grpo_episode_timeout_seconds = EPISODE_SECONDS
  # Task images run under bubblewrap, never unisolated.
  config.grpo_allow_unisolated_tools = False
  # The task's tests are the whole reward (the verifier).
  config.grpo_reward_functions = ""

  # The reference's loss (docs/grpo.md, "The MLPerf reference's loss").
  config.grpo_advantage_estimator = "rloo_normalized"
  config.grpo_advantage_eps = 1e-6
  config.grpo_loss_aggregation = "token_mean"
  config.grpo_epsilon = 0.2
  config.grpo_epsilon_high = 0.28  # Inert: the forced ratio is 1.
  config.grpo_force_on_policy_ratio = True
  config.grpo_tis_ratio_min = 0.999
  config.grpo_tis_ratio_max = 1.002
  config.grpo_logprob_error_threshold = 2.0
  config.grpo_overlong_filtering = True
  config.grpo_freeze_router = True
  config.grpo_beta = 0.0  # No KL term, no reference policy.
  # The reference's asynchronous GRPO, max_trajectory_age_steps 1.
  config.grpo_max_age = 1

  # The first evaluation where the rule puts it, then one after every step.
  config.first_eval_samples = first_eval_samples(global_batch_size)
  config.eval_interval = 1
  # The run stops at grouped pass@4 >= this: the least float above the
  # rules' 0.69, so it stops exactly when the rules' "above 0.69" holds.
  config.grpo_target_pass_rate = math.nextafter(RULES_TARGET, 1.0)

  config.checkpoint_period = 0
  config.log_period = 1

  config.enable_mllog = True
  config.submission_platform = "gpu"
  config.hardware = "gpu"
  config.submission_division = "closed"
  config.submission_benchmark = "qwen35_397b_grpo"
  return config
