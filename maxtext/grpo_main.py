"""GRPO post-training of a pretrained run: the binary.

    tools/bazel run //maxtext:train_main -- --config.run_name=pretrain \\
        --config.steps=40 --config.target_eval_loss=0.0
    tools/bazel run //maxtext:grpo_main -- \\
        --config.load_parameters_path=/tmp/maxtext_runs/pretrain/checkpoints

With no --config, runs `maxtext/configs/grpo_tiny.py`; `--config=FILE` runs
another config file. A bad field is one line and exit status 2; a failing
reward function is one line naming the function, the prompt and the error,
and exit status 1.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from maxtext import caller_paths
from maxtext.grpo import rewards
from maxtext.grpo import trainer

DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "configs", "grpo_tiny.py"
)
# No default here (as in train_main): the flags parser loads the file named
# on the command line, the default inserted by `_parse_flags`.
_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file (a module with get_config()); default "
    "maxtext/configs/grpo_tiny.py.",
    lock_config=True,
)


def _parse_flags(argv):
  """absl's flag parsing with the --config file made explicit."""
  return app.parse_flags_with_usage(
      caller_paths.resolve_config_args(argv, os.environ, DEFAULT_CONFIG)
  )


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    result = trainer.run(
        _CONFIG.value,
        config_filename=os.path.basename(
            config_flags.get_config_filename(flags.FLAGS["config"])
        ),
    )
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
  app.run(main, flags_parser=_parse_flags)
