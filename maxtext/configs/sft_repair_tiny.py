"""SFT of grpo_repair_tiny.py's model on the repair task's demonstrations.

The tool-use trajectories that view the buggy file, fix it, run the tests
and submit (docs/grpo.md):

  tools/bazel run //tools:write_demonstrations -- \\
    --task=maxtext.env.repair_task:make_task --output_dir=/tmp/demos/repair \\
    --num_eval=8
  tools/bazel run //maxtext:train_main -- \\
    --config=maxtext/configs/sft_repair_tiny.py
  tools/bazel run //maxtext:train_main -- \\
    --config=maxtext/configs/grpo_repair_tiny.py \\
    --config.load_parameters_path=/tmp/maxtext_runs/sft_repair_tiny/checkpoints
"""

import os
import tempfile

import ml_collections

from maxtext.configs import grpo_repair_tiny

# Where tools/write_demonstrations writes by the command above.
DEMOS = os.path.join(tempfile.gettempdir(), "demos", "repair")


def get_config() -> ml_collections.ConfigDict:
  """grpo_repair_tiny.py's model; the chat data set of the demonstrations."""
  config = grpo_repair_tiny.get_config()
  config.workload = "sft"
  config.run_name = "sft_repair_tiny"
  config.dataset_type = "chat"
  config.train_data_path = os.path.join(DEMOS, "train.jsonl")
  config.eval_data_path = os.path.join(DEMOS, "eval.jsonl")
  config.tokenizer_path = DEMOS
  # Trajectories of 1,100 to 1,342 tokens (the tools' schemas in the system
  # turn, the tools' real output): 8 per step, one row each. Rows of 1,408
  # tokens hold the longest (a longer one would be refused, not cut) and
  # cost half of GRPO's 2,048 in attention, which dominates here.
  config.max_sequence_length = 1408
  config.global_batch_size = 8
  config.gradient_accumulation_steps = 1
  config.eval_batch_size = 8
  config.eval_steps = 1
  # 700 steps, 2.7 passes over the 2,048 demonstrations: after 400 the
  # model solved none of 16 held-out tasks, after 700 it solves 30-56% of
  # their episodes (three seeds, docs/grpo.md).
  config.steps = 700
  config.learning_rate = 2e-3
  config.lr_schedule = "cosine"
  config.weight_decay = 0.0
  config.warmup_steps = 40
  config.target_eval_loss = 0.0
  config.eval_interval = 200
  config.checkpoint_period = 200
  config.log_period = 20
  return config
