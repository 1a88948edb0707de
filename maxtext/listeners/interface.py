"""What a run tells its outputs: the `RunListener` interface and its records.

Every output of a run (console, JSONL and TensorBoard, the MLPerf log, the
GCS mirror, the profiler) is a `RunListener`. The training loop calls the
listeners through one `MultiListener` (`multi_listener.py`) and never knows
which outputs exist. Calls come in this order:

  on_run_start
  (on_step_start(s) ... on_step(record of s)
   [on_eval_start, on_eval | on_eval_deferred] [on_checkpoint])*
  on_run_end
  close

With `deferred_eval`, `on_eval_deferred` takes the place of each eval: the
weights were saved to be evaluated after the run.

`on_step` for a step may come after `on_step_start` of the next step: the
loop writes a step's records while the device runs the next step (see
`maxtext/run/trainer.py`); `on_eval` and `on_checkpoint` always follow the
`on_step` of the step they belong to. All values are host values (Python
numbers), never device arrays, so a listener cannot stall the device.

A listener that raises is handled in one place, `MultiListener`: see its
docstring for the policy.
"""

import dataclasses
import enum
from typing import Mapping

from maxtext.core import eval_metrics


class RunOutcome(enum.Enum):
  """How a run ended."""

  SUCCESS = "success"  # An eval reached the quality target.
  COMPLETED = "completed"  # Ran its step budget without reaching a target.
  INTERRUPTED = "interrupted"  # Stopped by SIGTERM/SIGINT after a checkpoint.
  FAILED = "failed"  # An error stopped it.


@dataclasses.dataclass(frozen=True)
class RunStart:
  """The run is built and about to train.

  Attributes:
    start_step: completed steps restored from a checkpoint (0 for a new run).
    samples: samples trained before this attempt.
    warmup_time: seconds spent compiling and warming up the step before the
      run starts (0 when there was no warm-up).
  """

  start_step: int
  samples: int
  warmup_time: float = 0.0


@dataclasses.dataclass(frozen=True)
class StepRecord:
  """One finished training step.

  Attributes:
    step: the step's 0-based index.
    metrics: the step's reduced metrics (name -> float): `loss`,
      `learning_rate`, `grad_norm`, `step_skipped`, ...
    step_time: seconds the step took, eval and checkpoint time left out.
    samples: samples trained once this step finished, resumed ones included.
    data_wait: seconds of `step_time` the host spent reading batches from
      the data set (the next step's, read while this one computes).
  """

  step: int
  metrics: Mapping[str, float]
  step_time: float
  samples: int
  data_wait: float = 0.0


@dataclasses.dataclass(frozen=True)
class EvalRecord:
  """One finished evaluation, after training step `step`.

  Attributes:
    step: 0-based index of the last training step before the eval.
    metrics: metric name -> its mean over the eval batches and the way it
      improves; the language model's is "loss", the mean eval loss in nats
      per token (lower is better).
    target_metric: the name, among `metrics`, of the metric the run's
      quality target is on (MLPerf's `eval_accuracy`), also when the run
      has no target threshold.
    eval_time: seconds the eval took.
    samples: samples trained before the eval.
    target_reached: `target_metric` reached the run's target: the run ends
      with success.
    continues: training goes on after this eval (neither the target nor the
      last step was reached).
  """

  step: int
  metrics: Mapping[str, eval_metrics.EvalMetric]
  target_metric: str
  eval_time: float
  samples: int
  target_reached: bool
  continues: bool

  def __post_init__(self):
    if self.target_metric not in self.metrics:
      raise ValueError(
          f"target_metric {self.target_metric!r} is not among the eval "
          f"metrics {sorted(self.metrics)}"
      )

  @property
  def target_value(self) -> float:
    """The value of `target_metric`."""
    return self.metrics[self.target_metric].value


@dataclasses.dataclass(frozen=True)
class DeferredEval:
  """An evaluation point whose eval is deferred: the weights were saved.

  Attributes:
    step: 0-based index of the last training step before the point.
    samples: samples trained before the point.
    directory: where the weights-only checkpoint of `step + 1` completed
      steps is (`maxtext/storage/weights_checkpoints.py`).
    update_time: seconds since the epoch at which step `step`'s parameter
      update had finished (the time a deferred result's clock may stop at).
  """

  step: int
  samples: int
  directory: str
  update_time: float


@dataclasses.dataclass(frozen=True)
class RunEnd:
  """The run has ended (it will not train further in this process).

  Attributes:
    outcome: how it ended.
    final_step: completed steps at the end.
    samples: samples trained at the end, resumed ones included.
  """

  outcome: RunOutcome
  final_step: int
  samples: int


class RunListener:
  """An output of a run. Every method is optional: the defaults do nothing.

  Attributes:
    name: names the listener in messages (e.g. "metrics", "mllog").
    critical: whether a failure of this listener stops the run. True for
      outputs whose loss would lose data (metrics files, the MLPerf log);
      False for outputs that retry on their own and whose failures are
      warnings (the GCS mirror).
  """

  name: str = "listener"
  critical: bool = True

  def check_fence(self) -> None:
    """Raises when the run may write nothing more (another run owns it).

    `MultiListener` calls it, on the listeners that override it, before
    every event; once it raised, no listener receives any further event.
    """

  def on_run_start(self, start: RunStart) -> None:
    """The run is about to train its first step (after any restore)."""

  def on_step_start(self, step: int) -> None:
    """Training step `step` (0-based) is about to be dispatched."""

  def on_step(self, record: StepRecord) -> None:
    """A training step finished; its metrics are on the host."""

  def on_eval_start(self, step: int, samples: int) -> None:
    """An evaluation after training step `step` is about to run."""

  def on_eval(self, record: EvalRecord) -> None:
    """An evaluation finished."""

  def on_eval_deferred(self, point: DeferredEval) -> None:
    """An evaluation point passed with its weights saved, not evaluated."""

  def on_checkpoint(self, step: int, directory: str) -> None:
    """A checkpoint of `step` completed steps was written to `directory`."""

  def on_run_end(self, end: RunEnd) -> None:
    """The run ended; called once, also when it failed."""

  def close(self) -> None:
    """Flushes and releases what the listener holds. Called once, last."""
