"""Where a GRPO test run starts: a brief pretraining run of the tiny config.

GRPO post-trains a pretrained policy; from random parameters the built-in
task's rewards are never reached, so the tests start from 20 steps of
`tiny_configs.tiny_config`, which continue some progressions right.
`RUN_FIELDS` make such a run small; `MLPERF_FIELDS` give it the
qwen35_397b_grpo log, of which the official checker fails exactly
`TINY_LOG_FAILURES` (`tiny_log_problems` says how a verdict differs).
"""

import os
from typing import Optional

from maxtext import workloads
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


# On top of RUN_FIELDS, a run whose MLPerf log is qwen35_397b_grpo's (open
# division) and which makes the reference's choices (qwen35_397b_grpo.py's):
# the leave-one-out normalised advantage, the forced on-policy ratio with
# sequence-mask truncated importance sampling and log-prob-error masking,
# and an eval of 4 samples per held-out prompt whose grouped pass@4 is
# `eval_accuracy` (not overlong filtering: the progression task has no stop
# id). The rules' schedule scaled down: the first eval after 2 rollouts of
# RUN_FIELDS' batch, then one after every rollout.
MLPERF_FIELDS = dict(
    enable_mllog=True,
    submission_benchmark="qwen35_397b_grpo",
    lr_schedule_steps=0,
    grpo_temperature=0.9,
    grpo_top_p=0.95,
    grpo_eval_temperature=0.5,
    grpo_eval_top_p=0.9,
    grpo_eval_samples_per_prompt=4,
    grpo_eval_target_metric="pass@4",
    grpo_advantage_estimator="rloo_normalized",
    grpo_force_on_policy_ratio=True,
    grpo_tis_ratio_min=0.999,
    grpo_tis_ratio_max=1.002,
    grpo_logprob_error_threshold=2.0,
    grpo_beta=0.0,
    first_eval_samples=2 * RUN_FIELDS["global_batch_size"],
    eval_interval=1,
    checkpoint_period=0,
)

# The checks such a tiny run's log fails, by key: the rule's failed test.
# The rules fix values a tiny run does not use: `max_sequence_length`
# (65536), `eval_samples` (251 held-out prompts) and `eval_accuracy` (a
# value above 0.69).
TINY_LOG_FAILURES = {
    "max_sequence_length": "v['value'] == 65536",
    "eval_samples": "v['value'] == 251",
    "eval_accuracy": "v['value'] > 0.69",
}


def tiny_log_problems(checked) -> Optional[str]:
  """How the checker's verdict on such a tiny run's log differs from failing
  exactly TINY_LOG_FAILURES, or None where it does not.

  Args:
    checked: `testing.compliance_checker.run_checker`'s result.
  """
  if checked.passed:
    return "the checker passed the log"
  failures = {}
  for message in checked.messages:
    first = message.splitlines()[0]
    keys = [k for k in TINY_LOG_FAILURES if k in first] or [first]
    failures[keys[0]] = message
  if set(failures) != set(TINY_LOG_FAILURES) or len(checked.messages) != len(
      TINY_LOG_FAILURES
  ):
    return (
        f"failed {sorted(failures)}, not exactly {sorted(TINY_LOG_FAILURES)}:"
        f" {list(checked.messages)}"
    )
  for key, test in TINY_LOG_FAILURES.items():
    if test not in failures[key]:
      return f"{key} failed, but not on {test}: {failures[key]}"
  return None


def pretrained_checkpoints(root: str) -> str:
  """Pretrains the tiny config under `root`/pretrain; its checkpoint
  directory (a GRPO run's `load_parameters_path`)."""
  workloads.run(
      tiny_configs.tiny_config(root, run_name="pretrain", steps=PRETRAIN_STEPS)
  )
  return os.path.join(root, "pretrain", "checkpoints")
