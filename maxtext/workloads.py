"""Every workload of the one training loop, by the config's `workload` name.

The top of the package stack (docs/ARCHITECTURE.md): the loop
(`maxtext.run.trainer`) sits below every workload and trains the one its
caller gives with the run's settings (`run_settings.RunSettings`); `run(config)`
here checks the config, builds the settings and the workload `config.workload`
names, once, and trains it, for the binaries, tests and tools. Each name of
`choices.WORKLOADS` has its builder here (`workloads_test` checks both ways):
it makes the workload with its own settings (SFT's `SftConfig`, GRPO's
`GrpoConfig`, which holds every component's settings GRPO builds), and the
language model's engine builder (`engine_builder`) reads the run's config
whole from here. A workload object holds one run's state: `for_config` makes
a new one per run.
"""

import types
from typing import Any, Callable, Optional

from maxtext.config import config_lib
from maxtext.core import choices
from maxtext.engine import engine_config
from maxtext.engine import model_setup
from maxtext.grpo import grpo_config
from maxtext.grpo import grpo_workload
from maxtext.run import preflight
from maxtext.run import run_settings
from maxtext.run import trainer
from maxtext.run import workload as workload_lib
from maxtext.sft import sft_workload
from maxtext.storage import run_dir as run_dir_lib


def engine_builder(config) -> workload_lib.EngineBuilder:
  """The language model's engine builder: `model_setup.build_engine` of
  `config` with the attempt's seed (pretraining's and SFT's)."""

  def build(seed: int, mesh):
    seeded = config_lib.with_seed(config, seed)
    return model_setup.build_engine(
        engine_config.EngineConfig.from_config(seeded), seeded.to_dict(), mesh
    )

  return build


def _pretraining(config) -> workload_lib.Workload:
  return workload_lib.Workload(engine_builder(config))


def _sft(config) -> sft_workload.SftWorkload:
  return sft_workload.SftWorkload(
      sft_workload.SftConfig.from_config(config), engine_builder(config)
  )


def _grpo(config) -> grpo_workload.GrpoWorkload:
  return grpo_workload.GrpoWorkload(grpo_config.GrpoConfig.from_config(config))


# The workload's name -> the builder of a new one from the run's config.
WORKLOADS: dict[str, Callable[[Any], workload_lib.Workload]] = {
    "pretraining": _pretraining,
    "sft": _sft,
    "grpo": _grpo,
}


def for_config(config) -> workload_lib.Workload:
  """A new workload of the kind `config.workload` names, with its settings.

  Raises:
    ValueError: an unknown name, naming the field and the choices; as the
      workload's settings' `validate` (SFT's: a chat data set).
  """
  factory = WORKLOADS.get(config.workload)
  if factory is None:
    raise ValueError(
        f"config.workload={config.workload!r}: must be one of "
        f"{', '.join(map(repr, choices.WORKLOADS))}"
    )
  return factory(config)


def is_grpo(config) -> bool:
  """Whether the config's run is a GRPO run (its MLPerf log's kind)."""
  return config.workload == grpo_workload.GrpoWorkload.name


def check(
    config, workload: Optional[workload_lib.Workload] = None
) -> tuple[run_settings.RunSettings, workload_lib.Workload]:
  """Every check a run makes before any device work; the run's settings and
  workload, built once.

  The config's fields (`config_lib.validate`), its input paths resolved
  against the caller's directory, the settings of every component the loop
  builds (their `validate`), a GRPO run's fields (`config_lib.validate_grpo`),
  the workload's own checks and the pre-flight's (files, the MLPerf rules).

  Args:
    config: the run's config.
    workload: a workload of `config.workload`'s name, made by the
      caller from this config (a benchmark's or a test's that watches the
      run); None = `for_config` of the config, its paths resolved.

  Returns:
    (the run's settings, its workload).

  Raises:
    trainer.ConfigError: one line naming the field and the value.
  """
  try:
    config_lib.validate(config)
    config = config_lib.with_values(
        config,
        run_dir_lib.resolved_input_paths(
            run_dir_lib.RunDirConfig.from_config(config)
        ),
    )
    settings = run_settings.RunSettings.from_config(
        config,
        record=types.MappingProxyType(config_lib.to_json_dict(config)),
    )
    made = workload or for_config(config)
    if made.name != config.workload:
      raise ValueError(
          f"config.workload={config.workload!r}: the run was given the "
          f"{made.name!r} workload"
      )
    if is_grpo(config):
      # GRPO's fields across each other, the model and the batch.
      config_lib.validate_grpo(config)
    made.check()
    preflight.check(
        preflight.PreflightConfig.from_config(config), made.mlperf_header()
    )
  except (ValueError, TypeError) as e:
    raise trainer.ConfigError(str(e)) from e
  return settings, made


def run(
    config, *, workload: Optional[workload_lib.Workload] = None, **kwargs
) -> trainer.RunResult:
  """`trainer.run` of the workload `config.workload` names, once `check`
  passed.

  Args:
    config: the run's config.
    workload: as `check`'s.
    **kwargs: `trainer.run`'s other arguments (config_filename,
      stop_request, extra_listeners).

  Raises:
    trainer.ConfigError: as `check` and `trainer.run`.
  """
  settings, made = check(config, workload)
  return trainer.run(settings, workload=made, **kwargs)
