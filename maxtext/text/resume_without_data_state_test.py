"""A grain run resumes from a checkpoint that holds no data iterator state.

Checkpoints written before the iterator state existed hold only the orbax
step directory. Such a checkpoint is made here with the current code: a run
trained half way, then its `data_iterator/` states removed. Resumed, it must
read the same batches as an uninterrupted run (the dataset finds its
position from the step).
"""

import os
import shutil

from absl.testing import absltest

from maxtext.storage import data_state
from testing import stdlib_run
from testing import run_layout
from testing import tiny_configs

_STEPS = 12
_HALF = 6


class ResumeWithoutDataStateTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = tiny_configs.fresh_output_dir("resume_without_state_")
    self.data = stdlib_run.prepare_data(self.root)

  def _train(self, run_name, steps):
    return stdlib_run.train(
        self.root,
        self.data,
        run_name,
        steps,
        lr_schedule_steps=_STEPS,
        eval_interval=_HALF,
        checkpoint_period=_HALF,
    )

  def test_resumes_with_the_batches_of_an_uninterrupted_run(self):
    reference = self._train("reference", _STEPS)
    half = self._train("old_style", _HALF)
    checkpoints = os.path.join(half.run_dir, "checkpoints")
    self.assertIsNotNone(data_state.load(checkpoints, _HALF, 0))
    shutil.rmtree(os.path.join(checkpoints, data_state.DIRNAME))
    self.assertIsNone(data_state.load(checkpoints, _HALF, 0))

    resumed = self._train("old_style", _STEPS)
    self.assertEqual((resumed.start_step, resumed.final_step), (_HALF, _STEPS))
    self.assertEqual(
        run_layout.untimed_records(resumed.run_dir),
        run_layout.untimed_records(reference.run_dir),
    )
    # The resumed run's own checkpoint has a state again.
    self.assertEqual(
        data_state.load(checkpoints, _STEPS, 0)["step"],
        _STEPS,
    )


if __name__ == "__main__":
  absltest.main()
