"""Tests for maxtext/metrics/metrics_listener.py: eval records in JSONL."""

from absl.testing import absltest

from maxtext.core import eval_metrics
from maxtext.listeners import interface
from maxtext.metrics import jsonl
from maxtext.metrics import metrics_listener
from maxtext.metrics import writers

_LOWER = eval_metrics.Direction.LOWER_IS_BETTER
_HIGHER = eval_metrics.Direction.HIGHER_IS_BETTER


def _record(metrics, step=3):
  return interface.EvalRecord(
      step=step,
      metrics={
          name: eval_metrics.EvalMetric(value, direction)
          for name, (value, direction) in metrics.items()
      },
      target_metric=next(iter(metrics)),
      eval_time=0.25,
      samples=32,
      target_reached=False,
      continues=True,
  )


class MetricsListenerTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.run_dir = self.create_tempdir().full_path
    self.listener = metrics_listener.MetricsListener(
        writers.MetricLogger(
            self.run_dir,
            is_primary=True,
            log_period=1,
            total_steps=10,
            tokens_per_step=64,
        )
    )

  def lines(self):
    self.listener.close()
    path = f"{self.run_dir}/{jsonl.METRICS_FILENAME}"
    with open(path, encoding="utf-8") as f:
      return f.read().splitlines()

  def test_eval_loss_record_keeps_its_keys_and_order(self):
    self.listener.on_eval(_record({"loss": (1.5, _LOWER)}))
    self.assertEqual(
        self.lines(),
        ['{"step": 3, "kind": "eval", "eval_loss": 1.5, "eval_time": 0.25}'],
    )

  def test_every_named_metric_is_written_with_the_eval_prefix(self):
    self.listener.on_eval(
        _record({"pass_rate": (0.75, _HIGHER), "loss": (2.0, _LOWER)})
    )
    (line,) = self.lines()
    self.assertEqual(
        line,
        '{"step": 3, "kind": "eval", "eval_pass_rate": 0.75, '
        '"eval_loss": 2.0, "eval_time": 0.25}',
    )

  def test_a_metric_named_time_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"named 'time'.*'eval_time'"):
      self.listener.on_eval(_record({"time": (1.0, _LOWER)}))
    self.assertEqual(self.lines(), [])


if __name__ == "__main__":
  absltest.main()
