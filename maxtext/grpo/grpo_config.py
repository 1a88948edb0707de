"""GRPO's own settings: `GrpoConfig`, everything its workload reads.

A GRPO run's config is the run's flat config (`maxtext/configs/base.py`
documents each field); the caller that holds it (`maxtext/workloads.py`)
builds these settings once and gives them to the run's `GrpoWorkload`, which
reads its algorithm, rollout, evaluation and reward fields here, and never
the config. The fields' checks, across them and against the model and the
batch, are `config_lib.validate_grpo`'s (`workloads.check` runs it), so this
class adds none.

The settings of the components the workload builds are their packages'
classes of the same config, held whole: the policy loss's (`loss`), what the
run's MLPerf log states of GRPO (`mlperf`), the engine's set-up (`engine`,
whose `model` is the model's config the loss and the decoders take), the
generation's (`rollout`) and the prompts' and episodes' (`task`). The
sampling's stop ids are the config's as `config_lib.stop_ids` states them
(`stop_ids`). A run's seed may be drawn at its first attempt (`seed` -1):
`with_seed` gives the attempt's settings.
"""

import dataclasses

from maxtext.config import config_lib
from maxtext.core import checks
from maxtext.core import component_config
from maxtext.engine import engine_config
from maxtext.grpo import mlperf_header
from maxtext.grpo.loss import loss_config
from maxtext.grpo.rollout import rollout_config
from maxtext.grpo.tasks import task_config


@dataclasses.dataclass(frozen=True)
class GrpoConfig(component_config.ComponentConfig):
  """What the GRPO workload reads (module docstring)."""

  # The rollouts' and the eval's sampling seed (the attempt's: `with_seed`).
  seed: int = 0
  # The data's field, declared here again: a step's micro-batches pack
  # their rows (`packed_batches`).
  packing: bool = False
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
  # Ids that end a completion, comma-separated (`stop_ids`).
  grpo_stop_ids: str = ""
  # The policy loss's settings (`LossConfig.options`).
  loss: loss_config.LossConfig = dataclasses.field(
      default_factory=loss_config.LossConfig
  )
  # What the run's MLPerf log states of GRPO.
  mlperf: mlperf_header.GrpoMlperfConfig = dataclasses.field(
      default_factory=mlperf_header.GrpoMlperfConfig
  )
  # The engine's set-up: the model, the optimizer, K, the starting
  # parameters.
  engine: engine_config.EngineConfig = dataclasses.field(
      default_factory=engine_config.EngineConfig
  )
  # The generation's: the decoder's footprint, the generation mesh.
  rollout: rollout_config.RolloutConfig = dataclasses.field(
      default_factory=rollout_config.RolloutConfig
  )
  # The prompts' and a text task's episodes'.
  task: task_config.TaskConfig = dataclasses.field(
      default_factory=task_config.TaskConfig
  )

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """grpo_stop_ids as ids of the model's vocabulary
    (`config_lib.stop_ids`; ValueError naming the field on a bad one)."""
    return config_lib.stop_ids(
        {
            "grpo_stop_ids": self.grpo_stop_ids,
            "vocab_size": self.engine.model.vocab_size,
        }
    )

  def with_seed(self, seed: int) -> "GrpoConfig":
    """The attempt's settings: `seed` (the resolved one,
    `run_record.resolve_seed`) in these and in each component that holds a
    seed (the engine's, the task's; `grpo_config_test` checks there is no
    other).

    Raises:
      ValueError: `seed` is not an int >= 0.
    """
    seed = checks.check_int("seed", seed, 0)
    return dataclasses.replace(
        self,
        seed=seed,
        engine=dataclasses.replace(self.engine, seed=seed),
        task=dataclasses.replace(self.task, seed=seed),
    )

  @property
  def row_length(self) -> int:
    """Tokens of a trained row: a prompt and its completion."""
    return self.grpo_prompt_length + self.grpo_max_completion_length
