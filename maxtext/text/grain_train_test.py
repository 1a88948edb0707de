"""A tiny model trained on the stdlib's sources through dataset_type=grain."""

import os

from absl.testing import absltest

from maxtext import workloads
from maxtext.storage import data_state
from maxtext.text import prepare
from testing import stdlib_corpus
from testing import run_layout
from testing import tiny_configs

_STEPS = 12
_HALF = 6


class GrainTrainTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tiny_configs.fresh_output_dir("grain_train_test_")
    cls.data = os.path.join(cls.root, "stdlib_data")
    if not os.path.exists(os.path.join(cls.data, "metadata.json")):
      prepare.prepare(
          stdlib_corpus.files(5),
          cls.data,
          train_vocab_size=400,
          eval_every=3,
          report=lambda line: None,
      )

  def _config(self, run_name, steps):
    return tiny_configs.tiny_config(
        self.root,
        run_name=run_name,
        steps=steps,
        dataset_type="grain",
        train_data_path=self.data,
        vocab_size=400,
        lr_schedule_steps=_STEPS,
        eval_interval=_HALF,
        checkpoint_period=_HALF,
        learning_rate=1e-2,
        enable_mllog=False,
        target_eval_loss=0.0,
    )

  def test_learns_and_resumes_with_the_same_batches(self):
    reference = workloads.run(self._config("reference", _STEPS))
    self.assertEqual(reference.final_step, _STEPS)
    evals = [
        r["eval_loss"]
        for r in run_layout.untimed_records(reference.run_dir)
        if r["kind"] == "eval"
    ]
    self.assertLen(evals, 2)
    self.assertLess(evals[1], evals[0])

    first = workloads.run(self._config("resumed", _HALF))
    self.assertEqual(first.final_step, _HALF)
    # The checkpoint carries the pipeline's position, which the resume
    # restores (a different tokenizer or process count would be refused).
    state = data_state.load(
        os.path.join(first.run_dir, "checkpoints"), _HALF, 0
    )
    self.assertEqual((state["kind"], state["step"]), ("grain", _HALF))
    second = workloads.run(self._config("resumed", _STEPS))
    self.assertEqual(second.start_step, _HALF)
    self.assertEqual(
        run_layout.untimed_records(second.run_dir),
        run_layout.untimed_records(reference.run_dir),
    )


if __name__ == "__main__":
  absltest.main()
