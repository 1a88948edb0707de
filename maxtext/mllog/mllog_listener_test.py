"""Tests for maxtext.mllog.mllog_listener: throughput in tracked_stats, checked.

The listener is driven through a whole short run (events as the trainer sends
them) into a real log file, which the official compliance checker then
judges.
"""

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.core import eval_metrics
from maxtext.listeners import interface
from maxtext.metrics import throughput
from maxtext.mllog import mllog_listener
from maxtext.mllog import logger as mllog_logger
from maxtext.mllog import mlperf_config
from testing import compliance_checker
from testing import tiny_configs


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


_STEPS = 10
_LOWER = eval_metrics.Direction.LOWER_IS_BETTER
_HIGHER = eval_metrics.Direction.HIGHER_IS_BETTER


class MLLogListenerThroughputTest(parameterized.TestCase):

  def write_run(self, run, target_metric="loss"):
    """Logs a 10-step run that reaches its target at the eval after step 10.

    Each eval reports a loss (1.5, then 0.5 at the last) and a pass rate
    (0.4, then 0.9); `target_metric` names the one the target is on.
    """
    out = self.create_tempdir().full_path
    config = tiny_configs.tiny_config(
        out, steps=_STEPS, **tiny_configs.MLPERF_SHAPE
    )
    log = mllog_logger.create_mllogger(
        _mlperf(config), f"{out}/mllog.log", process_index=0
    )
    log.cache_clear()
    log.init_start()
    log.submission_info()
    listener = mllog_listener.MLLogListener(
        log,
        _mlperf(config),
        data_parallelism=1,
        config_filename="default.py",
        throughput=run,
    )
    batch = config.global_batch_size
    listener.on_run_start(interface.RunStart(start_step=0, samples=0))
    for step in range(_STEPS):
      listener.on_step(
          interface.StepRecord(
              step=step,
              metrics={"loss": 2.0 / (step + 1)},
              step_time=0.5,
              samples=(step + 1) * batch,
          )
      )
      if (step + 1) % config.eval_interval == 0:
        samples = (step + 1) * batch
        listener.on_eval_start(step, samples)
        last = step + 1 == _STEPS
        listener.on_eval(
            interface.EvalRecord(
                step=step,
                metrics={
                    "loss": eval_metrics.EvalMetric(
                        0.5 if last else 1.5, _LOWER
                    ),
                    "pass_rate": eval_metrics.EvalMetric(
                        0.9 if last else 0.4, _HIGHER
                    ),
                },
                target_metric=target_metric,
                eval_time=0.1,
                samples=samples,
                target_reached=last,
                continues=not last,
            )
        )
    listener.on_run_end(
        interface.RunEnd(interface.RunOutcome.SUCCESS, _STEPS, _STEPS * batch)
    )
    listener.close()
    return log.path

  @parameterized.named_parameters(
      (
          "with_mfu",
          "NVIDIA H200",
          {"samples_per_s", "tokens_per_s", "tflops_per_device", "mfu"},
      ),
      (
          "without_a_peak",
          "cpu",
          {"samples_per_s", "tokens_per_s", "tflops_per_device"},
      ),
  )
  def test_tracked_stats_carry_throughput_and_pass_the_checker(
      self, kind, keys
  ):
    run = throughput.StepThroughput(
        samples_per_step=8,
        tokens_per_step=128,
        flops_per_step=4e12,
        num_devices=2,
        peak_flops_per_device=throughput.peak_flops_per_device(kind),
    )
    path = self.write_run(run)
    stats = [
        e["value"]
        for e in mllog_logger.read_events(path)
        if e["key"] == "tracked_stats" and "train_loss" in e["value"]
    ]
    self.assertLen(stats, _STEPS)
    for value in stats:
      self.assertEqual(set(value), {"train_loss", "step_time", *keys})
    # A 0.5 s step: 16 samples/s, 256 tokens/s, 4 TFLOP/s on each device.
    self.assertEqual(
        (
            stats[0]["samples_per_s"],
            stats[0]["tokens_per_s"],
            stats[0]["tflops_per_device"],
        ),
        (16.0, 256.0, 4.0),
    )
    if "mfu" in keys:
      self.assertAlmostEqual(stats[0]["mfu"], 4e12 / 989e12)
    for ruleset in ("6.1.0", "6.0.0"):
      result = compliance_checker.run_checker(path, ruleset=ruleset)
      self.assertTrue(
          result.passed, f"{ruleset}: {result.messages}\n{result.output}"
      )

  def test_without_throughput_tracked_stats_are_loss_and_time(self):
    path = self.write_run(None)
    stats = [
        e["value"]
        for e in mllog_logger.read_events(path)
        if e["key"] == "tracked_stats" and "train_loss" in e["value"]
    ]
    self.assertEqual(set(stats[0]), {"train_loss", "step_time"})

  @parameterized.named_parameters(
      ("loss", "loss", [1.5, 0.5]), ("pass_rate", "pass_rate", [0.4, 0.9])
  )
  def test_eval_accuracy_is_the_target_metric(self, target_metric, values):
    path = self.write_run(None, target_metric=target_metric)
    self.assertEqual(
        [
            e["value"]
            for e in mllog_logger.read_events(path)
            if e["key"] == "eval_accuracy"
        ],
        values,
    )

  def test_rejects_a_non_throughput(self):
    with self.assertRaisesRegex(TypeError, "throughput must be"):
      mllog_listener.MLLogListener(
          mllog_logger.MLLogger.disabled(),
          mlperf_config.MlperfConfig(),
          data_parallelism=1,
          config_filename="x",
          throughput={"mfu": 1.0},
      )


if __name__ == "__main__":
  absltest.main()
