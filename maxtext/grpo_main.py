"""GRPO post-training of a pretrained run: the binary.

    tools/bazel run //maxtext:train_main -- --config.run_name=pretrain \\
        --config.steps=40 --config.target_eval_loss=0.0
    tools/bazel run //maxtext:grpo_main -- \\
        --config.load_parameters_path=/tmp/maxtext_runs/pretrain/checkpoints

`train_main` with `maxtext/configs/grpo_tiny.py` as the default config
(`--config=FILE` runs another; a GRPO config sets `workload = "grpo"`): the
one training loop, its flags, messages and exit statuses. A bad field is one
line and exit status 2; a failing reward function is one line naming the
function, the prompt and the error, and exit status 1 after a checkpoint of
the last completed step; SIGTERM or SIGINT stops after the current
rollout's last update with a checkpoint, exit status 1.
"""

import os

from maxtext import train_main

DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "configs", "grpo_tiny.py"
)

if __name__ == "__main__":
  train_main.run_binary("grpo_main", DEFAULT_CONFIG)
