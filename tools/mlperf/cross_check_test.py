"""Tests for tools.mlperf.cross_check: an MLPerf log against metrics.jsonl."""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.metrics import jsonl
from tools.mlperf import cross_check

_BATCH = 8


def _events():
  """A run of 3 steps with an eval after step 2 (1-based), as logged."""
  return [
      {"key": "run_start", "metadata": {}},
      {
          "key": "tracked_stats",
          "value": {"train_loss": 3.0, "step_time": 0.1},
          "metadata": {"step": 1, "samples_count": 8},
      },
      {
          "key": "tracked_stats",
          "value": {"train_loss": 2.5, "step_time": 0.1},
          "metadata": {"step": 2, "samples_count": 16},
      },
      {"key": "eval_start", "metadata": {"samples_count": 16}},
      {
          "key": "eval_accuracy",
          "value": 2.25,
          "metadata": {"samples_count": 16},
      },
      {"key": "eval_stop", "metadata": {"samples_count": 16}},
      {
          "key": "tracked_stats",
          "value": {"validation_time": 0.2},
          "metadata": {"step": 2},
      },
      {
          "key": "tracked_stats",
          "value": {"train_loss": 2.0, "step_time": 0.1},
          "metadata": {"step": 3, "samples_count": 24},
      },
  ]


_RECORDS = [
    {"step": 0, "kind": "train", "loss": 3.0},
    {"step": 1, "kind": "train", "loss": 2.5},
    {"step": 1, "kind": "eval", "eval_loss": 2.25},
    {"step": 2, "kind": "train", "loss": 2.0},
]


class CrossCheckTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.run_dir = self.create_tempdir().full_path
    self.write_records(_RECORDS)

  def write_records(self, records):
    with open(
        os.path.join(self.run_dir, jsonl.METRICS_FILENAME),
        "w",
        encoding="utf-8",
    ) as f:
      for record in records:
        f.write(json.dumps(record) + "\n")

  def check(self, events):
    # Line numbers as a log with a header line before the events has them.
    cross_check.check_run(
        "mllog.log",
        [(i + 2, e) for i, e in enumerate(events)],
        self.run_dir,
        _BATCH,
    )

  def test_a_faithful_log_passes(self):
    self.check(_events())

  @parameterized.named_parameters(
      (
          "edited_eval_accuracy",
          lambda e: e[4].update(value=2.0),
          r"^mllog\.log:6: eval_accuracy 2\.0 after step 2 but eval_loss 2\.25",
      ),
      (
          "edited_train_loss",
          lambda e: e[2]["value"].update(train_loss=9.0),
          r"^mllog\.log:4: train_loss 9\.0 at step 2 but loss 2\.5",
      ),
      (
          "edited_samples_count",
          lambda e: e[7]["metadata"].update(samples_count=32),
          r"^mllog\.log:9: tracked_stats has samples_count 32 but 3 steps of"
          r" global_batch_size 8 are 24",
      ),
      (
          "eval_removed",
          lambda e: [e.pop(3) for _ in range(4)],
          r"^mllog\.log:\d+: no eval_accuracy for the eval record\(s\) of"
          r" step\(s\) 2",
      ),
      (
          "step_of_another_run",
          lambda e: e[7]["metadata"].update(step=4, samples_count=32),
          r"^mllog\.log:9: train_loss of step 4 has no train record",
      ),
  )
  def test_a_disagreement_names_the_line(self, edit, regex):
    events = _events()
    edit(events)
    with self.assertRaisesRegex(cross_check.MismatchError, regex):
      self.check(events)

  def test_no_metrics_file_is_refused(self):
    os.remove(os.path.join(self.run_dir, jsonl.METRICS_FILENAME))
    with self.assertRaisesRegex(
        cross_check.MismatchError, r"metrics\.jsonl is missing"
    ):
      self.check(_events())


if __name__ == "__main__":
  absltest.main()
