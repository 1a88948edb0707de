"""Every workload of the one training loop, by the config's `workload` name.

`trainer.run(config)` trains the workload `config.workload` names; each name
of `choices.WORKLOADS` has its class here (`workloads_test` checks both
ways). A workload object holds one run's state: `for_config` makes a new one
per run.
"""

from maxtext import choices
from maxtext import workload
from maxtext.grpo import workload as grpo_workload
from maxtext.sft import workload as sft_workload

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
