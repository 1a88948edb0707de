"""Tests for maxtext/data/dataset_kinds.py: one table of data set kinds."""

import os

from absl.testing import absltest
import numpy as np

from maxtext.data import builtin_datasets
from maxtext.data import data_config
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
        dataset_kinds.make_dataset(
            data_config.DataConfig.from_config(_config())
        ),
        builtin_datasets.SyntheticDataset,
    )
    path = os.path.join(self.create_tempdir().full_path, "train.npy")
    np.save(path, np.arange(100, dtype=np.int32) % 50)
    config = _config(
        dataset_type="tokens_file", train_data_path=path, eval_data_path=path
    )
    built = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(config), 1, 2
    )
    self.assertIsInstance(built, builtin_datasets.TokensFileDataset)
    # Process 1 of 2 gets the second half of the global batch's rows.
    np.testing.assert_array_equal(
        built.get_batch(0)["inputs"],
        builtin_datasets.TokensFileDataset(
            data_config.DataConfig.from_config(config)
        ).get_batch(0)["inputs"][2:],
    )

  def test_packing_restarts_token_file_rows_at_each_document(self):
    # Documents of the stream end with id 0: rows get segment ids and
    # positions that restart after each 0; tokens are the unpacked rows'.
    path = os.path.join(self.create_tempdir().full_path, "train.npy")
    np.save(path, np.arange(100, dtype=np.int32) % 5)
    config = _config(
        dataset_type="tokens_file", train_data_path=path, eval_data_path=path
    )
    plain = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(config)
    )
    config.packing = True
    with self.assertRaisesRegex(ValueError, "needs config.eod_id"):
      dataset_kinds.make_dataset(data_config.DataConfig.from_config(config))
    config.eod_id = 0
    packed = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(config)
    )
    for batch, want in (
        (packed.get_batch(3), plain.get_batch(3)),
        (packed.get_eval_batch(0), plain.get_eval_batch(0)),
    ):
      np.testing.assert_array_equal(batch["inputs"], want["inputs"])
      inputs = batch["inputs"]
      for row, ids, positions in zip(
          inputs, batch["segment_ids"], batch["positions"]
      ):
        for t in range(1, len(row)):
          new = row[t - 1] == 0
          self.assertEqual(ids[t], ids[t - 1] + new)
          self.assertEqual(positions[t], 0 if new else positions[t - 1] + 1)

  def test_grain_reads_the_prepared_data_it_names(self):
    missing = os.path.join(self.create_tempdir().full_path, "absent")
    with self.assertRaisesRegex(ValueError, "train_data_path"):
      dataset_kinds.make_dataset(
          data_config.DataConfig.from_config(
              _config(
                  dataset_type="grain",
                  train_data_path=missing,
                  eval_data_path=missing,
              )
          )
      )

  def test_unknown_kind_and_constructor_errors(self):
    with self.assertRaisesRegex(
        ValueError,
        r"^dataset_type='csv': must be 'synthetic', 'tokens_file', "
        r"'grain', 'chat' or 'megatron'$",
    ):
      dataset_kinds.make_dataset(
          data_config.DataConfig.from_config(_config(dataset_type="csv"))
      )
    with self.assertRaisesRegex(ValueError, "train_data_path"):
      dataset_kinds.make_dataset(
          data_config.DataConfig.from_config(
              _config(dataset_type="tokens_file")
          )
      )


if __name__ == "__main__":
  absltest.main()
