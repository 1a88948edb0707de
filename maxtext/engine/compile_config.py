"""What compiling a training step ahead of time reads: `CompileConfig`.

The settings class (`maxtext/core/component_config.py`) of
`train_compile_lib`: the engine's settings (the model, the optimizer, the
mesh, the micro-steps K), the data's (the batch shapes), and the workload's
name. A search for a setting that fits (`train_compile_lib.search`) varies
the remat policy, K and the context and tensor parallelism: `with_layout`
and `with_step` make those variants, and `chosen_fields` names them by the
config's fields, for a workload whose step is built from the run's config.
"""

import dataclasses
from typing import Any

from maxtext.core import component_config
from maxtext.data import data_config
from maxtext.engine import engine_config


@dataclasses.dataclass(frozen=True)
class CompileConfig(component_config.ComponentConfig):
  """A training step's settings, as compiled ahead of time.

  Attributes:
    workload: the kind of training (`maxtext/configs/base.py`).
    engine: the engine's settings.
    data: the data's settings (the batches' shapes).
  """

  workload: str = "pretraining"
  engine: engine_config.EngineConfig = dataclasses.field(
      default_factory=engine_config.EngineConfig
  )
  data: data_config.DataConfig = dataclasses.field(
      default_factory=data_config.DataConfig
  )

  def with_layout(self, context: int, tensor: int) -> "CompileConfig":
    """These settings with the mesh's context and tensor parallelism."""
    mesh = dataclasses.replace(
        self.engine.mesh,
        context_parallelism=context,
        tensor_parallelism=tensor,
    )
    return dataclasses.replace(
        self, engine=dataclasses.replace(self.engine, mesh=mesh)
    )

  def with_step(self, remat_policy: str, k: int) -> "CompileConfig":
    """These settings with the model's remat policy and K micro-steps."""
    model = dataclasses.replace(self.engine.model, remat_policy=remat_policy)
    return dataclasses.replace(
        self,
        engine=dataclasses.replace(
            self.engine, model=model, gradient_accumulation_steps=k
        ),
    )

  def chosen_fields(self) -> dict[str, Any]:
    """The config's fields a search varies, by name, as these settings
    hold them (`config_lib.with_values` sets them on the run's config)."""
    engine = self.engine
    return {
        "remat_policy": engine.model.remat_policy,
        "gradient_accumulation_steps": engine.gradient_accumulation_steps,
        "context_parallelism": engine.mesh.context_parallelism,
        "tensor_parallelism": engine.mesh.tensor_parallelism,
    }
