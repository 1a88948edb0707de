"""GRPO on the default config's tiny model: continue progressions exactly.

Start from a pretraining run of `default.py` (its checkpoint directory as
`load_parameters_path`); each step draws 8 prompts of 4 terms from the
progression task, generates 16 completions of 4 terms each at temperature
0.5, rewards exact continuations (and right prefixes, at half weight), and
trains on them at a constant learning rate of 2e-4 for 400 steps. Every 50
steps, the 64 held-out prompts are continued 16 times each at temperature
0.5 and pass@1 and pass@16 are reported.

From a 40-step pretraining run, these settings raised held-out pass@1 (at
temperature 0.5) from 0.241 to 0.613 (+37 points) on average over seeds 0,
1 and 2, in 2.5 to 3.3 minutes per run on 2 shared CPU cores; greedy
pass@1 rose from 0.453 to 0.750. The settings were chosen with seed 100;
docs/grpo.md has the commands, the table and what else was tried.
"""

import ml_collections

from maxtext.configs import default


def get_config() -> ml_collections.ConfigDict:
  """default.py's model, GRPO's step and options."""
  config = default.get_config()
  config.run_name = "grpo_tiny"
  config.workload = "grpo"
  # The pretraining run to start from ("" = random parameters, which the
  # task's rewards never reach).
  config.load_parameters_path = ""

  # 8 prompts x 16 completions per step, in 4 micro-batches of 32 rows:
  # with 16 rather than 8 completions a group more often holds both right
  # and wrong ones, and its mean is a steadier baseline.
  config.global_batch_size = 128
  config.gradient_accumulation_steps = 4
  config.grpo_num_generations = 16
  config.steps = 400

  # A small constant rate: post-training moves a trained policy a little.
  # 1e-4 learns about as steadily but slower; 1e-3 collapses (docs/grpo.md).
  config.lr_schedule = "constant"
  config.learning_rate = 2e-4
  config.warmup_steps = 0

  config.grpo_prompt_length = 4
  config.grpo_max_completion_length = 4
  # At temperature 1 the briefly pretrained model's completions are nearly
  # all wrong and nothing is learnt (docs/grpo.md); 0.5 gives groups with
  # both right and wrong completions.
  config.grpo_temperature = 0.5
  config.grpo_eval_temperature = 0.5
  config.grpo_reward_functions = (
      "maxtext.grpo.tasks.progression_task:exact_match=1.0,"
      "maxtext.grpo.tasks.progression_task:prefix_match=0.5"
  )
  config.grpo_beta = 0.0
  config.grpo_eval_prompts = 64

  config.eval_interval = 50
  config.checkpoint_period = 100
  config.log_period = 1
  # The MLPerf log of benchmark qwen35_397b_grpo (open division, as in
  # default.py), in the run directory: its values are this tiny run's, so
  # the checker fails the ones the rules fix otherwise (docs/mlperf.md).
  config.enable_mllog = True
  config.submission_benchmark = "qwen35_397b_grpo"
  return config
