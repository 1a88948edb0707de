"""What a workload's MLPerf log states beyond the config's: `WorkloadHeader`.

A pretraining run's log is the config's (`mlperf_config.MlperfConfig`): its
sequences, samples and target are the config's fields. Another kind of
training states what its own log says differently, keyed by the log's keys,
never by its config fields' names: a GRPO run's header values (its
sequences are a prompt and a completion, a step's batch is P prompts of G
completions, its sampling options), what sets each (for the pre-flight's
messages), the optimizer updates one batch feeds, and its target (a pass
rate, higher is better). The workload builds it from its own settings
(`Workload.mlperf_header`); the log only writes and checks it, so the
MLPerf log knows no workload's fields.
"""

import dataclasses
from typing import Any, Mapping, Optional

from maxtext.mllog import mlperf_config


@dataclasses.dataclass(frozen=True)
class WorkloadHeader:
  """A workload's own part of its MLPerf log.

  Attributes:
    values: header key -> value the workload states, over the config's
      (a key the required header holds keeps its place; another is logged
      after it, in this order).
    sources: header key -> what in the config sets it, for the
      pre-flight's messages.
    updates_per_batch: optimizer updates one batch feeds (a batch's
      samples count once).
    target: the quality target's value; the run stops with success at it
      (0 = none).
    target_field: the config field that sets `target`.
    higher_is_better: the target's metric improves upwards (a pass rate),
      not downwards (a loss).
  """

  values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
  updates_per_batch: int = 1
  target: float = 0.0
  target_field: str = "target_eval_loss"
  higher_is_better: bool = False


def pretraining(mlperf: mlperf_config.MlperfConfig) -> WorkloadHeader:
  """A pretraining run's: nothing over the config's, its eval loss target."""
  return WorkloadHeader(target=float(mlperf.target_eval_loss))


def of_run(
    mlperf: mlperf_config.MlperfConfig, header: Optional[WorkloadHeader]
) -> WorkloadHeader:
  """`header`, or the pretraining run's when the workload states none."""
  return pretraining(mlperf) if header is None else header
