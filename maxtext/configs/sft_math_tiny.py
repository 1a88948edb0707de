"""SFT of grpo_math_tiny.py's model on the math task's demonstrations.

The first half of the pipeline SFT -> GRPO on the built-in math task
(docs/grpo.md): write the demonstrations, fine-tune on them, then run GRPO
from this run's checkpoints:

  tools/bazel run //tools:write_demonstrations -- \\
      --task=maxtext.env.math_task:make_task --output_dir=/tmp/demos/math
  tools/bazel run //maxtext:train_main -- \\
      --config=maxtext/configs/sft_math_tiny.py
  tools/bazel run //maxtext:train_main -- \\
      --config=maxtext/configs/grpo_math_tiny.py \\
      --config.load_parameters_path=/tmp/maxtext_runs/sft_math_tiny/checkpoints
"""

import os
import tempfile

import ml_collections

from maxtext.configs import grpo_math_tiny

# Where tools/write_demonstrations writes by the command above.
DEMOS = os.path.join(tempfile.gettempdir(), "demos", "math")


def get_config() -> ml_collections.ConfigDict:
  """grpo_math_tiny.py's model; the chat data set of the demonstrations."""
  config = grpo_math_tiny.get_config()
  config.workload = "sft"
  config.run_name = "sft_math_tiny"
  config.dataset_type = "chat"
  config.train_data_path = os.path.join(DEMOS, "train.jsonl")
  config.eval_data_path = os.path.join(DEMOS, "eval.jsonl")
  config.tokenizer_path = DEMOS
  config.global_batch_size = 16
  config.gradient_accumulation_steps = 1
  config.steps = 200
  # Every step runs (default.py's target would stop at the first eval).
  config.target_eval_loss = 0.0
  config.lr_schedule = "cosine"
  config.learning_rate = 3e-3
  config.warmup_steps = 20
  config.weight_decay = 0.0
  config.eval_interval = 100
  config.grpo_eval_prompts = 64
  config.eval_steps = 2
  config.eval_batch_size = 16
  config.checkpoint_period = 100
  config.log_period = 20
  return config
