"""GRPO's rollouts as the batch source the one loop pulls from.

`RolloutSource` is a `batch_source.BatchSource`: the training loop
(`maxtext/run/trainer.py`) draws each update's micro-batches from it with
the engine's parameters (`Policy`) and dispatches them itself. Rollout r
feeds updates r * n .. r * n + n - 1 (n = grpo_num_iterations, the
source's `updates_per_batch`); later updates of a rollout reuse its
micro-batches.

With grpo_max_age 0 a rollout needs the newest parameters, so nothing is
drawn ahead: the first update of each rollout draws it. With grpo_max_age 1
(`draws_ahead`, `reads_parameters`) the loop draws update s + 1's batch
once update s's micro-batches but the last are dispatched, before the last,
which takes update s: rollout s + 1 is drawn with the parameters before
update s (its samples one update old when they train), and the rollout
drawn ahead is kept beside each checkpoint (`pending_state`,
`pending_rollout`), so a resume trains on the rollout an uninterrupted run
drew.

`complete_record` puts the rollout's statistics and the phase timings into
each update's flushed record (`RolloutBatches.complete`).
"""

import dataclasses
import time
from typing import Optional

from absl import logging

from maxtext.grpo.rollout import pending_rollout
from maxtext.grpo.rollout import rollout_batches as rollout_batches_lib
from maxtext.run import batch_source


class RolloutSource(batch_source.BatchSource):
  """The GRPO run's rollouts, as micro-batches of its updates.

  Args:
    batches: makes a rollout's micro-batches (`RolloutBatches`).
    updates_per_batch: grpo_num_iterations.
    max_age: grpo_max_age (0 or 1).
    start_step: completed updates at the start of the attempt.
    steps: the run's last update + 1.
    restored: rollout index -> (rollout, versions) a restored checkpoint
      holds (`pending_rollout.decode`).
  """

  reads_parameters = True  # A rollout is drawn with the parameters.

  def __init__(
      self,
      batches: rollout_batches_lib.RolloutBatches,
      *,
      updates_per_batch: int,
      max_age: int,
      start_step: int,
      steps: int,
      restored: Optional[dict[int, tuple]] = None,
  ):
    self._batches = batches
    self.updates_per_batch = updates_per_batch
    self.draws_ahead = max_age >= 1
    self._start_step = start_step
    self._steps = steps
    self._restored = dict(restored or {})
    # Drawn each at its first update (grpo_max_age 0): the newest rollout,
    # and perf_counter() when an update's micro-batches were ready.
    self._current: Optional[rollout_batches_lib.Prepared] = None
    self._ready = 0.0
    # Drawn ahead (grpo_max_age 1): rollout index -> its Prepared (the
    # one training and the one drawn ahead), and perf_counter() when each
    # update's micro-batches but the last were dispatched.
    self._prepared: dict[int, rollout_batches_lib.Prepared] = {}
    self._dispatched: dict[int, float] = {}

  def rollout_of(self, step: int) -> int:
    """The rollout that feeds update `step`."""
    return step // self.updates_per_batch

  def draw(self, step: int, policy: batch_source.Policy) -> batch_source.Batch:
    if self.draws_ahead:
      return batch_source.Batch(self._ahead(step, policy))
    if step % self.updates_per_batch == 0:
      self._current = self._batches.prepare(self.rollout_of(step), policy)
    self._ready = time.perf_counter()
    return batch_source.Batch(self._current.batches)

  def _ahead(self, step: int, policy: batch_source.Policy):
    """Update `step`'s micro-batches when rollouts are drawn ahead.

    Drawn by the loop for the first update of the attempt, then for update
    s + 1 once update s's micro-batches but its last are dispatched, before
    the last one, which takes update s: a rollout drawn then has the
    parameters before update s. A resumed attempt's first rollout is the
    checkpoint's (drawn as the uninterrupted run drew it), else, with a
    warning, one drawn now.
    """
    if step > self._start_step:
      # Update step - 1's micro-batches but its last were dispatched just
      # before.
      self._dispatched[step - 1] = time.perf_counter()
    if step >= self._steps:
      return []  # Nothing is left to draw for.
    index = self.rollout_of(step)
    if index not in self._prepared:
      self._prepared[index] = self._prepare_ahead(step, index, policy)
      # Keep the rollout training and the one drawn ahead.
      for old in [i for i in self._prepared if i < index - 1]:
        del self._prepared[old]
    return self._prepared[index].batches

  def _prepare_ahead(
      self, step: int, index: int, policy: batch_source.Policy
  ) -> rollout_batches_lib.Prepared:
    """Rollout `index`, first needed by update `step`: the checkpoint's,
    else drawn now."""
    restored = self._restored.pop(index, None)
    if restored is not None:
      return self._batches.prepare(index, policy, restored=restored)
    if step == self._start_step and step > 0:
      logging.warning(
          "GRPO: the checkpoint of step %d holds no rollout drawn ahead "
          "(grpo_max_age=1); rollout %d is drawn now, with the "
          "parameters of step %d, not of the step before as an "
          "uninterrupted run draws it.",
          step,
          index,
          step,
      )
    return self._batches.prepare(index, policy, ahead=step > self._start_step)

  def rollout_for(self, step: int) -> Optional[rollout_batches_lib.Prepared]:
    """The rollout that feeds update `step`, once drawn (None before, and
    once a rollout drawn ahead is two rollouts old)."""
    if not self.draws_ahead:
      # The newest rollout feeds every update until the next is drawn.
      return self._current
    return self._prepared.get(self.rollout_of(step))

  def complete_record(self, step: int, record) -> None:
    if not self.draws_ahead:
      self._batches.complete(record, self._ready, self._current)
      return
    self._batches.complete(
        record, self._dispatched.pop(step), self.rollout_for(step), step
    )

  def warm_up_batches(self, step: int, policy: batch_source.Policy) -> list:
    """Micro-batches of update `step`'s rollout drawn with placeholder
    reward functions (`RolloutBatches.placeholder_rewards`): every program
    of an update's draw compiled, no user code run, nothing kept."""
    return self._batches.prepare(
        self.rollout_of(step),
        policy,
        self._batches.placeholder_rewards(),
    ).batches

  def pending_state(self, step: int) -> Optional[dict]:
    """The encoded rollout that feeds update `step` (the checkpoint of
    `step` updates done), or None when none was drawn."""
    prepared = self.rollout_for(step)
    if prepared is None:
      return None
    rollout = prepared.rollout
    # The saved statistics carry the drawing's time too.
    stats = dict(
        rollout.stats, **{"timing/rollout": prepared.values["timing/rollout"]}
    )
    return pending_rollout.encode(
        self.rollout_of(step),
        dataclasses.replace(rollout, stats=stats),
        prepared.versions,
    )
