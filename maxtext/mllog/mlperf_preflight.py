"""The MLPerf pre-flight of a run: `check(mlperf, header)`, before device work.

`maxtext.run.preflight.check` calls it. The submission fields are checked
whether the log is on or off, so that turning it on cannot fail later; with
the log on, the config is held against the benchmark's reference
convergence points (`rules.check_reference_hyperparameters`) and the log's
header goes through the official compliance checker
(`header_proof.check_config`). Closed division: errors; open: warnings.

A GRPO benchmark (`hyperparameters.is_grpo_benchmark`, e.g.
qwen35_397b_grpo) is logged by GRPO runs only, and a GRPO run logs only
such a benchmark: the header of the one kind of run says nothing true of
the other (the workload's `header` says which kind of run is starting: a
GRPO run's states `num_generations_per_prompt`).
"""

from typing import Optional

from maxtext.mllog import eval_set
from maxtext.mllog import header_proof
from maxtext.mllog import hyperparameters
from maxtext.mllog import mlperf_config
from maxtext.mllog import rules
from maxtext.mllog import workload_header


def _check_experts(mlperf: mlperf_config.MlperfConfig) -> None:
  """Refuses a closed run of a dense model whose benchmark's rules require
  moe_aux_loss_coeff: a dense model has no honest value for it."""
  if mlperf.submission_division != "closed" or mlperf.num_experts:
    return
  if hyperparameters.rules_require_key(
      rules.ruleset_dir(mlperf.mllog_ruleset),
      "closed",
      mlperf.submission_benchmark,
      hyperparameters.MOE_AUX_LOSS_COEFF,
  ):
    raise ValueError(
        f"config.num_experts=0: a closed {mlperf.submission_benchmark} run "
        f"needs a model with experts (its rules require moe_aux_loss_coeff)"
    )


def _check_run_kind(
    mlperf: mlperf_config.MlperfConfig, header: workload_header.WorkloadHeader
) -> None:
  """Refuses a log whose benchmark is not of the run's kind: a GRPO
  benchmark's rules require a key (`GRPO_RULE_KEY`) only a GRPO run's
  header states."""
  grpo = hyperparameters.GRPO_RULE_KEY in header.values
  if hyperparameters.is_grpo_benchmark(mlperf) == grpo:
    return
  benchmark = mlperf.submission_benchmark
  if grpo:
    ruleset = mlperf.mllog_ruleset
    fitting = [
        b
        for b in rules.benchmarks(ruleset)
        if hyperparameters.rules_require_key(
            rules.ruleset_dir(ruleset),
            mlperf.submission_division,
            b,
            hyperparameters.GRPO_RULE_KEY,
        )
    ]
    raise ValueError(
        f"config.submission_benchmark={benchmark!r}: a GRPO run's MLPerf log "
        f"is for a GRPO benchmark of ruleset {ruleset} ({fitting})"
    )
  raise ValueError(
      f"config.submission_benchmark={benchmark!r}: a GRPO benchmark; its "
      "MLPerf log comes from a GRPO run (grpo_main), not from pretraining"
  )


def check(
    mlperf: mlperf_config.MlperfConfig,
    header: Optional[workload_header.WorkloadHeader] = None,
) -> None:
  """Checks what the MLPerf rules say about a run's validated settings.

  Args:
    mlperf: the run's MLPerf log settings (`MlperfConfig.from_config` of
      the validated config).
    header: the workload's part of the log (`Workload.mlperf_header`: a
      GRPO run's); None = pretraining's.

  Raises:
    ValueError: a submission field the checker would refuse, a closed
      mixture-of-experts benchmark with a dense model, or (log on, closed
      division) a config off the reference or a header the checker fails,
      or (log on) a benchmark of the other kind of run; the message names
      the field or key and the value.
    TypeError: a submission field of the wrong type.
  """
  rules.validate_submission(mlperf)
  _check_experts(mlperf)
  if not mlperf.enable_mllog:
    return  # A run without a log submits nothing.
  header = workload_header.of_run(mlperf, header)
  _check_run_kind(mlperf, header)
  eval_set.check(mlperf)
  rules.check_reference_hyperparameters(mlperf)
  header_proof.check_config(mlperf, header)
