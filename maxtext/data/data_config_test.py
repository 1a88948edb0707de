"""Tests for maxtext/data/data_config.py."""

from absl.testing import absltest

from maxtext.configs import base
from maxtext.data import data_config


class DataConfigTest(absltest.TestCase):

  def test_from_config_takes_the_configs_fields(self):
    config = base.get_config()
    config.update(dict(dataset_type="tokens_file", train_data_path="/t.npy"))
    settings = data_config.DataConfig.from_config(config)
    self.assertEqual(
        (settings.dataset_type, settings.train_data_path),
        ("tokens_file", "/t.npy"),
    )

  def test_data_path_names_only_the_data_files(self):
    settings = data_config.DataConfig(
        train_data_path="/t.npy", eval_data_path="/e.npy"
    )
    self.assertEqual(settings.data_path("train_data_path"), "/t.npy")
    self.assertEqual(settings.data_path("eval_data_path"), "/e.npy")
    with self.assertRaisesRegex(KeyError, "tokenizer_path"):
      settings.data_path("tokenizer_path")


if __name__ == "__main__":
  absltest.main()
