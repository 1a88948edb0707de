"""Tests of the evaluation schedule."""

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.config import eval_schedule
from maxtext.configs import base


def _config(**overrides):
  config = base.get_config()
  config.update(overrides)
  return eval_schedule.EvalSchedule.from_config(config)


def _due_steps(config):
  return [
      c for c in range(1, config.steps + 1) if eval_schedule.eval_due(config, c)
  ]


class EvalScheduleTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("every_interval", dict(eval_interval=3, steps=10), 3, [3, 6, 9, 10]),
      (
          "budget_a_multiple",
          dict(eval_interval=5, steps=10),
          5,
          [5, 10],
      ),
      (
          "first_after_samples",
          dict(
              eval_interval=3,
              steps=12,
              global_batch_size=4,
              first_eval_samples=8,
          ),
          2,
          [2, 5, 8, 11, 12],
      ),
      (
          "every_step_after_the_first",
          dict(
              eval_interval=1,
              steps=8,
              global_batch_size=16,
              first_eval_samples=80,
          ),
          5,
          [5, 6, 7, 8],
      ),
      (
          "first_past_the_budget",
          dict(
              eval_interval=2,
              steps=4,
              global_batch_size=2,
              first_eval_samples=20,
          ),
          10,
          [4],
      ),
  )
  def test_schedule(self, overrides, first, due):
    config = _config(**overrides)
    self.assertEqual(eval_schedule.first_eval_step(config), first)
    self.assertEqual(_due_steps(config), due)

  def test_mlperf_deepseek_first_eval(self):
    # The 6.1.0 deepseekv3_671b rule: the first eval_accuracy at
    # gbs * floor(42 + 24576 / gbs) samples; 43 steps at a batch of 16384.
    config = _config(
        global_batch_size=16384,
        eval_interval=1,
        steps=12000,
        first_eval_samples=16384 * 43,
    )
    self.assertEqual(eval_schedule.first_eval_step(config), 43)
    self.assertFalse(eval_schedule.eval_due(config, 42))
    self.assertTrue(eval_schedule.eval_due(config, 43))
    self.assertTrue(eval_schedule.eval_due(config, 44))

  def test_several_updates_per_batch(self):
    # A GRPO rollout of 8 samples feeding 2 updates: first_eval_samples=24
    # is 3 rollouts, so 6 updates; then every eval_interval (2) updates,
    # after every rollout.
    config = _config(
        global_batch_size=8, first_eval_samples=24, eval_interval=2, steps=12
    )
    self.assertEqual(eval_schedule.first_eval_step(config, 2), 6)
    self.assertEqual(
        [c for c in range(1, 13) if eval_schedule.eval_due(config, c, 2)],
        [6, 8, 10, 12],
    )
    # One update per batch: the same samples are 3 updates.
    self.assertEqual(eval_schedule.first_eval_step(config), 3)


if __name__ == "__main__":
  absltest.main()
