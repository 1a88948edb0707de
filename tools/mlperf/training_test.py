"""Tests of the --runs mode's checks before any training, and its seeds.

Training the runs and checking each log is tested end to end in package_test.
"""

import os

from absl.testing import absltest
from absl.testing import parameterized

from testing import mlperf_runs
from tools.mlperf import submission
from tools.mlperf import training


class DrawSeedsTest(parameterized.TestCase):

  def test_distinct_seeds_in_range(self):
    seeds = training.draw_seeds(10)
    self.assertLen(set(seeds), 10)
    self.assertTrue(all(0 <= s < 2**31 for s in seeds))

  def test_a_repeated_draw_is_drawn_again(self):
    draws = iter([b"\1\0\0\0", b"\1\0\0\0", b"\2\0\0\0"])
    self.assertEqual(training.draw_seeds(2, lambda n: next(draws)), [1, 2])

  def test_count_checked(self):
    with self.assertRaisesRegex(ValueError, "count"):
      training.draw_seeds(0)


class TrainRunsRefusalsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.out = self.create_tempdir().full_path
    self.config = mlperf_runs.tiny_mlperf_config(self.out)

  def test_wrong_count_is_refused_before_training(self):
    with self.assertRaisesRegex(
        submission.PackageError, "wrong number of runs for llama31_8b"
    ):
      training.train_runs(self.config, 3, self.out)
    self.assertFalse(os.path.exists(training.runs_dir(self.out)))

  def test_repeated_seeds_are_refused(self):
    count = submission.required_runs("llama31_8b")
    with self.assertRaisesRegex(submission.PackageError, "distinct seeds"):
      training.train_runs(self.config, count, self.out, seeds=[1] * count)

  def test_existing_run_directory_is_refused(self):
    count = submission.required_runs("llama31_8b")
    os.makedirs(os.path.join(training.runs_dir(self.out), "run_0"))
    with self.assertRaisesRegex(submission.PackageError, "fresh --output_dir"):
      training.train_runs(self.config, count, self.out)


if __name__ == "__main__":
  absltest.main()
