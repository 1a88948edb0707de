"""pass_rate: the estimator against counting every k-subset."""

import itertools

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.grpo.rewards import pass_rate


def _brute(n, c, k):
  samples = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(samples, k))
  return sum(any(s) for s in subsets) / len(subsets)


class PassRateTest(parameterized.TestCase):

  @parameterized.parameters(
      (n, c, k)
      for n in (1, 4, 7)
      for c in range(n + 1)
      for k in range(1, n + 1)
  )
  def test_matches_counting(self, n, c, k):
    self.assertAlmostEqual(pass_rate.pass_at_k(n, c, k), _brute(n, c, k))

  def test_mean_over_prompts(self):
    correct = [
        [True, False, False, False],
        [True, True, True, True],
        [False] * 4,
    ]
    self.assertAlmostEqual(pass_rate.mean_pass_at_k(correct, 1), 1.25 / 3)
    self.assertAlmostEqual(pass_rate.mean_pass_at_k(correct, 4), 2 / 3)

  def test_k_of_k_is_grouped_pass_at_k(self):
    # MLPerf qwen35_397b_grpo's eval_accuracy: k samples per task, a task
    # passes if any does; the estimator with n = k is exactly that.
    rng = np.random.default_rng(0)
    correct = rng.random((251, 4)) < 0.2
    self.assertAlmostEqual(
        pass_rate.mean_pass_at_k(correct.tolist(), 4),
        float(np.mean(np.any(correct, axis=1))),
    )

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "k=5"):
      pass_rate.pass_at_k(4, 1, 5)
    with self.assertRaisesRegex(ValueError, "no prompts"):
      pass_rate.mean_pass_at_k([], 1)


if __name__ == "__main__":
  absltest.main()
