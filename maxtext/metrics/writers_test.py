"""Tests for maxtext.metrics.writers: real files in temp dirs, a fake clock."""

import glob
import json
import math
import os
import struct

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp
import numpy as np
from tensorboardX.proto import event_pb2

from maxtext.metrics import jsonl
from maxtext.metrics import throughput
from maxtext.metrics import writers as metric_logger


class FakeClock:
  """A clock that advances by a fixed amount each time it is read."""

  def __init__(self, step_seconds: float):
    self.now = 0.0
    self.step_seconds = step_seconds

  def __call__(self) -> float:
    value = self.now
    self.now += self.step_seconds
    return value


def read_events(logdir: str) -> list[event_pb2.Event]:
  """Parses every TFRecord event file under `logdir`, in file name order."""
  events = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset : offset + 8])
      # 8 bytes length, 4 bytes length CRC, payload, 4 bytes payload CRC.
      payload = data[offset + 12 : offset + 12 + length]
      offset += 12 + length + 4
      event = event_pb2.Event()
      event.ParseFromString(payload)
      events.append(event)
  return events


def scalar_events(logdir: str) -> list[tuple[str, int, float]]:
  out = []
  for event in read_events(logdir):
    for value in event.summary.value:
      out.append((value.tag, event.step, value.simple_value))
  return out


def strip_timing(records):
  return [
      {k: v for k, v in r.items() if k not in jsonl.TIMING_KEYS}
      for r in records
  ]


class MetricLoggerTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.run_dir = self.create_tempdir().full_path

  def make_logger(self, clock=None, **kwargs):
    """A primary MetricLogger in self.run_dir, closed at cleanup."""
    args = dict(
        is_primary=True,
        log_period=2,
        total_steps=6,
        tokens_per_step=1000,
        time_fn=clock or FakeClock(0.5),
    )
    args.update(kwargs)
    logger = metric_logger.MetricLogger(self.run_dir, **args)
    self.addCleanup(logger.close)
    return logger

  def assert_closed_logger_wrote(self, logger, expected):
    """Closes `logger`; its TensorBoard events hold every (tag, step, value)
    of `expected`."""
    logger.close()
    self.assertContainsSubset(expected, scalar_events(logger.tensorboard_dir))

  def read_lines(self):
    with open(
        os.path.join(self.run_dir, "metrics.jsonl"), encoding="utf-8"
    ) as f:
      return [json.loads(line) for line in f]

  def test_jsonl_records_with_timing_and_flush_per_write(self):
    logger = self.make_logger(clock=FakeClock(0.5))
    logger.write_train(0, {"loss": 3.0, "learning_rate": 1e-3})
    # Visible before close: every write is flushed.
    self.assertEqual(
        self.read_lines(),
        [
            {
                "step": 0,
                "kind": "train",
                "loss": 3.0,
                "learning_rate": 1e-3,
                "step_time_s": 0.5,
                "tokens_per_s": 2000.0,
            }
        ],
    )
    logger.write_train(1, {"loss": np.float32(2.5), "step_skipped": 0})
    logger.write_eval(1, {"eval_loss": 2.25})
    lines = self.read_lines()
    self.assertLen(lines, 3)
    self.assertEqual(lines[1]["loss"], 2.5)
    self.assertEqual(lines[1]["step_skipped"], 0)
    self.assertIsInstance(lines[1]["step_skipped"], int)
    self.assertEqual(lines[2], {"step": 1, "kind": "eval", "eval_loss": 2.25})

  def test_caller_step_time_replaces_the_clock(self):
    logger = self.make_logger(clock=FakeClock(0.5), log_period=1)
    with self.assertLogs(level="INFO") as logs:
      logger.write_train(0, {"loss": 3.0}, step_time=0.25)
      logger.write_train(1, {"loss": 2.0})  # The clock again: 0.5 s.
    lines = self.read_lines()
    self.assertEqual(
        [(l["step_time_s"], l["tokens_per_s"]) for l in lines],
        [(0.25, 4000.0), (0.5, 2000.0)],
    )
    self.assertIn("step_time 0.250s", logs.records[0].getMessage())

  def test_data_wait_is_recorded_only_when_given(self):
    logger = self.make_logger()
    logger.write_train(0, {"loss": 3.0}, step_time=0.25, data_wait=0.125)
    logger.write_train(1, {"loss": 2.0}, step_time=0.25)
    lines = self.read_lines()
    self.assertEqual(lines[0]["data_wait_s"], 0.125)
    self.assertNotIn("data_wait_s", lines[1])
    self.assert_closed_logger_wrote(logger, [("train/data_wait_s", 0, 0.125)])

  @parameterized.product(
      argument=("step_time", "data_wait"),
      bad=(
          (-1.0, ValueError),
          (float("nan"), ValueError),
          (float("inf"), ValueError),
          ("1", TypeError),
      ),
  )
  def test_bad_durations_write_nothing(self, argument, bad):
    value, error = bad
    logger = self.make_logger()
    with self.assertRaisesRegex(error, argument):
      logger.write_train(0, {"loss": 3.0}, **{argument: value})
    self.assertEqual(self.read_lines(), [])

  def test_accepts_numpy_scalars_and_small_arrays(self):
    logger = self.make_logger()
    logger.write_train(
        0,
        {
            "a": np.int32(7),
            "b": np.array(1.5),
            "c": np.array([2.5], np.float32),
            "d": True,
        },
    )
    record = self.read_lines()[0]
    self.assertEqual(
        (record["a"], record["b"], record["c"], record["d"]), (7, 1.5, 2.5, 1)
    )

  def test_non_finite_values_are_valid_json_strings(self):
    logger = self.make_logger()
    logger.write_train(
        0,
        {
            "loss": float("nan"),
            "grad_norm": np.float32("inf"),
            "other": -math.inf,
        },
    )
    logger.close()
    with open(logger.jsonl_path, encoding="utf-8") as f:
      line = f.readline()

    def reject(constant):
      raise AssertionError(f"bare JSON constant {constant}")

    raw = json.loads(line, parse_constant=reject)
    self.assertEqual(
        (raw["loss"], raw["grad_norm"], raw["other"]),
        ("NaN", "Infinity", "-Infinity"),
    )
    record = jsonl.read_jsonl(logger.jsonl_path)[0]
    self.assertTrue(math.isnan(record["loss"]))
    self.assertEqual(record["grad_norm"], math.inf)
    self.assertEqual(record["other"], -math.inf)

  def test_console_line_every_log_period_and_last_step(self):
    logger = self.make_logger(
        clock=FakeClock(10.0), log_period=2, total_steps=6
    )
    with self.assertLogs(level="INFO") as logs:
      for step in range(6):
        logger.write_train(
            step,
            {"loss": 2.0 - 0.1 * step, "learning_rate": 1e-3, "grad_norm": 0.5},
        )
    lines = [r.getMessage() for r in logs.records if "step " in r.getMessage()]
    self.assertLen(lines, 4)
    self.assertEqual(
        [l.split(" | ")[0] for l in lines],
        ["step 0/6", "step 2/6", "step 4/6", "step 5/6"],
    )
    # Two steps of 10 s since the step-0 line; 3 steps remain after step 2.
    self.assertEqual(
        lines[1],
        "step 2/6 | loss 1.8000 | lr 1.000e-03 | grad_norm 0.500 | "
        "tokens/s 100 | step_time 10.000s | ETA 0:00:30",
    )
    self.assertEndsWith(lines[3], "ETA 0:00:00")

  def test_eval_console_line(self):
    logger = self.make_logger()
    with self.assertLogs(level="INFO") as logs:
      logger.write_eval(4, {"eval_loss": 0.75})
    self.assertIn(
        "eval after step 4 | eval_loss 0.7500",
        [r.getMessage() for r in logs.records],
    )

  def test_tensorboard_scalars(self):
    logger = self.make_logger()
    logger.write_train(0, {"loss": 3.0})
    logger.write_train(1, {"loss": 2.0})
    logger.write_eval(1, {"eval_loss": 2.5})
    self.assert_closed_logger_wrote(
        logger,
        [
            ("train/loss", 0, 3.0),
            ("train/loss", 1, 2.0),
            ("eval/eval_loss", 1, 2.5),
            ("train/tokens_per_s", 0, 2000.0),
        ],
    )

  def test_non_primary_writes_and_opens_nothing(self):
    run_dir = os.path.join(self.run_dir, "not_created")
    logger = metric_logger.MetricLogger(
        run_dir,
        is_primary=False,
        log_period=1,
        total_steps=3,
        tokens_per_step=8,
        time_fn=FakeClock(1.0),
    )
    with self.assertNoLogs(level="INFO"):
      logger.write_train(0, {"loss": 1.0})
      logger.write_eval(0, {"eval_loss": 1.0})
    logger.close()
    self.assertFalse(os.path.exists(run_dir))

  def test_non_primary_still_validates(self):
    logger = self.make_logger(is_primary=False)
    with self.assertRaisesRegex(TypeError, "'loss'"):
      logger.write_train(0, {"loss": "high"})

  def test_resume_matches_uninterrupted_run(self):

    def run(logger, steps):
      for step in steps:
        logger.write_train(step, {"loss": 1.0 / (step + 1)})
        if step % 2 == 1:
          logger.write_eval(step, {"eval_loss": 2.0 / (step + 1)})

    def attempt(run_dir, first_step=0):
      """A logger of one attempt at the same 6-step run in `run_dir`."""
      return metric_logger.MetricLogger(
          run_dir,
          is_primary=True,
          log_period=1,
          total_steps=6,
          tokens_per_step=4,
          first_step=first_step,
          time_fn=FakeClock(1.0),
      )

    full_dir = os.path.join(self.run_dir, "full")
    with attempt(full_dir) as logger:
      run(logger, range(6))

    resumed_dir = os.path.join(self.run_dir, "resumed")
    with attempt(resumed_dir) as logger:
      run(logger, range(5))  # Interrupted after step 4; checkpoint after 3.
    with attempt(resumed_dir, first_step=4) as logger:
      run(logger, range(4, 6))

    full = jsonl.read_jsonl(os.path.join(full_dir, "metrics.jsonl"))
    resumed = jsonl.read_jsonl(os.path.join(resumed_dir, "metrics.jsonl"))
    self.assertLen(full, 9)
    self.assertEqual(strip_timing(resumed), strip_timing(full))
    # TensorBoard: the second attempt's file starts with a purge at step 4.
    events = read_events(os.path.join(resumed_dir, "tensorboard"))
    purges = [
        e.step
        for e in events
        if e.session_log.status == event_pb2.SessionLog.START
    ]
    self.assertIn(4, purges)

  def test_torn_last_line_is_dropped_on_resume(self):
    path = os.path.join(self.run_dir, "metrics.jsonl")
    with open(path, "w", encoding="utf-8") as f:
      f.write('{"step": 0, "kind": "train", "loss": 1.0}\n{"step": 1, "ki')
    logger = self.make_logger(first_step=1)
    logger.write_train(1, {"loss": 0.5})
    logger.close()
    self.assertEqual(
        [(r["step"], r["loss"]) for r in self.read_lines()],
        [(0, 1.0), (1, 0.5)],
    )

  def test_corrupt_middle_line_stops_a_resume(self):
    path = os.path.join(self.run_dir, "metrics.jsonl")
    with open(path, "w", encoding="utf-8") as f:
      f.write(
          '{"step": 0, "kind": "train"}\nnot json\n'
          '{"step": 1, "kind": "eval"}\n'
      )
    with self.assertRaisesRegex(ValueError, "metrics.jsonl:2"):
      self.make_logger(first_step=1)

  def test_close_is_idempotent_and_final(self):
    logger = self.make_logger()
    logger.write_train(0, {"loss": 1.0})
    logger.close()
    logger.close()
    with self.assertRaisesRegex(RuntimeError, "closed"):
      logger.write_train(1, {"loss": 1.0})

  @parameterized.named_parameters(
      ("zero_log_period", dict(log_period=0), ValueError, "log_period"),
      ("float_total_steps", dict(total_steps=2.0), TypeError, "total_steps"),
      (
          "negative_tokens",
          dict(tokens_per_step=-1),
          ValueError,
          "tokens_per_step",
      ),
      ("negative_first_step", dict(first_step=-1), ValueError, "first_step"),
      ("bool_log_period", dict(log_period=True), TypeError, "log_period"),
      ("clock_not_callable", dict(time_fn=3.0), TypeError, "time_fn"),
  )
  def test_bad_constructor_arguments(self, override, error, regex):
    with self.assertRaisesRegex(error, regex):
      self.make_logger(**override)

  @parameterized.named_parameters(
      ("negative_step", -1, {"loss": 1.0}, ValueError, "step"),
      ("bool_step", True, {"loss": 1.0}, TypeError, "step"),
      (
          "device_array",
          0,
          {"loss": jnp.float32(1.0)},
          TypeError,
          "'loss'.*device_get",
      ),
      ("vector", 0, {"loss": np.ones(2)}, TypeError, "'loss'"),
      ("string_value", 0, {"loss": "1.0"}, TypeError, "'loss'"),
      ("reserved_name", 0, {"kind": 1.0}, ValueError, "'kind'"),
      ("timing_name", 0, {"step_time_s": 1.0}, ValueError, "'step_time_s'"),
      ("data_wait_name", 0, {"data_wait_s": 1.0}, ValueError, "'data_wait_s'"),
      ("throughput_name", 0, {"mfu": 0.5}, ValueError, "'mfu'"),
      ("empty_name", 0, {"": 1.0}, TypeError, "non-empty"),
  )
  def test_bad_writes_raise_and_write_nothing(
      self, step, scalars, error, regex
  ):
    logger = self.make_logger()
    with self.assertRaisesRegex(error, regex):
      logger.write_train(step, scalars)
    self.assertEqual(self.read_lines(), [])

  def test_throughput_figures_in_jsonl_tensorboard_and_console(self):
    # 1000 tokens in 4 samples, 8e12 FLOPs over 2 devices of 4e12 FLOP/s peak:
    # a 0.5 s step is 8 samples/s, 2000 tokens/s, 8 TFLOP/s per device and
    # an MFU of 2 (a fake peak; the figures are what is checked).
    run = throughput.StepThroughput(
        samples_per_step=4,
        tokens_per_step=1000,
        flops_per_step=8e12,
        num_devices=2,
        peak_flops_per_device=4e12,
    )
    logger = self.make_logger(
        clock=FakeClock(0.5), log_period=1, throughput=run
    )
    with self.assertLogs(level="INFO") as logs:
      logger.write_train(0, {"loss": 3.0})
      logger.write_train(1, {"loss": 2.0}, step_time=0.25)
    self.assertEqual(
        self.read_lines(),
        [
            {
                "step": 0,
                "kind": "train",
                "loss": 3.0,
                "step_time_s": 0.5,
                "samples_per_s": 8.0,
                "tokens_per_s": 2000.0,
                "tflops_per_device": 8.0,
                "mfu": 2.0,
            },
            {
                "step": 1,
                "kind": "train",
                "loss": 2.0,
                "step_time_s": 0.25,
                "samples_per_s": 16.0,
                "tokens_per_s": 4000.0,
                "tflops_per_device": 16.0,
                "mfu": 4.0,
            },
        ],
    )
    self.assertEqual(
        logs.records[0].getMessage(),
        "step 0/6 | loss 3.0000 | tokens/s 2,000 | samples/s 8.0 | "
        "TFLOP/s/device 8 | MFU 200.0% | step_time 0.500s | ETA 0:00:02",
    )
    self.assert_closed_logger_wrote(
        logger,
        [
            ("train/samples_per_s", 1, 16.0),
            ("train/tokens_per_s", 1, 4000.0),
            ("train/tflops_per_device", 1, 16.0),
            ("train/mfu", 1, 4.0),
        ],
    )

  def test_no_mfu_where_the_peak_is_unknown(self):
    run = throughput.StepThroughput(
        samples_per_step=2,
        tokens_per_step=1000,
        flops_per_step=3e9,
        num_devices=1,
    )
    logger = self.make_logger(clock=FakeClock(0.5), throughput=run)
    with self.assertLogs(level="INFO") as logs:
      logger.write_train(0, {"loss": 3.0})
    record = self.read_lines()[0]
    self.assertNotIn("mfu", record)
    self.assertEqual(
        (record["samples_per_s"], record["tflops_per_device"]), (4.0, 0.006)
    )
    line = logs.records[0].getMessage()
    self.assertIn("| samples/s 4.0 | TFLOP/s/device 0.006 | step_time", line)
    self.assertNotIn("MFU", line)

  def test_figure_names_follow_the_jsonl_schema(self):
    self.assertEqual(
        throughput.TOKENS_PER_SECOND_KEY, jsonl.TOKENS_PER_SECOND_KEY
    )

  @parameterized.named_parameters(
      (
          "other_tokens",
          dict(tokens_per_step=999),
          ValueError,
          r"throughput.tokens_per_step \(1000\) must equal",
      ),
      (
          "not_a_step_throughput",
          dict(throughput={"mfu": 1.0}),
          TypeError,
          "throughput must be",
      ),
  )
  def test_bad_throughput(self, override, error, regex):
    run = throughput.StepThroughput(1, 1000, 1.0, 1)
    with self.assertRaisesRegex(error, regex):
      self.make_logger(**{"throughput": run, **override})

  @parameterized.named_parameters(
      ("no_eval_prefix", {"loss": 1.0}, "'loss' must start with 'eval_'"),
      ("one_of_two_unprefixed", {"eval_loss": 1.0, "time": 0.5}, "'time'"),
  )
  def test_eval_names_need_the_schema_prefix(self, scalars, regex):
    for is_primary in (True, False):
      logger = self.make_logger(is_primary=is_primary)
      with self.assertRaisesRegex(ValueError, regex):
        logger.write_eval(0, scalars)
    self.assertEqual(self.read_lines(), [])


if __name__ == "__main__":
  absltest.main()
