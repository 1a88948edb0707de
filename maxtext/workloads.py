"""Every workload of the one training loop, by the config's `workload` name.

The top of the package stack (docs/ARCHITECTURE.md): the loop
(`maxtext.run.trainer`) sits below every workload and trains the one its
caller gives; `run(config)` here trains the one `config.workload` names, for
the binaries, tests and tools. Each name of `choices.WORKLOADS` has its class
here (`workloads_test` checks both ways). A workload object holds one run's
state: `for_config` makes a new one per run.
"""

from typing import Any

from maxtext.core import choices
from maxtext.run import trainer
from maxtext.run import workload
from maxtext.grpo import grpo_workload
from maxtext.sft import sft_workload

WORKLOADS = {
    "pretraining": workload.Workload,
    "sft": sft_workload.SftWorkload,
    "grpo": grpo_workload.GrpoWorkload,
}


def for_config(config) -> workload.Workload:
  """A new workload of the kind `config.workload` names.

  Raises:
    ValueError: an unknown name, naming the field and the choices.
  """
  factory = WORKLOADS.get(config.workload)
  if factory is None:
    raise ValueError(
        f"config.workload={config.workload!r}: must be one of "
        f"{', '.join(map(repr, choices.WORKLOADS))}"
    )
  return factory()


def is_grpo(config) -> bool:
  """Whether the config's run is a GRPO run (its MLPerf log's kind)."""
  return config.workload == grpo_workload.GrpoWorkload.name


def check(config) -> tuple[Any, workload.Workload]:
  """`trainer.check` with the workload `config.workload` names.

  Raises:
    trainer.ConfigError: as `trainer.check`, and an unknown workload name.
  """
  return trainer.check(config, _resolved(config))


def run(config, **kwargs) -> trainer.RunResult:
  """`trainer.run` of the workload `config.workload` names.

  Args:
    config: the run's config.
    **kwargs: `trainer.run`'s other arguments (config_filename,
      stop_request, extra_listeners).

  Raises:
    trainer.ConfigError: as `trainer.run`, and an unknown workload name.
  """
  return trainer.run(config, workload=_resolved(config), **kwargs)


def _resolved(config) -> workload.Workload:
  """`for_config`, its error a ConfigError as the loop's other checks."""
  try:
    return for_config(config)
  except ValueError as e:
    raise trainer.ConfigError(str(e)) from e
