"""GRPO on the built-in math task (text, one turn) with a tiny model.

Word problems with numeric answers (maxtext/env/math_task.py) rendered with
the built-in byte-level ChatML tokenizer (259 ids, maxtext/text/byte_chat.py),
answers checked by `math-verify`. Start from an SFT run on the task's
demonstrations (`load_parameters_path`; docs/grpo.md has the pipeline):

  tools/bazel run //maxtext:train_main -- \\
      --config=maxtext/configs/grpo_math_tiny.py \\
      --config.load_parameters_path=/tmp/maxtext_runs/sft_math_tiny/checkpoints
"""

import ml_collections

from maxtext.configs import default


def get_config() -> ml_collections.ConfigDict:
  """default.py's model width, a byte vocabulary, the math task."""
  config = default.get_config()
  config.run_name = "grpo_math_tiny"
  config.workload = "grpo"
  config.load_parameters_path = ""
  # The byte-level tokenizer's 259 ids fit; a rendered problem is about 80
  # tokens, its answer at most 24.
  config.vocab_size = 320
  config.max_sequence_length = 160
  config.grpo_task = "maxtext.env.math_task:make_task"
  config.grpo_tokenizer_path = "byte_chatml"
  config.grpo_reward_functions = "maxtext.env.math_task:correct"
  config.grpo_prompt_length = 112
  config.grpo_max_completion_length = 24
  config.grpo_max_turns = 1

  # 4 problems x 8 answers per step.
  config.global_batch_size = 32
  config.gradient_accumulation_steps = 2
  config.grpo_num_generations = 8
  config.steps = 100
  config.lr_schedule = "constant"
  config.learning_rate = 5e-4
  config.warmup_steps = 0
  config.grpo_temperature = 1.0
  config.grpo_eval_temperature = 1.0
  # Grouped pass@4 over 64 held-out problems, as MLPerf's GRPO metric.
  config.grpo_eval_prompts = 64
  config.grpo_eval_samples_per_prompt = 4
  config.grpo_eval_target_metric = "pass@4"

  config.eval_interval = 50
  config.checkpoint_period = 50
  config.log_period = 1
  # The MLPerf log is the progression task's demonstration (grpo_tiny.py).
  config.enable_mllog = False
  return config
