"""Tests for maxtext/mllog/mlperf_config.py: the MLPerf log's settings."""

import re

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.configs import base
from maxtext.mllog import logger
from maxtext.mllog import mlperf_config


def _settings(**overrides) -> mlperf_config.MlperfConfig:
  config = base.get_config()
  config.update(overrides)
  return mlperf_config.MlperfConfig.from_config(config)


class MlperfConfigTest(parameterized.TestCase):

  def test_from_config_takes_the_fields_and_the_optimizers(self):
    settings = _settings(submission_division="closed", learning_rate=2e-4)
    self.assertEqual(settings.submission_division, "closed")
    self.assertEqual(settings.optimizer.learning_rate, 2e-4)

  def test_submission_is_the_logs_order(self):
    self.assertEqual(
        list(_settings().submission()), list(logger.SUBMISSION_KEYS)
    )
    self.assertEqual(
        _settings(submission_org="Org").submission()["submission_org"], "Org"
    )

  @parameterized.parameters("", "sync", "echo 3 > /proc/sys/vm/drop_caches")
  def test_cache_clear_command_accepts(self, command):
    self.assertEqual(
        _settings(cache_clear_command=command).cache_clear_command, command
    )

  @parameterized.parameters(" ", "\t\n", "sync\0")
  def test_cache_clear_command_refuses(self, command):
    with self.assertRaisesRegex(
        ValueError, f"^config.cache_clear_command={re.escape(repr(command))}"
    ):
      _settings(cache_clear_command=command)

  def test_a_log_on_gcs_is_refused(self):
    with self.assertRaisesRegex(
        ValueError, r"^config\.mllog_file='gs://b/mllog.log': must be a local"
    ):
      _settings(mllog_file="gs://b/mllog.log")

  def test_negative_train_samples_are_refused(self):
    with self.assertRaisesRegex(
        ValueError, r"^config\.mllog_train_samples=-1: must be >= 0$"
    ):
      _settings(mllog_train_samples=-1)


if __name__ == "__main__":
  absltest.main()
