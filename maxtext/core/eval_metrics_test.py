"""Tests for maxtext/core/eval_metrics.py: directions and the quality target."""

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.core import eval_metrics
from maxtext.configs import base

_LOWER = eval_metrics.Direction.LOWER_IS_BETTER
_HIGHER = eval_metrics.Direction.HIGHER_IS_BETTER
_NAN = float("nan")


class DirectionTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("loss_below", _LOWER, 0.4, True),
      ("loss_at", _LOWER, 0.5, True),
      ("loss_above", _LOWER, 0.6, False),
      ("loss_nan", _LOWER, _NAN, False),
      ("rate_above", _HIGHER, 0.6, True),
      ("rate_at", _HIGHER, 0.5, True),
      ("rate_below", _HIGHER, 0.4, False),
      ("rate_nan", _HIGHER, _NAN, False),
  )
  def test_reaches(self, direction, value, expected):
    self.assertIs(direction.reaches(value, 0.5), expected)

  def test_symbol(self):
    self.assertEqual((_LOWER.symbol, _HIGHER.symbol), ("<=", ">="))


class TargetTest(parameterized.TestCase):

  def test_config_target_is_the_eval_loss(self):
    self.assertEqual(eval_metrics.target(3.3), eval_metrics.Target("loss", 3.3))
    self.assertEqual(  # 0, base.py's default: no target.
        eval_metrics.target(base.get_config().target_eval_loss),
        eval_metrics.Target("loss", None),
    )

  def test_reached_in_the_metric_direction(self):
    metrics = {
        "loss": eval_metrics.EvalMetric(0.9, _LOWER),
        "pass_rate": eval_metrics.EvalMetric(0.7, _HIGHER),
    }
    self.assertTrue(eval_metrics.Target("loss", 1.0).reached(metrics))
    self.assertFalse(eval_metrics.Target("loss", 0.8).reached(metrics))
    self.assertTrue(eval_metrics.Target("pass_rate", 0.6).reached(metrics))
    self.assertFalse(eval_metrics.Target("pass_rate", 0.8).reached(metrics))
    self.assertFalse(eval_metrics.Target("loss", None).reached(metrics))
    with self.assertRaises(KeyError):
      eval_metrics.Target("accuracy", 0.5).reached(metrics)


if __name__ == "__main__":
  absltest.main()
