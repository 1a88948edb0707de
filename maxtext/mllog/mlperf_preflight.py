"""The MLPerf pre-flight of a config: `check(config)`, before device work.

`maxtext.run.preflight.check` calls it. The submission fields are checked
whether the log is on or off, so that turning it on cannot fail later; with
the log on, the config is held against the benchmark's reference
convergence points (`rules.check_reference_hyperparameters`) and the log's
header goes through the official compliance checker
(`header_proof.check_config`). Closed division: errors; open: warnings.

A GRPO benchmark (`hyperparameters.is_grpo_benchmark`, e.g.
qwen35_397b_grpo) is logged by GRPO runs only, and a GRPO run logs only
such a benchmark: the header of the one kind of run says nothing true of
the other (`grpo=` says which kind of run is starting).
"""

from typing import Any

from maxtext.mllog import eval_set
from maxtext.mllog import header_proof
from maxtext.mllog import hyperparameters
from maxtext.mllog import rules


def _check_experts(config: Any) -> None:
  """Refuses a closed run of a dense model whose benchmark's rules require
  moe_aux_loss_coeff: a dense model has no honest value for it."""
  if config.submission_division != "closed" or config.num_experts:
    return
  if hyperparameters.rules_require_key(
      rules.ruleset_dir(config.mllog_ruleset),
      "closed",
      config.submission_benchmark,
      hyperparameters.MOE_AUX_LOSS_COEFF,
  ):
    raise ValueError(
        f"config.num_experts=0: a closed {config.submission_benchmark} run "
        f"needs a model with experts (its rules require moe_aux_loss_coeff)"
    )


def _check_run_kind(config: Any, grpo: bool) -> None:
  """Refuses a log whose benchmark is not of the run's kind (GRPO or not)."""
  if hyperparameters.is_grpo_benchmark(config) == grpo:
    return
  benchmark = config.submission_benchmark
  if grpo:
    ruleset = config.mllog_ruleset
    fitting = [
        b
        for b in rules.benchmarks(ruleset)
        if hyperparameters.rules_require_key(
            rules.ruleset_dir(ruleset),
            config.submission_division,
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


def check(config: Any, *, grpo: bool = False) -> None:
  """Checks what the MLPerf rules say about a validated config.

  Args:
    config: the run's validated config.
    grpo: the run is a GRPO run (`maxtext.grpo.grpo_workload`), not pretraining.

  Raises:
    ValueError: a submission field the checker would refuse, a closed
      mixture-of-experts benchmark with a dense model, or (log on, closed
      division) a config off the reference or a header the checker fails,
      or (log on) a benchmark of the other kind of run; the message names
      the field or key and the value.
    TypeError: a submission field of the wrong type.
  """
  rules.validate_submission(config)
  _check_experts(config)
  if not config.enable_mllog:
    return  # A run without a log submits nothing.
  _check_run_kind(config, grpo)
  eval_set.check(config)
  rules.check_reference_hyperparameters(config)
  header_proof.check_config(config)
