"""Tests for mllog_utils: our logs, judged by the official checker."""

import errno
import json
import logging as std_logging
import os
import re
import threading

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp
from mlperf_logging.mllog import constants as mllog_constants
from mlperf_logging.mllog import mllog as official_mllog
import numpy as np

from maxtext.configs import default
from maxtext.configs import llama31_8b
from maxtext.mllog import header_proof
from maxtext.mllog import hyperparameters
from maxtext.mllog import logger as mllog_utils
from maxtext.mllog import mlperf_config
from maxtext.storage import build_info
from testing import bad_submissions
from testing import compliance_checker


def _config(**overrides):
  """The default config (open llama31_8b log on) with a fake run's budget.

  `_fake_eval_losses` falls below 1.0 at about step 16, so a run of 24 steps
  reaches the open rule's target at its evaluation of step 20.
  """
  config = default.get_config()
  config.steps = 24
  config.update(overrides)
  return mlperf_config.MlperfConfig.from_config(config)


def _hparams(config, start_step=0):
  """The hyperparameters a run of `config` logs (what its listener logs)."""
  return hyperparameters.run_hyperparameters(
      config,
      data_parallelism=1,
      start_step=start_step,
      config_filename="configs/test.py",
  )


def _fake_eval_losses(config):
  """Trains a one-parameter model with SGD; returns eval loss per eval step.

  The model predicts a token distribution's log-partition offset `w`; the
  loss in nats is 0.4 + (w - 1)^2, so it falls below 1.0 as `w` learns.
  """
  rng = np.random.default_rng(config.seed)
  w = -1.0
  losses = {}
  for step in range(1, config.steps + 1):
    batch = 1.0 + 0.05 * rng.standard_normal(config.global_batch_size)
    w -= 0.03 * np.mean(2 * (w - batch))
    if step % config.eval_interval == 0:
      losses[step] = 0.4 + (w - 1.0) ** 2
  return losses


def _header(logger, hparams):
  """Logs what a run logs before run_start: init, submission, `hparams`."""
  logger.cache_clear()
  logger.init_start()
  logger.submission_info()
  logger.hyperparameters(hparams)
  logger.init_stop()


def _write_run(logger, config, target, first_step=1):
  """Logs a whole fake run; returns the run_stop status."""
  _header(logger, _hparams(config, start_step=first_step - 1))
  losses = _fake_eval_losses(config)
  batch = config.global_batch_size
  logger.run_start()
  logger.block_start((first_step - 1) * batch)
  for step in range(first_step, config.steps + 1):
    samples = step * batch
    logger.tracked_stats(
        step, {"train_loss": np.float32(1.5 / step), "step_time_s": 0.01}
    )
    if step in losses:
      logger.block_stop(samples)
      logger.eval_start(samples)
      logger.eval_accuracy(losses[step], samples)
      logger.eval_stop(samples)
      logger.tracked_stats(step, {"validation_time_s": 0.002})
      if losses[step] < target:
        logger.run_stop(mllog_utils.SUCCESS, samples)
        return mllog_utils.SUCCESS
      if step < config.steps:
        logger.block_start(samples)
  logger.run_stop(mllog_utils.ABORTED, config.steps * batch)
  return mllog_utils.ABORTED


def _read_events(path):
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  for line in lines:
    assert line.startswith(mllog_utils.LINE_PREFIX), line
  return [json.loads(l[len(mllog_utils.LINE_PREFIX) :]) for l in lines]


def _all_handlers():
  """Handlers on every logger that exists, by logger name."""
  names = [""] + sorted(std_logging.Logger.manager.loggerDict)
  handlers = {}
  for name in names:
    logger = std_logging.getLogger(name)
    handlers[name] = list(getattr(logger, "handlers", []))
  return handlers


class MllogUtilsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path

  @parameterized.named_parameters(
      ("ruleset_6_1_0", "6.1.0"), ("ruleset_6_0_0", "6.0.0")
  )
  def test_successful_run_passes_official_checker(self, ruleset):
    config = _config(mllog_ruleset=ruleset)
    logger = mllog_utils.create_mllogger(
        config, os.path.join(self.dir, "mllog.log"), process_index=0
    )
    status = _write_run(logger, config, target=1.0)
    logger.close()
    self.assertEqual(status, mllog_utils.SUCCESS)

    result = compliance_checker.run_checker(logger.path, ruleset=ruleset)
    self.assertTrue(result.passed, result.output)
    self.assertEqual(result.returncode, 0)

    events = _read_events(logger.path)
    stops = [e for e in events if e["key"] == "run_stop"]
    self.assertLen(stops, 1)
    self.assertEqual(stops[0]["metadata"]["status"], "success")
    by_key = {e["key"]: e["value"] for e in events}
    self.assertEqual(
        by_key["opt_learning_rate_warmup_steps"],
        config.optimizer.warmup_steps,
    )
    self.assertEqual(
        by_key["opt_learning_rate_decay_steps"],
        config.steps - config.optimizer.warmup_steps,
    )
    counts = [
        e["metadata"]["samples_count"]
        for e in events
        if "samples_count" in e["metadata"]
    ]
    self.assertEqual(counts, sorted(counts))
    starts = sum(e["key"] == "block_start" for e in events)
    self.assertEqual(starts, sum(e["key"] == "block_stop" for e in events))

  def test_aborted_run_passes_official_checker(self):
    config = _config()
    logger = mllog_utils.create_mllogger(
        config, os.path.join(self.dir, "mllog.log"), process_index=0
    )
    # No fake eval loss reaches 0.1, so the step budget ends the run.
    status = _write_run(logger, config, target=0.1)
    logger.close()
    self.assertEqual(status, mllog_utils.ABORTED)
    result = compliance_checker.run_checker(logger.path, ruleset="6.1.0")
    self.assertTrue(result.passed, result.output)
    stops = [e for e in _read_events(logger.path) if e["key"] == "run_stop"]
    self.assertEqual([s["metadata"]["status"] for s in stops], ["aborted"])
    self.assertEqual(
        stops[0]["metadata"]["samples_count"],
        config.steps * config.global_batch_size,
    )

  def _logger_at_first_eval(self):
    """A logger whose run trained one block of 8 samples and began an eval."""
    config = _config()
    logger = mllog_utils.create_mllogger(
        config, os.path.join(self.dir, "mllog.log"), process_index=0
    )
    _header(logger, _hparams(config))
    logger.run_start()
    logger.block_start(0)
    logger.block_stop(8)
    logger.eval_start(8)
    return logger

  def test_missing_run_stop_fails_checker(self):
    logger = self._logger_at_first_eval()
    logger.eval_accuracy(0.5, 8)
    logger.eval_stop(8)
    logger.close()
    result = compliance_checker.run_checker(logger.path)
    self.assertFalse(result.passed)
    self.assertEqual(result.returncode, 1)
    self.assertIn("run_stop", result.failed_keys())

  def test_eval_accuracy_without_samples_count_fails_checker(self):
    logger = self._logger_at_first_eval()
    logger.event("eval_accuracy", 0.5)  # Broken on purpose: no samples_count.
    logger.eval_stop(8)
    logger.run_stop(mllog_utils.SUCCESS, 8)
    logger.close()
    result = compliance_checker.run_checker(logger.path)
    self.assertFalse(result.passed)
    self.assertIn("eval_accuracy", result.failed_keys())

  def test_closed_rules_judge_decay_steps(self):
    # The closed llama31_8b config's real header; the rule's numbers live
    # only in the config, never in an assertion.
    config = mlperf_config.MlperfConfig.from_config(llama31_8b.get_config())
    hparams = header_proof.fresh_run_header(config, "llama31_8b.py")
    hparam_keys = set(mllog_utils.REQUIRED_HYPERPARAMETERS)

    def check(decay_delta):
      values = dict(hparams)
      values["opt_learning_rate_decay_steps"] += decay_delta
      path = os.path.join(self.dir, f"closed{decay_delta}.log")
      logger = mllog_utils.create_mllogger(config, path, process_index=0)
      _header(logger, values)
      # Synthetic run events: nobody trains this model on a CPU.
      logger.run_start()
      logger.block_start(0)
      logger.block_stop(1024)
      logger.eval_start(1024)
      logger.eval_accuracy(3.0, 1024)
      logger.eval_stop(1024)
      logger.run_stop(mllog_utils.SUCCESS, 1024)
      logger.close()
      return compliance_checker.run_checker(path, ruleset="6.1.0")

    right = check(0)
    self.assertTrue(right.passed, right.output)
    self.assertEmpty(right.failed_keys() & hparam_keys)
    wrong = check(1)
    self.assertFalse(wrong.passed)
    self.assertIn("opt_learning_rate_decay_steps", wrong.failed_keys())

  def test_process_one_writes_nothing(self):
    config = _config()
    logger = mllog_utils.create_mllogger(
        config, os.path.join(self.dir, "mllog.log"), process_index=1
    )
    self.assertFalse(logger.enabled)
    _write_run(logger, config, target=1.0)
    self.assertFalse(logger.run_stop(mllog_utils.ABORTED))
    logger.close()
    self.assertEqual(os.listdir(self.dir), [])
    self.assertIsNone(logger.path)

  def test_disabled_config_makes_no_file_and_no_thread(self):
    threads = threading.active_count()
    config = _config(enable_mllog=False, submission_division="not checked")
    logger = mllog_utils.create_mllogger(
        config, os.path.join(self.dir, "mllog.log"), process_index=0
    )
    self.assertFalse(logger.enabled)
    _write_run(logger, _config(enable_mllog=False), target=1.0)
    self.assertEqual(os.listdir(self.dir), [])
    self.assertEqual(threading.active_count(), threads)

  def test_two_loggers_keep_files_apart_and_leave_no_handlers(self):
    handlers_before = _all_handlers()
    config = _config()
    a = mllog_utils.create_mllogger(
        config, os.path.join(self.dir, "a", "mllog.log"), process_index=0
    )
    b = mllog_utils.create_mllogger(
        config, os.path.join(self.dir, "b", "mllog.log"), process_index=0
    )
    a.cache_clear()
    b.cache_clear()
    a.tracked_stats(1, {"run": "a"})
    b.tracked_stats(1, {"run": "b"})
    b.tracked_stats(2, {"run": "b"})
    a.run_start()
    a.run_stop(mllog_utils.ABORTED, 0)
    a.close()
    b.close()
    events_a = _read_events(a.path)
    events_b = _read_events(b.path)
    self.assertEqual(
        [e["key"] for e in events_a],
        ["cache_clear", "tracked_stats", "run_start", "run_stop"],
    )
    self.assertEqual(
        [e["key"] for e in events_b],
        ["cache_clear", "tracked_stats", "tracked_stats"],
    )
    self.assertEqual(
        {e["value"]["run"] for e in events_b if e["key"] == "tracked_stats"},
        {"b"},
    )
    self.assertEqual(_all_handlers(), handlers_before)

  @parameterized.named_parameters(
      ("under_a_file", "not_a_dir/run/mllog.log", "Not a directory"),
      ("name_too_long", "x" * 300 + ".log", "File name too long"),
  )
  def test_uncreatable_file_is_a_config_error(self, relative, os_error):
    with open(os.path.join(self.dir, "not_a_dir"), "w", encoding="utf-8") as f:
      f.write("a file where the log directory should be")
    path = os.path.join(self.dir, relative)
    config = _config(mllog_file=path)
    with self.assertRaisesRegex(
        ValueError,
        r"^config\.mllog_file='.*': the MLPerf log "
        f"{re.escape(path)} cannot be created: {os_error}$",
    ):
      mllog_utils.create_mllogger(config, path, process_index=0)
    self.assertEqual(os.listdir(self.dir), ["not_a_dir"])

  def test_write_failure_is_raised_naming_the_log(self):
    # /dev/full fails every write with a real ENOSPC.
    self.assertTrue(os.path.exists("/dev/full"), "the test needs /dev/full")
    logger = mllog_utils.MLLogger(
        # The logger holds the file for its life, as create_mllogger's does.
        open(  # pylint: disable=consider-using-with
            "/dev/full", "w", encoding="utf-8"
        ),
        "/dev/full",
    )
    with self.assertRaises(OSError) as raised:
      logger.run_start()
    self.assertEqual(raised.exception.errno, errno.ENOSPC)
    self.assertEqual(raised.exception.filename, "/dev/full")
    self.assertRegex(
        str(raised.exception),
        r"^\[Errno 28\] No space left on device: '/dev/full'$",
    )
    # The log is lost from there on: later events, run_stop and close do
    # nothing and raise nothing.
    self.assertFalse(logger.enabled)
    logger.block_start(8)
    self.assertFalse(logger.run_stop(mllog_utils.ABORTED, 8))
    logger.close()

  def test_run_stop_is_written_once(self):
    logger = mllog_utils.create_mllogger(
        _config(), os.path.join(self.dir, "mllog.log"), process_index=0
    )
    logger.run_start()
    logger.block_start(0)
    self.assertTrue(logger.run_stop(mllog_utils.ABORTED, 16))
    self.assertFalse(logger.run_stop(mllog_utils.SUCCESS, 16))
    logger.close()
    keys = [e["key"] for e in _read_events(logger.path)]
    self.assertEqual(
        keys, ["run_start", "block_start", "block_stop", "run_stop"]
    )
    with self.assertRaisesRegex(ValueError, "status.*'done'"):
      logger.run_stop("done")

  def test_resumed_attempt_writes_a_new_complete_file(self):
    config = _config()
    base = os.path.join(self.dir, "mllog.log")
    first = mllog_utils.create_mllogger(config, base, process_index=0)
    _header(first, _hparams(config))
    first.run_start()
    first.block_start(0)
    first.close()  # The first attempt crashed without run_stop.
    second = mllog_utils.create_mllogger(config, base, process_index=0)
    _write_run(second, config, target=1.0, first_step=7)
    second.close()
    self.assertEqual(first.path, base)
    self.assertEqual(second.path, os.path.join(self.dir, "mllog.2.log"))
    self.assertEqual(mllog_utils.attempt_paths(base), [first.path, second.path])
    self.assertEqual(
        mllog_utils.next_attempt_path(base),
        os.path.join(self.dir, "mllog.3.log"),
    )
    events = _read_events(second.path)
    self.assertEqual(events[0]["key"], "cache_clear")
    by_key = {e["key"]: e for e in events}
    self.assertEqual(by_key["init_checkpoint_step"]["value"], 6)
    self.assertEqual(
        [
            e["metadata"]["samples_count"]
            for e in events
            if e["key"] == "block_start"
        ][0],
        6 * config.global_batch_size,
    )
    result = compliance_checker.run_checker(second.path)
    self.assertTrue(result.passed, result.output)

  def test_lines_match_the_official_encoding(self):
    logger = mllog_utils.create_mllogger(
        _config(),
        os.path.join(self.dir, "mllog.log"),
        process_index=0,
        time_fn=lambda: 1700000000.1234,
    )
    logger.eval_accuracy(np.float64(0.75), np.int64(40))
    logger.tracked_stats(3, {"train_loss": np.float32(0.5), "step": 3})
    logger.close()
    with open(logger.path, encoding="utf-8") as f:
      lines = f.read().splitlines()
    self.assertLen(lines, 2)
    for line in lines:
      record = json.loads(line[len(mllog_utils.LINE_PREFIX) :])
      self.assertEqual(record["metadata"]["file"], __file__)
      # The official logger's line encoder, to compare with; it is not public.
      official = official_mllog._encode_log(  # pylint: disable=protected-access
          record["namespace"],
          record["time_ms"],
          record["event_type"],
          record["key"],
          record["value"],
          record["metadata"],
      )
      self.assertEqual(line, official)
      self.assertEqual(record["time_ms"], 1700000000123)

  @parameterized.named_parameters(
      (
          "bool_samples",
          lambda l: l.block_start(True),
          TypeError,
          "samples_count",
      ),
      (
          "float_samples",
          lambda l: l.eval_start(8.0),
          TypeError,
          "samples_count",
      ),
      (
          "negative_samples",
          lambda l: l.eval_stop(-1),
          ValueError,
          "samples_count",
      ),
      ("bool_step", lambda l: l.tracked_stats(False, {}), TypeError, "step"),
      (
          "bool_accuracy",
          lambda l: l.eval_accuracy(True, 8),
          TypeError,
          "eval_accuracy",
      ),
      (
          "bool_epoch_count",
          lambda l: l.block_start(8, epoch_count=True, first_epoch_num=0),
          TypeError,
          "epoch_count",
      ),
  )
  def test_counts_reject_bools_and_bad_values(self, call, error, pattern):
    logger = mllog_utils.create_mllogger(
        _config(), os.path.join(self.dir, "mllog.log"), process_index=0
    )
    with self.assertRaisesRegex(error, pattern):
      call(logger)
    logger.close()

  @parameterized.named_parameters(
      ("bool_count", "micro_batch_size", True, TypeError),
      ("float_count", "max_steps", 24.0, TypeError),
      ("zero_parallelism", "tensor_parallelism", 0, ValueError),
      ("negative_count", "eval_samples", -1, ValueError),
      (
          "unknown_precision",
          "lowest_numerical_precision_in_attn",
          "fp7",
          ValueError,
      ),
      ("empty_name", "config_filename", "", ValueError),
  )
  def test_hyperparameters_reject_a_value_of_the_wrong_kind(
      self, key, value, error
  ):
    config = _config()
    values = _hparams(config) | {key: value}
    logger = mllog_utils.create_mllogger(
        config, os.path.join(self.dir, "mllog.log"), process_index=0
    )
    with self.assertRaisesRegex(
        error, f"hyperparameter {key} .*{re.escape(repr(value))}$"
    ):
      logger.hyperparameters(values)
    logger.close()
    # Checked before the first line: the header is all or nothing.
    self.assertEqual(_read_events(logger.path), [])

  def test_tracked_stats_rejects_device_arrays(self):
    logger = mllog_utils.create_mllogger(
        _config(), os.path.join(self.dir, "mllog.log"), process_index=0
    )
    with self.assertRaisesRegex(TypeError, "train_loss"):
      logger.tracked_stats(1, {"train_loss": jnp.asarray(1.0)})
    logger.close()

  @parameterized.named_parameters(*bad_submissions.CASES)
  def test_bad_submission_field_is_a_config_error(self, field, value):
    config = _config(**{field: value})
    pattern = f"{field}.*{re.escape(repr(value))}"
    with self.assertRaisesRegex(ValueError, pattern):
      mllog_utils.create_mllogger(
          config, os.path.join(self.dir, "m.log"), process_index=0
      )
    self.assertEqual(os.listdir(self.dir), [])

  def test_platform_event_names_the_revision_and_the_checker_passes(self):
    build = build_info.BuildInfo("ab" * 20 + "+dirty", "stamped", "2025")
    config = _config(submission_platform="cpu-1x")
    logger = mllog_utils.create_mllogger(
        config,
        os.path.join(self.dir, "mllog.log"),
        process_index=0,
        build=build,
    )
    _write_run(logger, config, target=1.0)
    logger.close()

    result = compliance_checker.run_checker(logger.path, ruleset="6.1.0")
    self.assertTrue(result.passed, result.output)
    self.assertEmpty(result.messages, result.output)
    events = _read_events(logger.path)
    named = [e for e in events if "git_revision" in e["metadata"]]
    self.assertEqual([e["key"] for e in named], ["submission_platform"])
    self.assertEqual(named[0]["value"], "cpu-1x")
    self.assertEqual(named[0]["metadata"]["git_revision"], "ab" * 20 + "+dirty")
    self.assertEqual(named[0]["metadata"]["git_revision_source"], "stamped")

  def test_default_revision_is_this_programs(self):
    logger = mllog_utils.create_mllogger(
        _config(), os.path.join(self.dir, "mllog.log"), process_index=0
    )
    logger.submission_info()
    logger.close()
    (event,) = [
        e
        for e in _read_events(logger.path)
        if e["key"] == mllog_utils.REVISION_EVENT
    ]
    # Git may move between two asks in a shared checkout: the form and the
    # source are what this checks, the value is build_info's own test.
    self.assertRegex(
        event["metadata"][mllog_utils.REVISION_METADATA],
        r"^([0-9a-f]{40}(\+dirty)?|unknown)$",
    )
    self.assertIn(
        event["metadata"]["git_revision_source"],
        (
            build_info.SOURCE_STAMPED,
            build_info.SOURCE_GIT,
            build_info.SOURCE_UNKNOWN,
        ),
    )

  def test_a_build_that_is_not_build_info_is_refused_before_the_file(self):
    with self.assertRaisesRegex(TypeError, "build must be a build_info"):
      mllog_utils.create_mllogger(
          _config(),
          os.path.join(self.dir, "m.log"),
          process_index=0,
          build={"git_revision": "unknown"},
      )
    self.assertEqual(os.listdir(self.dir), [])

  def test_key_names_match_official_constants(self):
    official = {v for k, v in vars(mllog_constants).items() if k.isupper()}
    self.assertContainsSubset(
        set(mllog_utils.REQUIRED_HYPERPARAMETERS), official
    )
    self.assertContainsSubset(
        {
            mllog_utils.SUCCESS,
            mllog_utils.ABORTED,
            mllog_utils.INTERVAL_START,
            mllog_utils.INTERVAL_END,
            mllog_utils.POINT_IN_TIME,
        },
        official,
    )

  def test_hyperparameters_missing_key_raises(self):
    logger = mllog_utils.create_mllogger(
        _config(), os.path.join(self.dir, "mllog.log"), process_index=0
    )
    with self.assertRaisesRegex(ValueError, "missing.*opt_adamw_beta_1"):
      logger.hyperparameters({"global_batch_size": 8})
    logger.close()

  def test_hyperparameters_from_config_rejects_warmup_past_schedule(self):
    with self.assertRaisesRegex(ValueError, "warmup_steps.*30"):
      _hparams(_config(warmup_steps=30))


if __name__ == "__main__":
  absltest.main()
