"""Evaluates a finished deferred_eval run, closes its MLPerf log. Runbook:

  # 1. Train with deferred evaluation: weights-only checkpoints at every
  #    eval point instead of evaluations; the log is left open.
  tools/bazel run //maxtext:grpo_main -- \\
      --config=maxtext/configs/grpo_tiny.py --config.deferred_eval=True \\
      --config.run_name=deferred \\
      --config.load_parameters_path=/tmp/maxtext_runs/pretrain/checkpoints
  # 2. The same command line with this binary: evaluates the checkpoints in
  #    step order, stops at the first that reaches the target, appends the
  #    evaluations to the log and closes it with run_stop.
  tools/bazel run //tools/mlperf:deferred_eval -- \\
      --config=maxtext/configs/grpo_tiny.py \\
      --config.deferred_eval=True --config.run_name=deferred \\
      --config.load_parameters_path=/tmp/maxtext_runs/pretrain/checkpoints

It prints one line per checkpoint evaluated, then

  deferred_eval: <success|aborted> ...; log <path>

`success`: the first checkpoint that reached the target closes the log,
its run_stop dated at that step's update time (the time the training log
recorded for it); `aborted`: none did, and run_stop is dated at the
training's end. Exit status 0 either way; 2 with one line
`deferred_eval: error: ...` when the run is refused (no such run, a config
that differs from the run's record, a log already closed or whose training
did not finish, a weights-only checkpoint missing or damaged), in which
case nothing is appended. Relative paths resolve against the directory the
command was run from. maxtext/run/deferred_eval.py does the work.
"""

import os

from absl import app
from ml_collections import config_flags

from maxtext import workloads
from maxtext.core import caller_paths
from maxtext.run import deferred_eval
from tools import command_line

_PROGRAM = "deferred_eval"
_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "The run's training config file (with the same --config.<field>"
    " overrides as its training command).",
    lock_config=True,
)


def _parse_flags(argv):
  return app.parse_flags_with_usage(
      caller_paths.resolve_config_args(argv, os.environ)
  )


def main(argv):
  command_line.check(argv, _CONFIG)
  config = _CONFIG.value
  with command_line.user_errors(_PROGRAM):
    settings, workload = workloads.check(config)
    result = deferred_eval.evaluate_run(settings, workload)
  target = result.target
  for evaluation in result.evaluations:
    print(
        f"{_PROGRAM}: checkpoint step {evaluation.point.checkpoint_step}"
        f" (samples {evaluation.point.samples}): {target.metric}"
        f" {evaluation.value:.6g}"
        + (" reaches the target" if evaluation.reached else "")
    )
  last = result.evaluations[-1]
  if result.status == "success":
    outcome = (
        f"success at checkpoint step {last.point.checkpoint_step} (samples"
        f" {last.point.samples}), run_stop dated at its update time"
        f" {last.point.update_time_ms} ms"
    )
  else:
    outcome = (
        f"aborted: none of {len(result.evaluations)} checkpoint(s) reached"
        f" the target ({target.metric} {target.threshold})"
    )
  print(f"{_PROGRAM}: {outcome}; log {result.log_path}")
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
