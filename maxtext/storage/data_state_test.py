"""Tests for maxtext.storage.data_state, with real files."""

import os

from absl.testing import absltest

from maxtext.storage import data_state


class DataStateTest(absltest.TestCase):

  def test_save_load_per_process(self):
    root = self.create_tempdir().full_path
    for index in (0, 1):
      data_state.save(root, 8, index, {"kind": "grain", "index": index})
    self.assertEqual(data_state.load(root, 8, 1), {"kind": "grain", "index": 1})
    self.assertIsNone(data_state.load(root, 4, 0))  # Never saved.
    self.assertEqual(
        sorted(os.listdir(os.path.join(root, data_state.DIRNAME, "8"))),
        ["process_0.json", "process_1.json"],
    )

  def test_prune_keeps_the_checkpointed_steps(self):
    root = self.create_tempdir().full_path
    for step in (4, 8, 12):
      data_state.save(root, step, 0, {"step": step})
    data_state.prune(root, [8, 12])
    self.assertIsNone(data_state.load(root, 4, 0))
    self.assertEqual(data_state.load(root, 12, 0), {"step": 12})

  def test_malformed_state_is_named(self):
    root = self.create_tempdir().full_path
    path = data_state.save(root, 3, 0, {"a": 1})
    with open(path, "w", encoding="utf-8") as f:
      f.write("{not json")
    with self.assertRaisesRegex(ValueError, f"{path} is malformed"):
      data_state.load(root, 3, 0)

  def test_remote_checkpoint_directory_holds_no_state(self):
    self.assertIsNone(data_state.save("gs://b/ckpt", 1, 0, {"a": 1}))
    self.assertIsNone(data_state.load("gs://b/ckpt", 1, 0))


if __name__ == "__main__":
  absltest.main()
