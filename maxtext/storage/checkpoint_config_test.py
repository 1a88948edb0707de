"""Tests for maxtext/storage/checkpoint_config.py."""

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.configs import base
from maxtext.storage import checkpoint_config


def _settings(**overrides) -> checkpoint_config.CheckpointConfig:
  config = base.get_config()
  config.update(overrides)
  return checkpoint_config.CheckpointConfig.from_config(config)


class CheckpointConfigTest(parameterized.TestCase):

  def test_save_period_is_the_period_or_the_run_length(self):
    self.assertEqual(_settings(checkpoint_period=7, steps=20).save_period, 7)
    self.assertEqual(_settings(checkpoint_period=0, steps=20).save_period, 20)

  @parameterized.named_parameters(
      ("period", "checkpoint_period"), ("keep", "max_checkpoints_to_keep")
  )
  def test_negative_is_one_line_naming_the_field(self, field):
    with self.assertRaisesRegex(
        ValueError, rf"^config\.{field}=-1: must be >= 0$"
    ):
      _settings(**{field: -1})


if __name__ == "__main__":
  absltest.main()
