"""Builds a model's training state from its settings, for every caller.

The trainer, the benchmarks and the multi-device tests all set a model up the
same way: the mesh's parameter and batch shardings (from the model's
settings alone), parameters initialised from the engine settings' `seed`
directly into their shardings (or loaded from `load_parameters_path`), and
an `Engine` with the configured optimizer. The engine's settings are
`engine_config.EngineConfig`, which the caller builds from the run's config.
"""

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional

from absl import logging
import jax

from maxtext.engine import engine as engine_lib
from maxtext.engine import engine_config
from maxtext.runtime import mesh as mesh_lib
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.config import optimizer as optimizer_lib
from maxtext.engine import saved_step
from maxtext.metrics import recorder as metrics_recorder
from maxtext.storage import checkpointing


@dataclasses.dataclass(frozen=True)
class ModelSetup:
  """Where a model's arrays live.

  Attributes:
    mesh: the device mesh.
    abstract_params: the parameters' shapes and dtypes (ShapeDtypeStructs).
    param_shardings: the parameters' shardings (FSDP over the mesh).
    batch_sharding: the sharding of a global batch's arrays.
  """

  mesh: jax.sharding.Mesh
  abstract_params: Any
  param_shardings: Any
  batch_sharding: jax.sharding.NamedSharding


def setup_model(
    model: model_config.ModelConfig, mesh: jax.sharding.Mesh
) -> ModelSetup:
  """Shapes and shardings of the model on `mesh`; allocates nothing (the
  shapes are the same for every seed)."""
  abstract = jax.eval_shape(
      functools.partial(transformer.init_params, model),
      jax.random.PRNGKey(0),
  )
  fsdp = mesh.shape[mesh_lib.FSDP_AXIS]
  return ModelSetup(
      mesh=mesh,
      abstract_params=abstract,
      param_shardings=mesh_lib.param_shardings(
          transformer.param_partition_specs(
              abstract,
              fsdp,
              expert_size=mesh_lib.expert_size(mesh),
              tensor_size=mesh_lib.tensor_size(mesh),
              context_size=mesh_lib.context_size(mesh),
          ),
          mesh,
      ),
      batch_sharding=mesh_lib.batch_sharding(mesh),
  )


def init_params(settings: engine_config.EngineConfig, setup: ModelSetup) -> Any:
  """The initial parameters, placed on their shardings.

  From `load_parameters_path` (another run's newest checkpoint, or one step
  directory) when set, else initialised from `seed`.
  """
  if settings.load_parameters_path:
    return checkpointing.restore_params_only(
        settings.load_parameters_path,
        jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            setup.abstract_params,
            setup.param_shardings,
        ),
    )
  init = functools.partial(transformer.init_params, settings.model)
  return jax.jit(init, out_shardings=setup.param_shardings)(
      jax.random.PRNGKey(settings.seed)
  )


def make_engine(
    settings: engine_config.EngineConfig,
    setup: ModelSetup,
    params: Any,
    recorder: Optional[metrics_recorder.MetricsRecorder] = None,
    executables: Optional[Mapping[str, Any]] = None,
) -> engine_lib.Engine:
  """An engine training `params` with the settings' optimizer and schedule.

  The model is compiled for `setup.mesh`: its "auto" choices resolve for
  the mesh's devices, and per-device kernels run over it.
  The engine clips with the gradient norm it measures for the metrics, so
  the optimizer itself has no clipping stage. `executables`: the engine's
  programs compiled already (`Engine`'s argument), or None.
  """
  schedule = optimizer_lib.make_schedule(settings.optimizer)
  model = settings.model
  return engine_lib.Engine(
      functools.partial(transformer.loss_fn, config=model, mesh=setup.mesh),
      params,
      make_optimizer(settings.optimizer, schedule),
      schedule,
      recorder or metrics_recorder.MetricsRecorder(mode="train"),
      settings.gradient_accumulation_steps,
      param_shardings=setup.param_shardings,
      batch_sharding=setup.batch_sharding,
      grad_clip_norm=settings.grad_clip_norm,
      donate_state=settings.donate_state,
      eval_fn=functools.partial(transformer.eval_fn, config=model),
      eval_directions=transformer.EVAL_DIRECTIONS,
      executables=executables,
      statistic_rules=transformer.statistic_rules(model),
      compute_copy=functools.partial(transformer.gradient_copy, config=model),
  )


def make_optimizer(
    settings: optimizer_lib.OptimizerConfig,
    schedule,
    decay_mask: Optional[Callable[[Any], Any]] = None,
) -> Any:
  """The optimizer every engine of the model trains with: the settings'
  AdamW without its clipping stage (the engine clips with the gradient norm
  it measures for the metrics), weight decay on the model's matrices only
  (`transformer.weight_decay_mask`), or on those `decay_mask` names (a
  frozen router's leaves left out: `maxtext.grpo.loss.frozen_router`)."""
  return optimizer_lib.make_optimizer(
      settings,
      schedule,
      include_clipping=False,
      decay_mask=decay_mask or transformer.weight_decay_mask,
  )


def build_engine(
    settings: engine_config.EngineConfig,
    values: Mapping[str, Any],
    mesh: Optional[jax.sharding.Mesh] = None,
) -> tuple[engine_lib.Engine, ModelSetup]:
  """The settings' model on `mesh` (default: the settings' mesh), as an
  engine.

  With `compiled_step_file` set, the engine runs the programs saved there
  (`saved_step.load`, which raises ValueError naming what differs before
  anything is allocated) and compiles none.

  Args:
    settings: the engine's settings.
    values: the run's config's values by field name (`config.to_dict()`):
      what a saved step must have been compiled for (`saved_step.load`).
    mesh: the mesh, or None for the one `settings.mesh` describes.
  """
  if mesh is None:
    mesh = mesh_lib.make_mesh(settings.mesh)
  executables = (
      saved_step.load(settings.compiled_step_file, values, mesh)
      if settings.compiled_step_file
      else None
  )
  setup = setup_model(settings.model, mesh)
  params = init_params(settings, setup)
  logging.info("Model: %s parameters.", f"{transformer.num_params(params):,}")
  return make_engine(settings, setup, params, executables=executables), setup
