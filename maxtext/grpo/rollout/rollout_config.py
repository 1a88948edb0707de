"""A GRPO run's generation settings: `RolloutConfig`.

The rollout package's settings class (`maxtext/core/component_config.py`):
what the paged decoder's footprint check (`decode_footprint`), the
generation devices' mesh (`generation_mesh`) and the eval's sampling
(`grpo_workload.eval_options`) read. The decodes' sizes and the eval's
samples of each prompt are the config's facts as `config_lib` states them
(`decoded_rows`, `largest_decode_page`, `eval_samples_per_prompt`), asked of
these fields; their checks are `config_lib.validate_grpo`'s, which runs
before any of them is built.
`tensor_parallelism` is the training mesh's, declared here again: the
generation mesh keeps it where it divides a replica's devices.
"""

import dataclasses

from maxtext.config import config_lib
from maxtext.core import component_config
from maxtext.model import model_config


@dataclasses.dataclass(frozen=True)
class RolloutConfig(component_config.ComponentConfig):
  """The rollouts' and evaluations' generation settings
  (`maxtext/configs/base.py` documents each).

  Attributes:
    global_batch_size: the sequences one rollout decodes.
    grpo_num_generations: completions per prompt.
    grpo_max_completion_length: new tokens a completion may have.
    grpo_max_turn_tokens: new tokens a text task's turn may have (0: all
      of the completion).
    grpo_eval_prompts: held-out prompts an evaluation decodes.
    grpo_eval_samples_per_prompt: samples of each (0: `config_lib`'s
      default).
    grpo_eval_temperature: the evaluation's temperature.
    grpo_decoder: "paged" or "static".
    grpo_decode_slots: the paged decoder's slots (0: one per row).
    grpo_decode_page_size: positions per page.
    grpo_generation_replicas: replicas of the parameters on the generation
      mesh's data axis.
    tensor_parallelism: the training mesh's tensor axis.
    model: the model's settings, whole.
  """

  global_batch_size: int = 16
  grpo_num_generations: int = 4
  grpo_max_completion_length: int = 8
  grpo_max_turn_tokens: int = 0
  grpo_eval_prompts: int = 64
  grpo_eval_samples_per_prompt: int = 0
  grpo_eval_temperature: float = 0.0
  grpo_decoder: str = "paged"
  grpo_decode_slots: int = 0
  grpo_decode_page_size: int = 16
  grpo_generation_replicas: int = 1
  tensor_parallelism: int = 1
  model: model_config.ModelConfig = dataclasses.field(
      default_factory=model_config.ModelConfig
  )

  def eval_samples_per_prompt(self) -> int:
    """The eval's samples of each held-out prompt
    (`config_lib.eval_samples_per_prompt`)."""
    return config_lib.eval_samples_per_prompt(
        {
            "grpo_eval_samples_per_prompt": self.grpo_eval_samples_per_prompt,
            "grpo_eval_temperature": self.grpo_eval_temperature,
            "grpo_num_generations": self.grpo_num_generations,
        }
    )

  def decoded_rows(self) -> int:
    """The most sequences one decode holds (`config_lib.decoded_rows`)."""
    return config_lib.decoded_rows(dataclasses.asdict(self))

  def largest_decode_page(self) -> int:
    """The largest page the paged decoder may have
    (`config_lib.largest_decode_page` of the model's length)."""
    return config_lib.largest_decode_page(
        {"max_sequence_length": self.model.max_sequence_length}
    )
