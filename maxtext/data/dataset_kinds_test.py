"""Tests for maxtext/data/dataset_kinds.py: one table of data set kinds."""

import os

from absl.testing import absltest
import numpy as np

from maxtext.data import builtin_datasets
from maxtext.data import dataset
from maxtext.data import dataset_kinds
from maxtext.configs import base
from maxtext.data import grain_dataset


def _config(**overrides):
  config = base.get_config()
  config.vocab_size = 50
  config.max_sequence_length = 8
  config.global_batch_size = 4
  config.eval_batch_size = 2
  config.update(overrides)
  return config


class DatasetKindsTest(absltest.TestCase):

  def test_every_kind_is_a_data_set(self):
    # choices_test ties the table's names to config.dataset_type's choices.
    for cls in (
        builtin_datasets.SyntheticDataset,
        builtin_datasets.TokensFileDataset,
        grain_dataset.GrainDataset,
    ):
      self.assertTrue(issubclass(cls, dataset.Dataset), cls)

  def test_synthetic_and_tokens_file(self):
    self.assertIsInstance(
        dataset_kinds.make_dataset(_config()), builtin_datasets.SyntheticDataset
    )
    path = os.path.join(self.create_tempdir().full_path, "train.npy")
    np.save(path, np.arange(100, dtype=np.int32) % 50)
    config = _config(
        dataset_type="tokens_file", train_data_path=path, eval_data_path=path
    )
    built = dataset_kinds.make_dataset(config, 1, 2)
    self.assertIsInstance(built, builtin_datasets.TokensFileDataset)
    # Process 1 of 2 gets the second half of the global batch's rows.
    np.testing.assert_array_equal(
        built.get_batch(0)["inputs"],
        builtin_datasets.TokensFileDataset(config).get_batch(0)["inputs"][2:],
    )

  def test_grain_reads_the_prepared_data_it_names(self):
    missing = os.path.join(self.create_tempdir().full_path, "absent")
    with self.assertRaisesRegex(ValueError, "train_data_path"):
      dataset_kinds.make_dataset(
          _config(
              dataset_type="grain",
              train_data_path=missing,
              eval_data_path=missing,
          )
      )

  def test_unknown_kind_and_constructor_errors(self):
    with self.assertRaisesRegex(
        ValueError,
        r"^dataset_type='csv': must be 'synthetic', 'tokens_file', "
        r"'grain', 'chat' or 'megatron'$",
    ):
      dataset_kinds.make_dataset(_config(dataset_type="csv"))
    with self.assertRaisesRegex(ValueError, "train_data_path"):
      dataset_kinds.make_dataset(_config(dataset_type="tokens_file"))


if __name__ == "__main__":
  absltest.main()
