"""A GRPO run's own part of its MLPerf log: `header(GrpoMlperfConfig)`.

The MLPerf log (`maxtext/mllog/`) writes the header of a run from its own
settings and knows no GRPO field: this module states what a GRPO run's log
says differently, keyed by the log's keys (`mllog.workload_header`). The
values are the ones the run uses (`grpo_workload`): its sequences are a
prompt and a completion (`grpo_prompt_length` + `grpo_max_completion_length`
tokens), an evaluation continues `grpo_eval_prompts` held-out prompts, a
step's batch is `global_batch_size / grpo_num_generations` prompts of
`grpo_num_generations` completions (the samples a rollout adds), drawn with
the rollout's and the evaluation's temperature and top-p; a rollout feeds
`grpo_num_iterations` updates, and the run's target is a pass rate
(`grpo_target_pass_rate`, higher is better).

It lives with GRPO so that GRPO's field names stay in this package: the
MLPerf log takes a mapping of its own keys, the one thing both sides know.
"""

import dataclasses
import types

from maxtext.core import component_config
from maxtext.mllog import workload_header

# What sets each key a GRPO run's header states, for the pre-flight's
# messages.
SOURCES = types.MappingProxyType(
    {
        "max_sequence_length": (
            "config.grpo_prompt_length + grpo_max_completion_length"
        ),
        "eval_samples": "config.grpo_eval_prompts",
        "train_samples": (
            "config.mllog_train_samples (0 = steps / grpo_num_iterations * "
            "global_batch_size)"
        ),
        "num_prompts_per_step": (
            "config.global_batch_size / grpo_num_generations"
        ),
        "num_generations_per_prompt": "config.grpo_num_generations",
        "generation_training_rollout_temperature": "config.grpo_temperature",
        "generation_training_rollout_top_p": "config.grpo_top_p",
        "generation_validation_rollout_temperature": (
            "config.grpo_eval_temperature"
        ),
        "generation_validation_rollout_top_p": "config.grpo_eval_top_p",
    }
)


@dataclasses.dataclass(frozen=True)
class GrpoMlperfConfig(component_config.ComponentConfig):
  """The GRPO fields a GRPO run's MLPerf log states (`maxtext/configs/base.py`
  documents each; `config_lib.validate_grpo` checks them)."""

  steps: int = 1000
  global_batch_size: int = 16
  grpo_num_generations: int = 4
  grpo_num_iterations: int = 1
  grpo_prompt_length: int = 4
  grpo_max_completion_length: int = 8
  grpo_eval_prompts: int = 64
  grpo_temperature: float = 1.0
  grpo_top_p: float = 1.0
  grpo_eval_temperature: float = 0.0
  grpo_eval_top_p: float = 1.0
  grpo_target_pass_rate: float = 0.0


def header(settings: GrpoMlperfConfig) -> workload_header.WorkloadHeader:
  """A GRPO run's part of its MLPerf log (module docstring).

  The values: `max_sequence_length`, `eval_samples`, `train_samples` (the
  rollouts' samples; the log's `mllog_train_samples` replaces it when set),
  then the GRPO benchmark's keys in the order its log holds them.
  """
  generations = settings.grpo_num_generations
  rollouts = settings.steps // settings.grpo_num_iterations
  values = {
      "max_sequence_length": (
          settings.grpo_prompt_length + settings.grpo_max_completion_length
      ),
      "eval_samples": settings.grpo_eval_prompts,
      "train_samples": rollouts * settings.global_batch_size,
      "num_prompts_per_step": settings.global_batch_size // generations,
      "num_generations_per_prompt": generations,
      "generation_training_rollout_temperature": settings.grpo_temperature,
      "generation_training_rollout_top_p": settings.grpo_top_p,
      "generation_validation_rollout_temperature": (
          settings.grpo_eval_temperature
      ),
      "generation_validation_rollout_top_p": settings.grpo_eval_top_p,
  }
  return workload_header.WorkloadHeader(
      values=types.MappingProxyType(values),
      sources=SOURCES,
      updates_per_batch=settings.grpo_num_iterations,
      target=float(settings.grpo_target_pass_rate),
      target_field="grpo_target_pass_rate",
      higher_is_better=True,
  )
