"""The training engine's settings: `EngineConfig`.

The engine package's settings class (`maxtext/core/component_config.py`):
what `model_setup` reads to set a model up and build its engine. The
model's, the optimizer's and the mesh's settings are their packages'
classes, held whole; the remaining fields are the engine's own
(`config_lib.validate` checks them with the rest of the run's config).
"""

import dataclasses

from maxtext.config import optimizer as optimizer_lib
from maxtext.core import component_config
from maxtext.model import model_config
from maxtext.runtime import mesh as mesh_lib


@dataclasses.dataclass(frozen=True)
class EngineConfig(component_config.ComponentConfig):
  """A training engine's settings (`maxtext/configs/base.py` documents
  each field).

  Attributes:
    seed: the parameters' initialisation seed.
    load_parameters_path: a checkpoint the parameters start from ("": the
      seed's).
    gradient_accumulation_steps: micro-batches a step sums, K.
    grad_clip_norm: the global gradient norm the engine clips to.
    donate_state: the step's programs take over the training state's
      buffers.
    compiled_step_file: programs compiled ahead of time to run ("": the
      engine compiles its own).
    model: the model's settings.
    optimizer: the learning-rate schedule's and AdamW's settings.
    mesh: the device mesh's settings (the engine's default mesh).
  """

  seed: int = 0
  load_parameters_path: str = ""
  gradient_accumulation_steps: int = 1
  grad_clip_norm: float = 1.0
  donate_state: bool = True
  compiled_step_file: str = ""
  model: model_config.ModelConfig = dataclasses.field(
      default_factory=model_config.ModelConfig
  )
  optimizer: optimizer_lib.OptimizerConfig = dataclasses.field(
      default_factory=optimizer_lib.OptimizerConfig
  )
  mesh: mesh_lib.MeshConfig = dataclasses.field(
      default_factory=mesh_lib.MeshConfig
  )
