"""Tests for maxtext.mllog.deferred_log: a deferred run's log, then closed.

The MLPerf listener is driven through a 10-step deferred_eval run (events as
the trainer sends them, times from a fake clock) into a real log file; the
log is read back, closed with evaluations, and judged by the official
compliance checker.
"""

import itertools
import math
import os

from absl.testing import absltest

from maxtext.listeners import interface
from maxtext.mllog import deferred_log
from maxtext.mllog import logger as mllog_logger
from maxtext.mllog import mllog_listener
from maxtext.mllog import mlperf_config
from testing import compliance_checker
from testing import tiny_configs


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


_STEPS = 10
_START = 1.7e9  # The fake clock's first reading, seconds since the epoch.


class DeferredLogTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.batch = 0  # The run's global batch, once written.

  def write_training(self, outcome=interface.RunOutcome.COMPLETED):
    """Logs a deferred_eval run of 10 steps: points after steps 5 and 10.

    Returns:
      (the log's path, the points' update times in seconds).
    """
    out = self.create_tempdir().full_path
    config = tiny_configs.tiny_config(
        out, steps=_STEPS, deferred_eval=True, **tiny_configs.MLPERF_SHAPE
    )
    self.batch = config.global_batch_size
    clock = itertools.count(_START, 1.0)
    log = mllog_logger.create_mllogger(
        _mlperf(config),
        os.path.join(out, "mllog.log"),
        process_index=0,
        time_fn=lambda: next(clock),
    )
    log.cache_clear()
    log.init_start()
    log.submission_info()
    listener = mllog_listener.MLLogListener(
        log, _mlperf(config), data_parallelism=1, config_filename="default.py"
    )
    listener.on_run_start(interface.RunStart(start_step=0, samples=0))
    update_times = []
    for step in range(_STEPS):
      samples = (step + 1) * self.batch
      listener.on_step(interface.StepRecord(step, {"loss": 1.0}, 0.5, samples))
      if (step + 1) % config.eval_interval == 0:
        # Between two clock readings, not on a whole millisecond.
        update_times.append(_START + 100 * step + 0.0004)
        listener.on_eval_deferred(
            interface.DeferredEval(
                step, samples, "/ckpt", update_time=update_times[-1]
            )
        )
    if outcome is not None:
      listener.on_run_end(
          interface.RunEnd(outcome, _STEPS, _STEPS * self.batch)
      )
    listener.close()
    return log.path, update_times

  def evaluation(self, point, value, reached, start=_START + 5000):
    return deferred_log.Evaluation(
        point=point,
        value=value,
        reached=reached,
        start_time=start,
        stop_time=start + 2.5,
    )

  def test_the_training_log_awaits_its_evaluation(self):
    path, update_times = self.write_training()
    events = mllog_logger.read_events(path)
    keys = [e["key"] for e in events]
    self.assertNotIn("run_stop", keys)
    self.assertNotIn("eval_accuracy", keys)
    self.assertNotIn("eval_start", keys)
    points = [e for e in events if e["key"] == deferred_log.POINT_KEY]
    self.assertEqual([p["value"] for p in points], [5, 10])
    self.assertEqual(
        [p["metadata"]["samples_count"] for p in points],
        [5 * self.batch, 10 * self.batch],
    )
    # Rounded up: never before the update finished.
    self.assertEqual(
        [p["metadata"]["update_time_ms"] for p in points],
        [math.ceil(t * 1e3) for t in update_times],
    )
    self.assertEqual(keys[-2:], ["block_stop", deferred_log.PENDING_KEY])
    self.assertEqual(
        events[-1]["metadata"]["samples_count"], _STEPS * self.batch
    )
    self.assertEqual(events[-1]["metadata"]["step"], _STEPS)

    pending = deferred_log.read(path)
    self.assertEqual(pending.path, path)
    self.assertEqual(
        pending.points,
        tuple(
            deferred_log.Point(step, step * self.batch, math.ceil(t * 1e3))
            for step, t in zip((5, 10), update_times)
        ),
    )
    self.assertEqual(pending.end_samples, _STEPS * self.batch)
    self.assertEqual(pending.end_time_ms, events[-1]["time_ms"])

  def test_success_closes_the_log_at_the_passing_update_time(self):
    path, _ = self.write_training()
    pending = deferred_log.read(path)
    first, second = pending.points
    status = deferred_log.append(
        pending,
        [
            self.evaluation(first, 1.5, False),
            self.evaluation(second, 0.5, True, start=_START + 6000),
        ],
    )
    self.assertEqual(status, "success")
    events = mllog_logger.read_events(path)
    appended = events[
        [e["key"] for e in events].index(deferred_log.PENDING_KEY) + 1 :
    ]
    self.assertEqual(
        [e["key"] for e in appended],
        ["eval_start", "eval_accuracy", "eval_stop", "tracked_stats"] * 2
        + ["run_stop"],
    )
    accuracy = [e for e in appended if e["key"] == "eval_accuracy"]
    self.assertEqual([e["value"] for e in accuracy], [1.5, 0.5])
    self.assertEqual(
        [e["metadata"]["samples_count"] for e in accuracy],
        [first.samples, second.samples],
    )
    # Each eval line is dated when the evaluation happened.
    self.assertEqual(appended[0]["time_ms"], int((_START + 5000) * 1e3))
    self.assertEqual(accuracy[1]["time_ms"], int((_START + 6002.5) * 1e3))
    self.assertEqual(
        [
            e["metadata"]["step"]
            for e in appended
            if e["key"] == "tracked_stats"
        ],
        [5, 10],
    )
    stop = appended[-1]
    self.assertEqual(stop["time_ms"], second.update_time_ms)
    self.assertEqual(stop["metadata"]["status"], "success")
    self.assertEqual(stop["metadata"]["samples_count"], second.samples)
    self.assertIs(stop["metadata"]["deferred_eval"], True)
    self.assertEqual(stop["metadata"]["checkpoint_step"], 10)
    # The closed log is a compliant one: the deferred structure passes.
    for ruleset in ("6.1.0", "6.0.0"):
      result = compliance_checker.run_checker(path, ruleset=ruleset)
      self.assertTrue(
          result.passed, f"{ruleset}: {result.messages}\n{result.output}"
      )
    # And it is closed: nothing is appended twice.
    with self.assertRaisesRegex(
        deferred_log.LogError, "already closed .run_stop 'success'"
    ):
      deferred_log.read(path)

  def test_evaluations_stop_at_the_first_that_passes(self):
    path, _ = self.write_training()
    pending = deferred_log.read(path)
    first, second = pending.points
    deferred_log.append(
        pending,
        [self.evaluation(first, 0.5, True), self.evaluation(second, 0.4, True)],
    )
    events = mllog_logger.read_events(path)
    self.assertEqual(
        [e["value"] for e in events if e["key"] == "eval_accuracy"], [0.5]
    )
    self.assertEqual(events[-1]["time_ms"], first.update_time_ms)

  def test_none_passing_is_aborted_at_the_training_end(self):
    path, _ = self.write_training()
    pending = deferred_log.read(path)
    status = deferred_log.append(
        pending, [self.evaluation(p, 1.5, False) for p in pending.points]
    )
    self.assertEqual(status, "aborted")
    stop = mllog_logger.read_events(path)[-1]
    self.assertEqual(stop["key"], "run_stop")
    self.assertEqual(stop["time_ms"], pending.end_time_ms)
    self.assertEqual(stop["metadata"]["status"], "aborted")
    self.assertEqual(stop["metadata"]["samples_count"], _STEPS * self.batch)
    self.assertIsNone(stop["metadata"]["checkpoint_step"])

  def test_an_interrupted_training_closes_its_log_aborted(self):
    path, _ = self.write_training(interface.RunOutcome.INTERRUPTED)
    with self.assertRaisesRegex(deferred_log.LogError, "already closed"):
      deferred_log.read(path)

  def test_an_unfinished_training_is_refused(self):
    path, _ = self.write_training(outcome=None)  # Killed: no run end.
    with self.assertRaisesRegex(
        deferred_log.LogError, "has no deferred_eval_pending event"
    ):
      deferred_log.read(path)

  def test_a_log_without_points_is_refused(self):
    path = os.path.join(self.create_tempdir().full_path, "mllog.log")
    with open(path, "w", encoding="utf-8") as f:
      f.write(':::MLLOG {"key": "run_start", "value": null, "metadata": {}}\n')
    with self.assertRaisesRegex(
        deferred_log.LogError, "not trained with deferred_eval=True"
    ):
      deferred_log.read(path)
    with self.assertRaisesRegex(deferred_log.LogError, "no MLPerf log"):
      deferred_log.read(path + ".missing")

  def _edited(self, edit) -> str:
    """A finished training's log with its :::MLLOG lines edited."""
    path, _ = self.write_training()
    with open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(edit(lines)) + "\n")
    return path

  def test_events_out_of_order_are_refused(self):
    def run_start_last(lines):
      (start,) = [l for l in lines if '"run_start"' in l]
      return [l for l in lines if l != start] + [start]

    def point_after_the_end(lines):
      point = [l for l in lines if deferred_log.POINT_KEY in l][-1]
      return [l for l in lines if l != point] + [point]

    for edit, expected in (
        (run_start_last, "comes before run_start"),
        (point_after_the_end, "comes after deferred_eval_pending"),
        (lambda lines: lines + [l for l in lines if '"run_start"' in l],
         "has 2 run_start events"),
    ):  # fmt: skip
      with self.assertRaisesRegex(deferred_log.LogError, expected):
        deferred_log.read(self._edited(edit))

  def test_malformed_events_are_refused_in_one_line(self):
    def without_metadata(lines):
      return [
          l.replace('"metadata"', '"elsewhere"')
          if deferred_log.POINT_KEY in l
          else l
          for l in lines
      ]

    for edit, expected in (
        (without_metadata, "samples_count is None, not an integer"),
        (lambda lines: lines + [":::MLLOG {cut"], "is not JSON"),
        (lambda lines: lines + [":::MLLOG [1]"], "not a JSON object"),
    ):
      with self.assertRaisesRegex(deferred_log.LogError, expected):
        deferred_log.read(self._edited(edit))


if __name__ == "__main__":
  absltest.main()
