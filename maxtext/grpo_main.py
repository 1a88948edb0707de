"""GRPO post-training of a pretrained run: the binary.

    tools/bazel run //maxtext:train_main -- --config.steps=60 \\
        --config.run_name=pretrain
    tools/bazel run //maxtext:grpo_main -- \\
        --config.load_parameters_path=/tmp/maxtext_runs/pretrain/checkpoints

With no --config, runs `maxtext/configs/grpo_tiny.py`. A bad field is one
line and exit status 2; a failing reward function is one line naming the
function, the prompt and the error, and exit status 1.
"""

import sys

from absl import app
from absl import logging
from ml_collections import config_flags

from maxtext.configs import grpo_tiny
from maxtext.grpo import rewards
from maxtext.grpo import trainer

_CONFIG = config_flags.DEFINE_config_dict(
    "config", grpo_tiny.get_config(), "The GRPO run's config.", lock_config=True
)


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    result = trainer.run(_CONFIG.value, config_filename="grpo_tiny.py")
  except trainer.ConfigError as e:
    print(f"grpo_main: {e}", file=sys.stderr)
    sys.exit(2)
  except rewards.RewardError as e:
    print(f"grpo_main: {e}", file=sys.stderr)
    sys.exit(1)
  logging.info(
      "GRPO run %s: %s after step %d",
      result.run_dir,
      result.status.name,
      result.final_step,
  )
  print(
      f"grpo_main: {result.status.name.lower()} after step "
      f"{result.final_step}; held-out eval at the start {result.start_eval}, "
      f"at the end {result.last_eval}"
  )


if __name__ == "__main__":
  app.run(main)
