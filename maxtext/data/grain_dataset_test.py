"""Tests for maxtext.data.grain_dataset on prepared stdlib sources."""

import os

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.config import config_lib
from maxtext.mllog import mlperf_config
from maxtext.run import preflight
from maxtext.mllog import hyperparameters
from maxtext.data import data_config
from maxtext.data import grain_dataset
from maxtext.text import prepare
from testing import stdlib_corpus
from testing import tiny_configs


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


_SEQ = 16


_DATA = None


def setUpModule():
  # Prepared once for every test of the module.
  global _DATA  # pylint: disable=global-statement
  _DATA = os.path.join(absltest.get_default_test_tmpdir(), "grain_data")
  if not os.path.exists(os.path.join(_DATA, "metadata.json")):
    prepare.prepare(
        stdlib_corpus.files(5),
        _DATA,
        train_vocab_size=512,
        eval_every=3,
        record_tokens=50,
        shard_tokens=1000,
        report=lambda line: None,
    )


def _config(**overrides):
  """A tiny grain config on the prepared stdlib data."""
  config = tiny_configs.tiny_config(
      absltest.get_default_test_tmpdir(),
      dataset_type="grain",
      train_data_path=_DATA,
      vocab_size=512,
      max_sequence_length=_SEQ,
      global_batch_size=8,
      eval_batch_size=4,
      data_shuffle_seed=7,
  )
  for key, value in overrides.items():
    config[key] = value
  return config


def _batches(dataset, steps, start=0):
  return [dataset.get_batch(s) for s in range(start, start + steps)]


class GrainDatasetTest(parameterized.TestCase):

  def test_batches_are_shuffled_windows_of_the_stream(self):
    dataset = grain_dataset.GrainDataset(
        data_config.DataConfig.from_config(_config())
    )
    reader = grain_dataset.WindowReader(_DATA, dataset.metadata, "train", _SEQ)
    windows = dataset.num_train_windows
    steps = -(-2 * windows // 8)  # Past the end of the second epoch.
    batches = _batches(dataset, steps)
    for batch in batches:
      self.assertEqual(batch["inputs"].shape, (8, _SEQ))
      self.assertEqual(batch["inputs"].dtype, np.int32)
      np.testing.assert_array_equal(
          batch["inputs"][:, 1:], batch["targets"][:, :-1]
      )
    rows = np.concatenate(
        [
            np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1)
            for b in batches
        ]
    )
    contents = [reader(w).tobytes() for w in range(windows)]
    read = [r.tobytes() for r in rows]
    # Each epoch is a permutation of the windows, in another order.
    self.assertCountEqual(read[:windows], contents)
    self.assertCountEqual(read[windows : 2 * windows], contents)
    self.assertNotEqual(read[:windows], read[windows : 2 * windows])
    self.assertNotEqual(read[:windows], contents)

  def test_processes_read_disjoint_shares_of_the_same_global_batch(self):
    whole = _batches(
        grain_dataset.GrainDataset(
            data_config.DataConfig.from_config(_config())
        ),
        3,
    )
    shares = [
        _batches(
            grain_dataset.GrainDataset(
                data_config.DataConfig.from_config(_config()), p, 2
            ),
            3,
        )
        for p in range(2)
    ]
    for step in range(3):
      mine = [{r.tobytes() for r in share[step]["inputs"]} for share in shares]
      self.assertLen(mine[0] | mine[1], 8)
      self.assertEqual(
          mine[0] | mine[1], {r.tobytes() for r in whole[step]["inputs"]}
      )
    evals = [
        grain_dataset.GrainDataset(
            data_config.DataConfig.from_config(_config()), p, 2
        ).get_eval_batch(1)
        for p in range(2)
    ]
    np.testing.assert_array_equal(
        np.concatenate([e["inputs"] for e in evals]),
        grain_dataset.GrainDataset(
            data_config.DataConfig.from_config(_config())
        ).get_eval_batch(1)["inputs"],
    )

  @parameterized.named_parameters(("threads", 0), ("worker_process", 1))
  def test_restored_state_continues_with_the_same_batches(self, workers):
    config = _config(grain_worker_count=workers)
    reference = grain_dataset.GrainDataset(
        data_config.DataConfig.from_config(config)
    )
    expected = _batches(reference, 6)
    reference.close()
    first = grain_dataset.GrainDataset(
        data_config.DataConfig.from_config(config)
    )
    _batches(first, 4)  # The trainer reads a batch ahead of its checkpoint.
    state = first.checkpoint_state(3)
    first.close()
    self.assertEqual((state["step"], state["process_count"]), (3, 1))
    resumed = grain_dataset.GrainDataset(
        data_config.DataConfig.from_config(config)
    )
    resumed.restore_checkpoint_state(state)
    for step, batch in zip(range(3, 6), _batches(resumed, 3, start=3)):
      np.testing.assert_array_equal(batch["inputs"], expected[step]["inputs"])
    resumed.close()

  def test_resume_without_state_starts_at_the_step(self):
    expected = _batches(
        grain_dataset.GrainDataset(
            data_config.DataConfig.from_config(_config())
        ),
        5,
    )
    late = grain_dataset.GrainDataset(
        data_config.DataConfig.from_config(_config())
    )
    np.testing.assert_array_equal(
        late.get_batch(4)["inputs"], expected[4]["inputs"]
    )

  def test_refusals(self):
    dataset = grain_dataset.GrainDataset(
        data_config.DataConfig.from_config(_config())
    )
    dataset.get_batch(0)
    with self.assertRaisesRegex(ValueError, r"^step=2: .* next one is 1$"):
      dataset.get_batch(2)
    state = dataset.checkpoint_state(1)
    two = grain_dataset.GrainDataset(
        data_config.DataConfig.from_config(_config()), 0, 2
    )
    with self.assertRaisesRegex(
        ValueError, r"saved by 1 process\(es\); this run has 2"
    ):
      two.restore_checkpoint_state(state)

  def test_preflight_checks_the_prepared_data(self):
    config_lib.validate(_config())
    preflight.check(preflight.PreflightConfig.from_config(_config()))
    with self.assertRaisesRegex(
        ValueError,
        r"^config.vocab_size=300: smaller than the vocabulary of "
        r"train_data_path=.* \(512 ids\)",
    ):
      preflight.check(
          preflight.PreflightConfig.from_config(_config(vocab_size=300))
      )
    empty = self.create_tempdir().full_path
    with self.assertRaisesRegex(
        ValueError,
        rf"^config.train_data_path='{empty}': has no " r"metadata.json",
    ):
      preflight.check(
          preflight.PreflightConfig.from_config(_config(train_data_path=empty))
      )
    with self.assertRaisesRegex(ValueError, r"one sequence needs"):
      preflight.check(
          preflight.PreflightConfig.from_config(
              _config(max_sequence_length=100_000)
          )
      )
    # MLPerf sample counts come from the prepared data.
    config = _config()
    self.assertEqual(
        hyperparameters.train_samples_of(_mlperf(config)),
        grain_dataset.GrainDataset(
            data_config.DataConfig.from_config(config)
        ).num_train_windows,
    )


if __name__ == "__main__":
  absltest.main()
