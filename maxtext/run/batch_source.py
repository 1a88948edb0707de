"""Where a step's micro-batches come from: the `BatchSource` the loop pulls.

The training loop (`maxtext/run/trainer.py`) asks its workload's batch
source for each step's batch: `draw(step, policy)` takes the parameters the
engine holds at that moment (`Policy`) and gives the step's micro-batches on
the devices (`Batch`). A data set's source ignores the parameters; an
on-policy source (GRPO's rollouts) generates with them. What the source
says about itself decides the loop's order:

  draws_ahead       the loop may draw step s + 1's batch while step s runs
                    on the devices (a data set: yes; a rollout of the
                    newest parameters: no; GRPO's rollout drawn one update
                    ahead, grpo_max_age 1: yes)
  reads_parameters  a draw reads the parameters: drawn ahead, it comes once
                    step s's micro-batches but the last are dispatched,
                    before the last one, which takes update s (so it sees
                    the parameters before the update, neither changed nor
                    donated); any other draw ahead comes after the last
  updates_per_batch optimizer updates one batch feeds (GRPO's passes over a
                    rollout); evals, checkpoints and stops fall between
                    batches only

`complete_record` puts what the source measured on the host (a rollout's
rewards and timings) into a step's flushed record before it is written.

An error of user code the source runs (a reward function, a tool) is a
`UserCodeError`: the loop then checkpoints the last completed step before
the error goes on.
"""

import dataclasses
from typing import Any, Sequence


class UserCodeError(RuntimeError):
  """User code that a run calls failed (a reward function, one line).

  The loop checkpoints the last completed step, then lets it go on.
  """


@dataclasses.dataclass(frozen=True)
class Policy:
  """The parameters a draw may read.

  Attributes:
    params: the engine's parameters at the draw.
    version: the optimizer updates they have taken (the engine's step).
  """

  params: Any
  version: int


@dataclasses.dataclass(frozen=True)
class Batch:
  """One step's inputs.

  Attributes:
    micro_batches: the step's K micro-batches on the devices; empty past
      the last step.
    data_wait: seconds the draw waited for its inputs (a data set's read;
      their transfer to the devices left out), counted into the step time's
      `data_wait`.
  """

  micro_batches: Sequence[Any]
  data_wait: float = 0.0


class BatchSource:
  """The base batch source: drawn ahead after the last micro-batch, one
  update per batch, nothing to add to a record (module docstring)."""

  draws_ahead = True
  reads_parameters = False
  updates_per_batch = 1

  def draw(self, step: int, policy: Policy) -> Batch:
    """Step `step`'s batch; `Batch(())` past the last step."""
    raise NotImplementedError

  def complete_record(self, step: int, record) -> None:
    """Completes step `step`'s flushed record (a `MetricsBuffer`) on the
    host: values measured there, `aggregation_fns` of metrics that are not
    means over the micro-batches. Nothing by default."""
    del step, record


class DatasetSource(BatchSource):
  """The run's data set, read ahead: pretraining's and SFT's batches.

  Args:
    state: the run state (`RunState.device_batches` reads the data set).
  """

  def __init__(self, state):
    self._state = state

  def draw(self, step: int, policy: Policy) -> Batch:
    del policy  # A data set's batch is a function of the step.
    micro_batches, wait = self._state.device_batches(step)
    return Batch(micro_batches, wait)
