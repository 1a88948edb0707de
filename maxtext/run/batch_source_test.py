"""batch_source: the loop pulls a step's batch from a workload's source.

A workload of the tiny language model whose batch source wraps the data
set's (`DatasetSource`) and says other things about itself: where the loop
draws a source that reads the parameters, what `complete_record` adds, how
`updates_per_batch` counts samples, and that a `UserCodeError` while drawing
costs nothing trained.
"""

import os

from absl.testing import absltest
import numpy as np

from maxtext import workloads
from maxtext.listeners import interface
from maxtext.run import batch_source
from maxtext.run import workload as workload_lib
from maxtext.storage import checkpointing
from testing import tiny_configs

_STEPS = 4


class _Source(batch_source.DatasetSource):
  """The data set's batches, each draw noted as (step, policy.version,
  micro-batches of the running step dispatched)."""

  def __init__(self, state, fails_at=None, **says):
    super().__init__(state)
    self.draws = []
    self._fails_at = fails_at
    for name, value in says.items():
      setattr(self, name, value)

  def draw(self, step, policy):
    if step == self._fails_at:
      raise batch_source.UserCodeError(f"no batch for step {step}")
    engine = self._state.engine
    self.draws.append((step, policy.version, engine.micro_batches_done))
    return super().draw(step, policy)

  def complete_record(self, step, record):
    record.scalar_metrics["source/step"] = np.array([float(step)])


class _Workload(workload_lib.Workload):
  """Pretraining of `config`, its batches from `_Source(state,
  **source_args)`."""

  def __init__(self, config, **source_args):
    super().__init__(workloads.engine_builder(config))
    self._args = source_args
    self.source = None

  def batch_source(self, state):
    self.source = _Source(state, **self._args)
    return self.source


class _Records(interface.RunListener):
  name = "records"

  def __init__(self):
    self.records = []

  def on_step(self, record):
    self.records.append(record)


def _run(output_dir, **source_args):
  """Trains the tiny model `_STEPS` steps; (workload, records, result)."""
  config = tiny_configs.tiny_config(
      output_dir, steps=_STEPS, eval_interval=_STEPS
  )
  workload, records = _Workload(config, **source_args), _Records()
  result = workloads.run(config, workload=workload, extra_listeners=[records])
  return workload, records.records, result


class BatchSourceTest(absltest.TestCase):

  def test_a_source_that_reads_parameters_is_drawn_before_each_update(self):
    workload, records, result = _run(
        self.create_tempdir().full_path, reads_parameters=True
    )
    self.assertEqual(result.final_step, _STEPS)
    # The first batch with the starting parameters, then step s + 1's
    # with the parameters before update s, once its micro-batches but the
    # last (K = 2: one) are dispatched; past the last step, none.
    self.assertEqual(
        workload.source.draws,
        [(0, 0, 0)] + [(s + 1, s, 1) for s in range(_STEPS)],
    )
    # complete_record's host value is in each step's record.
    self.assertEqual(
        [r.metrics["source/step"] for r in records], list(range(_STEPS))
    )

  def test_a_source_not_drawn_ahead_is_drawn_at_each_step(self):
    workload, _, _ = _run(self.create_tempdir().full_path, draws_ahead=False)
    self.assertEqual(workload.source.draws, [(s, s, 0) for s in range(_STEPS)])

  def test_a_data_set_is_drawn_ahead_after_the_last_micro_batch(self):
    workload, _, _ = _run(self.create_tempdir().full_path)
    self.assertEqual(
        workload.source.draws,
        [(0, 0, 0)] + [(s + 1, s, 2) for s in range(_STEPS)],
    )

  def test_samples_count_once_per_batch(self):
    _, records, _ = _run(self.create_tempdir().full_path, updates_per_batch=2)
    batch = tiny_configs.tiny_config("/unused").global_batch_size
    self.assertEqual(
        [r.samples for r in records], [batch, batch, 2 * batch, 2 * batch]
    )

  def test_user_code_error_keeps_the_completed_steps(self):
    out = self.create_tempdir().full_path
    with self.assertRaisesRegex(
        batch_source.UserCodeError, "^no batch for step 3$"
    ):
      _run(out, draws_ahead=False, fails_at=3)
    with checkpointing.Checkpointer(
        os.path.join(out, "tiny", "checkpoints"), save_period=1, max_to_keep=0
    ) as checkpoints:
      self.assertEqual(checkpoints.all_steps(), [3])


if __name__ == "__main__":
  absltest.main()
