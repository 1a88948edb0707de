"""dataset_type="megatron": rows, blend, order, eval set, checks, resume."""

import os
import re

from absl.testing import absltest
import numpy as np

from maxtext import workloads
from maxtext.core import caller_paths
from maxtext.config import config_lib
from maxtext.data import data_config
from maxtext.data import dataset_kinds
from maxtext.mllog import mlperf_config
from maxtext.run import preflight
from maxtext.run import trainer
from maxtext.configs import deepseekv3_671b
from maxtext.mllog import eval_set
from maxtext.storage import data_state
from maxtext.storage import run_dir
from maxtext.data import megatron_dataset
from maxtext.text import megatron_index
from testing import run_layout
from testing import tiny_configs


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


_SEQ = 16  # tiny_config's max_sequence_length.
_VOCAB = 32


def _documents(rng, count, low=3, high=40, eod=_VOCAB - 1):
  """`count` documents of random ids, each ending in an end-of-document id."""
  docs = []
  for _ in range(count):
    body = rng.integers(0, eod, size=int(rng.integers(low, high))).tolist()
    docs.append([body + [eod]])
  return docs


def _stream(docs):
  return np.asarray([t for doc in docs for seq in doc for t in seq])


class MegatronDatasetTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tiny_configs.fresh_output_dir("megatron_dataset_test_")
    rng = np.random.default_rng(0)
    cls.a_docs = _documents(rng, 60)
    cls.b_docs = _documents(rng, 40)
    cls.val_docs = _documents(rng, 30)
    cls.a = os.path.join(cls.root, "a_text_document")
    cls.b = os.path.join(cls.root, "b_text_document")
    cls.val = os.path.join(cls.root, "val_text_document")
    megatron_index.write(cls.a, cls.a_docs, np.int32)
    megatron_index.write(cls.b, cls.b_docs, np.uint16)
    megatron_index.write(cls.val, cls.val_docs, np.int64)

  def _config(self, run_name="m", steps=6, **overrides):
    """The tiny config on the blend of a and b, validating on val."""
    fields = dict(
        dataset_type="megatron",
        train_data_path=f"0.25 {self.a} 0.75 {self.b}",
        eval_data_path=self.val,
        megatron_eval_samples=8,
        lr_schedule_steps=6,
        enable_mllog=False,
    )
    fields.update(overrides)
    return tiny_configs.tiny_config(
        self.root, run_name=run_name, steps=steps, **fields
    )

  def test_rows_are_the_stream_cut_with_shared_boundary_tokens(self):
    ds = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(self._config(train_data_path=self.a))
    )
    stream = _stream(self.a_docs)
    rows = (len(stream) - 1) // _SEQ
    self.assertEqual(ds.num_train_rows, [rows])
    seen = set()
    for step in range(rows // 8):
      batch = ds.get_batch(step)
      for inputs, targets in zip(batch["inputs"], batch["targets"]):
        np.testing.assert_array_equal(inputs[1:], targets[:-1])
        window = np.concatenate([inputs, targets[-1:]])
        starts = [
            s
            for s in range(0, rows * _SEQ, _SEQ)
            if np.array_equal(stream[s : s + _SEQ + 1], window)
        ]
        self.assertLen(starts, 1)
        seen.add(starts[0])
    # One epoch's first rows * 8 samples are distinct rows: a permutation.
    self.assertLen(seen, (rows // 8) * 8)

  def test_blend_follows_the_weights(self):
    ds = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config())
    )
    prefixes = [ds.sample_source(n)[0] for n in range(400)]
    self.assertEqual(prefixes.count(0), 100)
    self.assertEqual(prefixes.count(1), 300)
    # Megatron's rule interleaves: never more than 4 samples in a row of b.
    runs = "".join(map(str, prefixes)).split("0")
    self.assertLessEqual(max(len(r) for r in runs), 4)

  def test_each_prefix_counts_its_samples_across_blend_periods(self):
    ds = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config())
    )
    period = megatron_dataset.BLEND_PERIOD
    seen = {0: [], 1: []}
    for n in range(2 * period + 10):
      prefix, m = ds.blend_position(n)
      seen[prefix].append(m)
    # Each prefix's samples are its 0th, 1st, 2nd, ... in order, with no
    # gap or repeat where one period ends and the next begins.
    for prefix, ms in seen.items():
      self.assertEqual(ms, list(range(len(ms))), prefix)
    self.assertEqual(len(seen[0]) + len(seen[1]), 2 * period + 10)
    self.assertAlmostEqual(len(seen[0]) / (2 * period), 0.25, delta=1e-4)

  def test_blend_schedule_is_periodic_and_exact_per_period(self):
    ids, within, per = megatron_dataset.blend_schedule([0.3, 0.7], 1000)
    self.assertEqual(per.tolist(), [300, 700])
    for d in (0, 1):
      np.testing.assert_array_equal(within[ids == d], np.arange(per[d]))

  def test_order_is_seeded(self):
    first = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config())
    )
    again = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config())
    )
    other = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config(data_shuffle_seed=1))
    )
    for step in (0, 3):
      np.testing.assert_array_equal(
          first.get_batch(step)["inputs"], again.get_batch(step)["inputs"]
      )
    self.assertFalse(
        np.array_equal(
            first.get_batch(0)["inputs"], other.get_batch(0)["inputs"]
        )
    )

  def test_processes_read_their_share_of_the_global_batch(self):
    config = self._config()
    whole = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(config)
    ).get_batch(2)["inputs"]
    halves = [
        megatron_dataset.MegatronDataset(
            data_config.DataConfig.from_config(config), i, 2
        ).get_batch(2)["inputs"]
        for i in range(2)
    ]
    np.testing.assert_array_equal(np.concatenate(halves), whole)

  def test_eval_set_is_the_first_n_validation_rows_in_order(self):
    ds = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config())
    )
    stream = _stream(self.val_docs)
    batch = ds.get_eval_batch(0)
    for r in range(8):
      np.testing.assert_array_equal(
          batch["inputs"][r], stream[r * _SEQ : r * _SEQ + _SEQ]
      )
      np.testing.assert_array_equal(
          batch["targets"][r], stream[r * _SEQ + 1 : r * _SEQ + _SEQ + 1]
      )
    with self.assertRaisesRegex(ValueError, "past the eval set's 8"):
      ds.get_eval_batch(1)

  def test_eval_samples_must_be_read_whole(self):
    with self.assertRaisesRegex(
        ValueError,
        "megatron_eval_samples=16.*eval_steps \\* eval_batch_size is 8",
    ):
      config_lib.validate(self._config(megatron_eval_samples=16))
    config_lib.validate(self._config(megatron_eval_samples=8))

  def test_too_few_validation_rows_for_the_eval_set(self):
    rows = (len(_stream(self.val_docs)) - 1) // _SEQ
    config = self._config(
        megatron_eval_samples=0, eval_batch_size=8, eval_steps=rows // 8 + 1
    )
    config_lib.validate(config)
    with self.assertRaisesRegex(
        ValueError,
        f"^config.eval_data_path: {self.val}.bin: holds {rows} sequences",
    ):
      preflight.check(preflight.PreflightConfig.from_config(config))

  def test_preflight_names_a_bad_file(self):
    broken = os.path.join(self.create_tempdir().full_path, "broken")
    megatron_index.write(broken, self.a_docs)
    with open(broken + ".bin", "r+b") as f:
      f.truncate(100)
    config = self._config(train_data_path=f"0.5 {self.a} 0.5 {broken}")
    config_lib.validate(config)
    with self.assertRaises(ValueError) as caught:
      preflight.check(preflight.PreflightConfig.from_config(config))
    message = str(caught.exception)
    self.assertNotIn("\n", message)
    self.assertRegex(
        message,
        f"^config.train_data_path: {broken}.bin: shorter than its index says",
    )

  def test_relative_prefixes_of_a_blend_are_the_callers(self):
    config = self._config(train_data_path="0.3 data/a 0.7 /abs/b")
    resolved = run_dir.resolved_input_paths(
        run_dir.RunDirConfig.from_config(config),
        {caller_paths.CALLER_DIR_ENV: "/home/me"},
    )
    self.assertEqual(
        resolved["train_data_path"], "0.3 /home/me/data/a 0.7 /abs/b"
    )

  def test_bad_data_path_lists(self):
    for text, pattern in (
        (f"0.5 {self.a} 0.5", "odd number of words"),
        (f"half {self.a} 0.5 {self.b}", "'half' is no weight"),
        (f"0 {self.a} 1 {self.b}", "weight 0 must be > 0"),
    ):
      with self.assertRaisesRegex(ValueError, pattern):
        megatron_dataset.parse_data_path(text)

  def test_an_id_at_or_above_the_vocabulary_is_refused_before_training(self):
    path = os.path.join(self.create_tempdir().full_path, "oov")
    docs = [[[1, 2, 3] * 10]] * 3 + [[[4, _VOCAB + 7, _VOCAB]]]
    megatron_index.write(path, docs, np.int32)
    config = self._config("oov", train_data_path=f"0.5 {self.a} 0.5 {path}")
    with self.assertRaises(trainer.ConfigError) as caught:
      workloads.run(config)
    message = str(caught.exception)
    self.assertNotIn("\n", message)
    self.assertEqual(
        message,
        f"config.train_data_path: {path}.bin: token 91 of its stream is "
        f"{_VOCAB + 7}, at or above vocab_size={_VOCAB}; check vocab_size "
        "and the data",
    )
    # Refused before the run made anything.
    self.assertFalse(os.path.exists(os.path.join(self.root, "oov")))

  def test_every_kind_of_bad_token_names_the_field_and_the_file(self):
    directory = self.create_tempdir().full_path
    for name, docs, dtype, field, problem in (
        ("negative", [[[-3] * 40]], np.int16, "eval_data_path",
         "token 0 of its stream is -3, negative (vocab_size=32)"),
        ("fraction", [[[1.0] * 20 + [0.5] * 20]], np.float32,
         "train_data_path",
         "token 20 of its stream is 0.5, not a whole number (vocab_size=32)"),
    ):  # fmt: skip
      path = os.path.join(directory, name)
      megatron_index.write(path, docs, dtype)
      config = self._config(**{field: path})
      config_lib.validate(config)
      with self.assertRaisesRegex(
          ValueError, re.escape(f"config.{field}: {path}.bin: {problem}; ")
      ):
        preflight.check(preflight.PreflightConfig.from_config(config))
      with self.assertRaisesRegex(ValueError, f"^config.{field}: {path}.bin"):
        megatron_dataset.MegatronDataset(
            data_config.DataConfig.from_config(config)
        )

  def test_a_file_changed_after_it_was_checked_is_caught_in_its_rows(self):
    path = os.path.join(self.create_tempdir().full_path, "changed")
    megatron_index.write(path, [[list(range(30)) * 2]], np.int32)
    ds = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config(train_data_path=path))
    )
    ds.get_batch(0)
    with open(path + ".bin", "r+b") as f:
      f.write(np.full((60,), 99, np.int32).tobytes())
    with self.assertRaisesRegex(
        ValueError, f"^{path}.bin: holds tokens that are no id of a "
    ):
      ds.get_batch(1)
    # Opened again, the changed file is read again and refused.
    os.utime(path + ".bin", ns=(1, 1))
    with self.assertRaisesRegex(
        ValueError, f"^config.train_data_path: {path}.bin: token 0 of its "
    ):
      megatron_dataset.MegatronDataset(
          data_config.DataConfig.from_config(self._config(train_data_path=path))
      )

  def test_restored_state_is_where_the_next_batch_starts(self):
    ds = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config())
    )
    state = ds.checkpoint_state(3)
    self.assertEqual(state["next_sample"], 24)
    fresh = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config())
    )
    fresh.restore_checkpoint_state(state)
    with self.assertRaisesRegex(ValueError, "reads on at sample 24; step 2"):
      fresh.get_batch(2)
    fresh.restore_checkpoint_state(state)
    np.testing.assert_array_equal(
        fresh.get_batch(3)["inputs"], ds.get_batch(3)["inputs"]
    )
    with self.assertRaisesRegex(
        ValueError, "global_batch_size=8; this run has 16"
    ):
      megatron_dataset.MegatronDataset(
          data_config.DataConfig.from_config(self._config(global_batch_size=16))
      ).restore_checkpoint_state(state)

  def test_provenance_fingerprints_every_file(self):
    prov = megatron_dataset.MegatronDataset(
        data_config.DataConfig.from_config(self._config())
    ).provenance()
    paths = sorted(f["path"] for f in prov["megatron"]["files"])
    self.assertEqual(
        paths,
        sorted(
            os.path.abspath(p + ext)
            for p in (self.a, self.b, self.val)
            for ext in (".idx", ".bin")
        ),
    )
    train = prov["tokens_files"]["train_data_path"]
    self.assertEqual(
        train["size"],
        sum(
            os.path.getsize(p + ext)
            for p in (self.a, self.b)
            for ext in (".idx", ".bin")
        ),
    )

  def test_deepseekv3_671b_names_the_benchmarks_eval_set(self):
    config = deepseekv3_671b.get_config()
    self.assertEqual(eval_set.problem(_mlperf(config)), "")
    self.assertEqual(config.megatron_eval_samples, 1024)
    config.dataset_type = "tokens_file"
    with self.assertRaisesRegex(ValueError, "dataset_type='tokens_file'"):
      eval_set.check(_mlperf(config))
    config.dataset_type = "megatron"
    config.megatron_eval_samples = 0
    with self.assertRaisesRegex(ValueError, "megatron_eval_samples=0"):
      eval_set.check(_mlperf(config))

  def test_resume_reads_the_batches_of_an_uninterrupted_run(self):
    reference = workloads.run(self._config("reference", 6))
    self.assertEqual(reference.final_step, 6)
    first = workloads.run(self._config("resumed", 3))
    self.assertEqual(first.final_step, 3)
    state = data_state.load(os.path.join(first.run_dir, "checkpoints"), 3, 0)
    self.assertEqual((state["kind"], state["next_sample"]), ("megatron", 24))
    second = workloads.run(self._config("resumed", 6))
    self.assertEqual(second.start_step, 3)
    self.assertEqual(
        run_layout.untimed_records(second.run_dir),
        run_layout.untimed_records(reference.run_dir),
    )

  def test_resume_on_changed_data_is_refused(self):
    path = os.path.join(self.create_tempdir().full_path, "c")
    megatron_index.write(path, self.a_docs)
    workloads.run(self._config("changed", 3, train_data_path=path))
    megatron_index.write(path, self.b_docs)
    with self.assertRaisesRegex(
        ValueError, f"config.train_data_path='{path}': .*bytes recorded"
    ):
      workloads.run(self._config("changed", 6, train_data_path=path))


if __name__ == "__main__":
  absltest.main()
