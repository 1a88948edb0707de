"""GRPO on the default config's tiny model: continue progressions exactly.

Start from a pretraining run of `default.py` (its checkpoint directory as
`load_parameters_path`); each step draws 4 prompts of 4 terms from the
progression task, generates 4 completions of 8 terms each at temperature 1,
rewards exact continuations, and trains on them. Every 5 steps, the 64
held-out prompts are continued greedily and pass@1 is reported. See
docs/grpo.md for the two commands.
"""

import ml_collections

from maxtext.configs import default


def get_config() -> ml_collections.ConfigDict:
  """default.py's model, GRPO's step and options."""
  config = default.get_config()
  config.run_name = "grpo_tiny"
  # The pretraining run to start from ("" = random parameters, which the
  # task's rewards never reach).
  config.load_parameters_path = ""

  # 4 prompts x 4 completions per step, in 2 micro-batches of 8 rows.
  config.global_batch_size = 16
  config.gradient_accumulation_steps = 2
  config.grpo_num_generations = 4
  config.steps = 40

  # A small constant rate: post-training moves a trained policy a little.
  config.lr_schedule = "constant"
  config.learning_rate = 1e-4
  config.warmup_steps = 0

  config.grpo_prompt_length = 4
  config.grpo_max_completion_length = 8
  config.grpo_reward_functions = (
      "maxtext.grpo.progression_task:exact_match=1.0,"
      "maxtext.grpo.progression_task:prefix_match=0.5"
  )
  config.grpo_beta = 0.0
  config.grpo_eval_prompts = 64

  config.eval_interval = 5
  config.checkpoint_period = 10
  config.log_period = 1
  # No MLPerf GRPO log yet (docs/grpo.md).
  config.enable_mllog = False
  return config
