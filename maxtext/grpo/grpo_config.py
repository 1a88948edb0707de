"""GRPO's own settings: `GrpoConfig`, the grpo_* fields its workload reads.

A GRPO run's config is the run's flat config (`maxtext/configs/base.py`
documents each field); the caller that holds it (`maxtext/workloads.py`)
builds these settings once and gives them to the run's `GrpoWorkload`, which
reads its algorithm, rollout, evaluation and reward fields here. The fields'
checks, across them and against the model and the batch, are
`config_lib.validate_grpo`'s (run by the workload's `check`), so this class
adds none. The policy loss's settings are `loss`, the
`loss/loss_config.LossConfig` of the same config, and what the run's MLPerf
log states of GRPO is `mlperf`, the `mlperf_header.GrpoMlperfConfig`.
"""

import dataclasses

from maxtext.core import component_config
from maxtext.grpo import mlperf_header
from maxtext.grpo.loss import loss_config


@dataclasses.dataclass(frozen=True)
class GrpoConfig(component_config.ComponentConfig):
  """The GRPO fields the GRPO workload reads (module docstring)."""

  # The algorithm: groups, passes over a rollout, rollouts drawn ahead.
  grpo_num_generations: int = 4
  grpo_num_iterations: int = 1
  grpo_max_age: int = 0
  grpo_advantage_estimator: str = "grpo"
  grpo_advantage_eps: float = 1e-4
  grpo_overlong_filtering: bool = False
  grpo_allow_reference_change: bool = False
  # The rollout: lengths, sampling, decoder, devices.
  grpo_prompt_length: int = 4
  grpo_max_completion_length: int = 8
  grpo_temperature: float = 1.0
  grpo_top_p: float = 1.0
  grpo_top_k: int = 0
  grpo_decoder: str = "paged"
  grpo_decode_slots: int = 0
  grpo_decode_page_size: int = 16
  grpo_generation_devices: int = 0
  # The held-out evaluation and the run's target.
  grpo_eval_temperature: float = 0.0
  grpo_eval_top_p: float = 1.0
  grpo_eval_target_metric: str = "pass@1"
  grpo_target_pass_rate: float = 0.0
  # What is rewarded: the reward functions, or a text task's episodes.
  grpo_reward_functions: str = "maxtext.grpo.tasks.progression_task:exact_match"
  grpo_reward_timeout_seconds: float = 60.0
  grpo_task: str = ""
  # The policy loss's settings (`LossConfig.options`).
  loss: loss_config.LossConfig = dataclasses.field(
      default_factory=loss_config.LossConfig
  )
  # What the run's MLPerf log states of GRPO.
  mlperf: mlperf_header.GrpoMlperfConfig = dataclasses.field(
      default_factory=mlperf_header.GrpoMlperfConfig
  )

  @property
  def row_length(self) -> int:
    """Tokens of a trained row: a prompt and its completion."""
    return self.grpo_prompt_length + self.grpo_max_completion_length
