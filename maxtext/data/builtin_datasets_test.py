"""Tests for maxtext/data/builtin_datasets.py: synthetic and token-file data."""

import io
import os

from absl.testing import absltest
from absl.testing import parameterized
import chex
import numpy as np

from maxtext.data import builtin_datasets
from maxtext.data import data_config
from maxtext.configs import base


def _config(**overrides):
  config = base.get_config()
  config.vocab_size = 50
  config.max_sequence_length = 8
  config.global_batch_size = 4
  config.eval_batch_size = 2
  for key, value in overrides.items():
    config[key] = value
  return config


def _check_batch(test, batch, rows, seq):
  test.assertEqual(set(batch), {"inputs", "targets"})
  chex.assert_shape(batch["inputs"], (rows, seq))
  chex.assert_shape(batch["targets"], (rows, seq))
  chex.assert_type(batch["inputs"], np.int32)
  chex.assert_type(batch["targets"], np.int32)
  # Targets are the inputs shifted by one token.
  np.testing.assert_array_equal(
      batch["inputs"][:, 1:], batch["targets"][:, :-1]
  )


def _npy_bytes(array, allow_pickle=False) -> bytes:
  """The bytes np.save writes for `array`."""
  buffer = io.BytesIO()
  np.save(buffer, array, allow_pickle=allow_pickle)
  return buffer.getvalue()


class SyntheticDatasetTest(parameterized.TestCase):

  def test_has_no_state_provenance_or_resources(self):
    dataset = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(_config())
    )
    expected = dataset.get_batch(3)
    self.assertIsNone(dataset.checkpoint_state(3))
    self.assertIsNone(dataset.provenance())
    dataset.restore_checkpoint_state({"step": 7})  # Ignored: no position.
    dataset.close()
    chex.assert_trees_all_equal(dataset.get_batch(3), expected)

  def test_shapes_and_progressions(self):
    config = _config()
    dataset = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(config)
    )
    batch = dataset.get_batch(0)
    _check_batch(self, batch, 4, 8)
    diffs = (batch["targets"] - batch["inputs"]) % config.vocab_size
    for row in diffs:
      self.assertLen(set(row.tolist()), 1)
      self.assertIn(int(row[0]), builtin_datasets.SYNTHETIC_STEPS)
    self.assertTrue(
        np.all((batch["inputs"] >= 0) & (batch["inputs"] < config.vocab_size))
    )
    _check_batch(self, dataset.get_eval_batch(3), 2, 8)

  def test_deterministic_by_seed_and_step(self):
    a = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(_config(seed=1))
    )
    b = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(_config(seed=1))
    )
    c = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(_config(seed=2))
    )
    chex.assert_trees_all_equal(a.get_batch(7), b.get_batch(7))
    chex.assert_trees_all_equal(a.get_eval_batch(2), b.get_eval_batch(2))
    self.assertFalse(
        np.array_equal(a.get_batch(7)["inputs"], a.get_batch(8)["inputs"])
    )
    self.assertFalse(
        np.array_equal(a.get_batch(7)["inputs"], c.get_batch(7)["inputs"])
    )

  def test_eval_stream_differs_from_train(self):
    dataset = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(_config(eval_batch_size=4))
    )
    self.assertFalse(
        np.array_equal(
            dataset.get_batch(0)["inputs"], dataset.get_eval_batch(0)["inputs"]
        )
    )

  def test_processes_split_the_global_batch(self):
    config = _config()
    whole = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(config)
    ).get_batch(5)
    parts = [
        builtin_datasets.SyntheticDataset(
            data_config.DataConfig.from_config(config), i, 2
        ).get_batch(5)
        for i in range(2)
    ]
    for part in parts:
      _check_batch(self, part, 2, 8)
    for key, value in whole.items():
      np.testing.assert_array_equal(
          np.concatenate([p[key] for p in parts]), value
      )

  @parameterized.named_parameters(
      (
          "batch_not_divisible",
          dict(process_index=0, process_count=3),
          "global_batch_size=4",
      ),
      (
          "index_out_of_range",
          dict(process_index=2, process_count=2),
          "process_index",
      ),
      ("count_zero", dict(process_index=0, process_count=0), "process_count"),
      (
          "count_bool",
          dict(process_index=0, process_count=True),
          "process_count",
      ),
      (
          "index_bool",
          dict(process_index=False, process_count=1),
          "process_index",
      ),
  )
  def test_bad_process_arguments(self, kwargs, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      builtin_datasets.SyntheticDataset(
          data_config.DataConfig.from_config(_config()), **kwargs
      )

  def test_bad_step(self):
    dataset = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(_config())
    )
    with self.assertRaisesRegex(ValueError, "step"):
      dataset.get_batch(-1)
    with self.assertRaisesRegex(ValueError, "index"):
      dataset.get_eval_batch(1.5)
    with self.assertRaisesRegex(ValueError, "step"):
      dataset.get_batch(True)
    with self.assertRaisesRegex(ValueError, "step"):
      dataset.get_batch(np.bool_(True))
    np.testing.assert_array_equal(
        dataset.get_batch(np.int64(3))["inputs"], dataset.get_batch(3)["inputs"]
    )


class TokensFileDatasetTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tempdir = self.create_tempdir()
    self.dir = self.tempdir.full_path

  def _write(self, name, array):
    path = os.path.join(self.dir, name)
    if name.endswith(".npy"):
      np.save(path, array)
    else:
      with open(path, "wb") as f:
        f.write(np.asarray(array).tobytes())
    return path

  def _dataset(
      self,
      train,
      evaluation=None,
      process_index=0,
      process_count=1,
      **overrides,
  ):
    """A token-file dataset over `train` (and `evaluation`, else `train`)."""
    config = _config(
        dataset_type="tokens_file",
        train_data_path=train,
        eval_data_path=evaluation or train,
        **overrides,
    )
    return builtin_datasets.TokensFileDataset(
        data_config.DataConfig.from_config(config), process_index, process_count
    )

  def test_batches_are_windows_of_the_file(self):
    # Token id = position, so a window is identified by its first token.
    tokens = np.arange(8 * 10 + 1).astype(np.uint16)
    path = self._write("train.npy", tokens)
    dataset = self._dataset(path, vocab_size=1000)
    self.assertEqual(dataset.num_train_windows, 10)
    batch = dataset.get_batch(0)
    _check_batch(self, batch, 4, 8)
    for inputs, targets in zip(batch["inputs"], batch["targets"]):
      window = np.concatenate([inputs, targets[-1:]])
      start = int(np.where(tokens == window[0])[0][0])
      self.assertEqual(start % 8, 0)
      np.testing.assert_array_equal(window, tokens[start : start + 9])

  def test_one_epoch_visits_every_window_once_in_shuffled_order(self):
    tokens = np.arange(8 * 12 + 1, dtype=np.int32)
    path = self._write("train.npy", tokens)
    dataset = self._dataset(path, vocab_size=1000)
    firsts = np.concatenate(
        [dataset.get_batch(step)["inputs"][:, 0] for step in range(3)]
    )
    self.assertCountEqual(firsts.tolist(), list(range(0, 96, 8)))
    self.assertNotEqual(firsts.tolist(), sorted(firsts.tolist()))
    # The next epoch is another permutation of the same windows.
    later = np.concatenate(
        [dataset.get_batch(step)["inputs"][:, 0] for step in range(3, 6)]
    )
    self.assertCountEqual(later.tolist(), list(range(0, 96, 8)))

  def test_deterministic_and_seeded(self):
    tokens = np.arange(8 * 40 + 1, dtype=np.int32)
    path = self._write("train.npy", tokens)
    a = self._dataset(path, vocab_size=1000, data_shuffle_seed=3)
    b = self._dataset(path, vocab_size=1000, data_shuffle_seed=3)
    c = self._dataset(path, vocab_size=1000, data_shuffle_seed=4)
    for step in (0, 4, 17):
      chex.assert_trees_all_equal(a.get_batch(step), b.get_batch(step))
    self.assertFalse(
        all(
            np.array_equal(a.get_batch(s)["inputs"], c.get_batch(s)["inputs"])
            for s in range(3)
        )
    )

  def test_processes_split_the_global_batch(self):
    path = self._write("train.npy", np.arange(8 * 20 + 1, dtype=np.int32))
    whole = self._dataset(path, vocab_size=1000).get_batch(3)
    parts = [
        self._dataset(path, None, i, 2, vocab_size=1000).get_batch(3)
        for i in range(2)
    ]
    for key, value in whole.items():
      np.testing.assert_array_equal(
          np.concatenate([p[key] for p in parts]), value
      )

  def test_eval_reads_the_eval_file_in_order(self):
    train = self._write("train.npy", np.zeros(100, np.int32))
    evaluation = self._write("eval.npy", np.arange(8 * 3 + 1, dtype=np.int32))
    dataset = self._dataset(train, evaluation)
    self.assertEqual(dataset.num_eval_windows, 3)
    firsts = [
        dataset.get_eval_batch(i)["inputs"][:, 0].tolist() for i in range(2)
    ]
    self.assertEqual(firsts, [[0, 8], [16, 0]])

  def test_raw_uint16_file(self):
    tokens = (np.arange(8 * 4 + 1) % 50).astype("<u2")
    path = self._write("train.bin", tokens)
    batch = self._dataset(path).get_batch(0)
    _check_batch(self, batch, 4, 8)
    self.assertCountEqual(
        batch["inputs"][:, 0].tolist(), [tokens[8 * i] for i in range(4)]
    )

  def test_missing_file(self):
    path = os.path.join(self.dir, "absent.npy")
    with self.assertRaisesRegex(
        ValueError,
        r"^config\.train_data_path='.*absent\.npy': does not exist$",
    ):
      self._dataset(path)

  def test_directory_is_not_a_token_file(self):
    path = os.path.join(self.dir, "shards.npy")
    os.mkdir(path)
    with self.assertRaisesRegex(
        ValueError,
        "train_data_path=.*shards.npy': is a directory, not a token file",
    ):
      self._dataset(path)

  def test_empty_file(self):
    path = os.path.join(self.dir, "empty.npy")
    with open(path, "wb"):
      pass
    with self.assertRaisesRegex(ValueError, "empty.npy.*empty"):
      self._dataset(path)

  def test_too_short_file(self):
    path = self._write("short.npy", np.arange(8, dtype=np.int32))
    with self.assertRaisesRegex(ValueError, "short.npy.*8 tokens"):
      self._dataset(path)

  @parameterized.named_parameters(
      ("float", np.arange(100, dtype=np.float32), "dtype float32"),
      ("two_dimensional", np.zeros((10, 10), np.int32), r"shape \(10, 10\)"),
  )
  def test_bad_array(self, array, pattern):
    path = self._write("bad.npy", array)
    with self.assertRaisesRegex(ValueError, "bad.npy.*" + pattern):
      self._dataset(path)

  @parameterized.named_parameters(
      (
          "bad_magic",
          lambda t: b"hello world, not numpy\n",
          "magic string is not correct",
      ),
      (
          "magic_only",
          lambda t: _npy_bytes(np.arange(100))[:8],
          "EOF: reading array header length",
      ),
      (
          "truncated_header",
          lambda t: _npy_bytes(np.arange(100))[:40],
          "EOF: reading array header",
      ),
      (
          "garbled_header",
          lambda t: _npy_bytes(np.arange(100)).replace(b"'descr'", b"'d#scr'"),
          "Header does not contain the correct keys",
      ),
      (
          "pickled_objects",
          lambda t: _npy_bytes(
              np.array([{"a": 1}, None] * 60), allow_pickle=True
          ),
          r"Python objects \(a pickled array\), not token ids",
      ),
      (
          "truncated_data",
          lambda t: _npy_bytes(np.arange(100, dtype=np.int32))[:-4],
          r"truncated: its header says shape \(100,\) of int32",
      ),
  )
  def test_malformed_npy_file(self, make_content, detail):
    path = self.tempdir.create_file("bad.npy", make_content(self)).full_path
    with self.assertRaises(ValueError) as raised:
      self._dataset(path)
    message = str(raised.exception)
    self.assertRegex(
        message,
        r"^config\.train_data_path='.*bad\.npy': "
        r"malformed \.npy file: .*" + detail,
    )
    self.assertNotIn("\n", message)
    # np.load's fallback would have said "pickled data" about any of these.
    self.assertNotIn("pickled data", message)

  def test_check_token_files_reads_headers_only(self):
    good = self._write("good.npy", np.arange(100, dtype=np.int32) % 50)
    bad = self.tempdir.create_file("bad.bin", b"\x01" * 7).full_path
    builtin_datasets.check_token_files(
        data_config.DataConfig.from_config(
            _config(
                dataset_type="tokens_file",
                train_data_path=good,
                eval_data_path=good,
            )
        )
    )
    with self.assertRaisesRegex(
        ValueError,
        r"^config\.eval_data_path='.*bad\.bin': raw token file " "has 7 bytes",
    ):
      builtin_datasets.check_token_files(
          data_config.DataConfig.from_config(
              _config(
                  dataset_type="tokens_file",
                  train_data_path=good,
                  eval_data_path=bad,
              )
          )
      )
    # Nothing to check for synthetic data, whatever the paths say.
    builtin_datasets.check_token_files(
        data_config.DataConfig.from_config(_config(train_data_path=bad))
    )

  def test_bad_extension_and_odd_raw_size(self):
    path = self._write("tokens.txt", np.arange(100, dtype=np.int32))
    with self.assertRaisesRegex(ValueError, "tokens.txt.*.npy"):
      self._dataset(path)
    path = self.tempdir.create_file("odd.bin", b"\x01" * 101).full_path
    with self.assertRaisesRegex(ValueError, "odd.bin.*101 bytes"):
      self._dataset(path)

  def test_token_out_of_vocabulary(self):
    path = self._write("big.npy", np.full(100, 50, np.int32))
    dataset = self._dataset(path)
    with self.assertRaisesRegex(ValueError, "big.npy.*vocab_size"):
      dataset.get_batch(0)


class FileFingerprintTest(absltest.TestCase):
  """A tokens file's size and sampled content hash tell files apart."""

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path
    rng = np.random.default_rng(0)
    # 3 MiB: more than the sampled blocks together.
    self.tokens = rng.integers(0, 50000, size=3 * 2**19, dtype=np.uint16)

  def _write(self, name, tokens):
    path = os.path.join(self.dir, name)
    np.save(path, tokens)
    return path

  def test_same_content_same_fingerprint_other_content_another(self):
    first = builtin_datasets.file_fingerprint(self._write("a.npy", self.tokens))
    again = builtin_datasets.file_fingerprint(self._write("b.npy", self.tokens))
    self.assertEqual(first["size"], again["size"])
    self.assertEqual(first["sampled_sha256"], again["sampled_sha256"])
    self.assertEqual(first["path"], os.path.join(self.dir, "a.npy"))

    # Other tokens of the same shape: the same size, another fingerprint.
    other = builtin_datasets.file_fingerprint(
        self._write("c.npy", self.tokens[::-1])
    )
    self.assertEqual(other["size"], first["size"])
    self.assertNotEqual(other["sampled_sha256"], first["sampled_sha256"])
    # The last token alone (in the last sampled block) changes it.
    edited = self.tokens.copy()
    edited[-1] += 1
    last = builtin_datasets.file_fingerprint(self._write("d.npy", edited))
    self.assertNotEqual(last["sampled_sha256"], first["sampled_sha256"])

  def test_small_file_is_hashed_whole(self):
    small = self.tokens[:1000]
    edited = small.copy()
    edited[500] += 1
    self.assertNotEqual(
        builtin_datasets.file_fingerprint(self._write("a.npy", small)),
        builtin_datasets.file_fingerprint(self._write("a.npy", edited)),
    )

  def test_changed_files_names_the_field_the_path_and_the_change(self):
    path = self._write("train.npy", self.tokens)
    recorded = {
        "tokens_files": {
            "train_data_path": builtin_datasets.file_fingerprint(path),
            "eval_data_path": builtin_datasets.file_fingerprint(path),
        }
    }
    self.assertEqual(builtin_datasets.changed_files(recorded, recorded), [])
    self.assertEqual(builtin_datasets.changed_files(None, recorded), [])
    self._write("train.npy", self.tokens[:-8])
    current = {
        "tokens_files": {
            "train_data_path": builtin_datasets.file_fingerprint(path),
            "eval_data_path": recorded["tokens_files"]["eval_data_path"],
        }
    }
    size = recorded["tokens_files"]["train_data_path"]["size"]
    self.assertEqual(
        builtin_datasets.changed_files(recorded, current),
        [
            f"config.train_data_path={path!r}: {size} bytes recorded, "
            f"{size - 16} now"
        ],
    )


class SplitMicroBatchesTest(parameterized.TestCase):

  def test_split_and_rejoin(self):
    batch = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(_config(global_batch_size=6))
    ).get_batch(0)
    parts = builtin_datasets.split_micro_batches(batch, 3)
    self.assertLen(parts, 3)
    for part in parts:
      _check_batch(self, part, 2, 8)
    for key, value in batch.items():
      np.testing.assert_array_equal(
          np.concatenate([p[key] for p in parts]), value
      )
    self.assertLen(builtin_datasets.split_micro_batches(batch, 1), 1)

  @parameterized.named_parameters(
      ("not_divisible", 4, "not divisible"),
      ("zero", 0, "num_micro_batches"),
      ("bool", True, "num_micro_batches"),
  )
  def test_bad_count(self, k, pattern):
    batch = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(_config(global_batch_size=6))
    ).get_batch(0)
    with self.assertRaisesRegex(ValueError, pattern):
      builtin_datasets.split_micro_batches(batch, k)

  def test_mismatched_arrays(self):
    with self.assertRaisesRegex(ValueError, "disagree"):
      builtin_datasets.split_micro_batches(
          {"inputs": np.zeros((4, 2)), "targets": np.zeros((2, 2))}, 2
      )


if __name__ == "__main__":
  absltest.main()
