"""Where a GRPO test run starts: a brief pretraining run of the tiny config.

GRPO post-trains a pretrained policy; from random parameters the built-in
task's rewards are never reached, so the tests start from 20 steps of
`tiny_configs.tiny_config`, which continue some progressions right.
"""

import os

from maxtext.run import trainer
from testing import tiny_configs

PRETRAIN_STEPS = 20

# A train record's metrics on which two runs of the same GRPO steps (resumed
# or not, one process or several) must agree.
COMPARED_METRICS = (
    "loss",
    "pg_loss",
    "kl",
    "rewards/mean",
    "completions/mean_length",
    "advantage/abs_mean",
    "grad_norm",
)

# A GRPO run's fields on top of `tiny_configs.tiny_config`: 2 prompts x 4
# completions per step in 2 micro-batches, a constant rate, no MLPerf log.
RUN_FIELDS = dict(
    tiny_configs.TINY_GRPO,
    enable_mllog=False,
    lr_schedule="constant",
    learning_rate=1e-3,
    warmup_steps=0,
    # A schedule length of its own, so a resume may add steps.
    lr_schedule_steps=10,
    global_batch_size=8,
    gradient_accumulation_steps=2,
)


def pretrained_checkpoints(root: str) -> str:
  """Pretrains the tiny config under `root`/pretrain; its checkpoint
  directory (a GRPO run's `load_parameters_path`)."""
  trainer.run(
      tiny_configs.tiny_config(root, run_name="pretrain", steps=PRETRAIN_STEPS)
  )
  return os.path.join(root, "pretrain", "checkpoints")
