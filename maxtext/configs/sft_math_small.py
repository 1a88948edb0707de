"""SFT of grpo_math_small.py's model on the math task's demonstrations.

The first half of SFT -> GRPO on the built-in math task with the 16M model
(docs/grpo.md); `tools/math_heldout.py` writes the demonstrations, runs this
config (from the seed) and grpo_math_small.py (from its checkpoint). By
hand:

  tools/bazel run //tools:write_demonstrations -- \\
      --task=maxtext.env.math_task:make_task \\
      --output_dir=/tmp/demos/math_small --num_train=12800 --num_eval=256
  tools/bazel run //maxtext:train_main -- \\
      --config=maxtext/configs/sft_math_small.py
"""

import os
import tempfile

import ml_collections

from maxtext.configs import grpo_math_small

# Where tools/write_demonstrations writes by the command above.
DEMOS = os.path.join(tempfile.gettempdir(), "demos", "math_small")


def get_config() -> ml_collections.ConfigDict:
  """grpo_math_small.py's model; the chat data set of the demonstrations."""
  config = grpo_math_small.get_config()
  config.workload = "sft"
  config.run_name = "sft_math_small"
  config.dataset_type = "chat"
  config.train_data_path = os.path.join(DEMOS, "train.jsonl")
  config.eval_data_path = os.path.join(DEMOS, "eval.jsonl")
  config.tokenizer_path = DEMOS
  # As many sequences a step as a GRPO step of grpo_math_small.py trains.
  config.global_batch_size = 64
  config.gradient_accumulation_steps = 1
  # tools/math_heldout.py picks the first checkpoint whose held-out pass@1
  # reaches its target: every 50 steps, up to 38,400 samples (the tiny model
  # reached pass@1 0.70 after 16,000).
  config.steps = 600
  # Every step runs (default.py's target would stop at the first eval).
  config.target_eval_loss = 0.0
  # Constant after the warm-up: a checkpoint part-way through is as
  # trained as the run's end, not one of a decay cut short.
  config.lr_schedule = "constant"
  config.learning_rate = 1e-3
  config.warmup_steps = 20
  config.weight_decay = 0.0
  config.eval_interval = 600
  config.eval_steps = 4
  config.eval_batch_size = 64
  config.checkpoint_period = 50
  # Every checkpoint stays: a later run may start from any of them.
  config.max_checkpoints_to_keep = 0
  config.log_period = 100
  return config
