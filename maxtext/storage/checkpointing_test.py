"""Tests for maxtext.storage.checkpointing: real orbax checkpoints, temp dirs.

Damaged checkpoints are real ones damaged on disk; a full disk is a real
1 MiB tmpfs mounted in a user and mount namespace (`unshare -Urm`).
"""

import asyncio
import errno
import gc
import glob
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import progress
from maxtext.storage import checkpointing
from maxtext.storage import checksums
from testing import process_output
from testing import tmpfs


def make_state(scale: float, sharding: jax.sharding.Sharding):
  """A small train state shaped like the trainer's, placed on `sharding`."""

  def put(x):
    return jax.device_put(x, sharding)

  return {
      "params": {
          "embed": put(jnp.arange(12, dtype=jnp.float32).reshape(3, 4) * scale),
          "layer": {"w": put(jnp.full((4, 2), scale, jnp.float32))},
      },
      "opt_state": {
          "mu": put(jnp.ones((4, 2), jnp.float32) * -scale),
          "count": put(jnp.asarray(int(scale), jnp.int32)),
      },
      "step": put(jnp.asarray(int(scale), jnp.int32)),
  }


def make_big_state(scale: float, sharding: jax.sharding.Sharding):
  """`make_state` plus a 64 KiB array.

  OCDBT stores small arrays inline in its b-tree nodes; this one lands in
  a data file of its own, so damaging that file damages the checkpoint.
  """
  state = make_state(scale, sharding)
  state["params"]["big"] = jax.device_put(
      jnp.arange(256 * 64, dtype=jnp.float32).reshape(256, 64) * scale, sharding
  )
  return state


def _largest_data_file(step_dir):
  files = glob.glob(
      os.path.join(step_dir, "state", "**", "d", "*"), recursive=True
  )
  return max(files, key=os.path.getsize)


def _truncate_data_file(step_dir):
  path = _largest_data_file(step_dir)
  os.truncate(path, os.path.getsize(path) // 2)


def _overwrite_data_file(step_dir):
  path = _largest_data_file(step_dir)
  with open(path, "wb") as f:
    f.write(b"\x5a" * os.path.getsize(path))


def flip_bytes(path, every=4096):
  """Inverts one byte in every `every` of the file at `path` (same size)."""
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    for i in range(0, len(data), every):
      data[i] ^= 0xFF
    f.seek(0)
    f.write(data)


def _flip_data_file(step_dir):
  flip_bytes(_largest_data_file(step_dir))


def _remover(*parts):
  return lambda step_dir: os.remove(os.path.join(step_dir, *parts))


# Ways a checkpoint step directory gets damaged, as seen in the field.
DAMAGES = (
    ("truncated_data_file", _truncate_data_file),
    ("overwritten_data_file", _overwrite_data_file),
    ("no_tree_metadata", _remover("state", "_METADATA")),
    ("no_metadata_item", _remover("metadata", "metadata")),
    ("no_manifest", _remover("state", "manifest.ocdbt")),
    # Same size, other bytes: only the checksums see it.
    ("flipped_data_file", _flip_data_file),
)


def snapshot(directory):
  """Relative path -> bytes of every file under `directory`."""
  files = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, directory)] = f.read()
  return files


def abstract_like(tree, sharding):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
  )


class CheckpointingTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.directory = os.path.join(
        self.create_tempdir().full_path, "checkpoints"
    )
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp")
    )
    self.sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()
    )

  def make_checkpointer(self, directory=None, **kwargs):
    args = dict(save_period=1, max_to_keep=0)
    args.update(kwargs)
    ckpt = checkpointing.Checkpointer(directory or self.directory, **args)
    self.addCleanup(ckpt.close)
    return ckpt

  def test_open_removes_what_a_killed_save_left(self):
    ckpt = self.make_checkpointer()
    ckpt.save(2, make_state(1.0, self.sharding), {}, force=True)
    ckpt.close()
    leftover = os.path.join(self.directory, "4.orbax-checkpoint-tmp-99")
    os.makedirs(os.path.join(leftover, "state"))
    reopened = self.make_checkpointer()
    self.assertFalse(os.path.exists(leftover))
    self.assertEqual(reopened.all_steps(), [2])

  def test_round_trip_onto_shardings(self):
    ckpt = self.make_checkpointer()
    state = make_state(3.0, self.sharding)
    metadata = {"samples_count": 96, "skipped_steps": 1, "note": None}
    self.assertTrue(ckpt.save(3, state, metadata))
    ckpt.wait()
    target = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    restored, restored_metadata = ckpt.restore(3, abstract_like(state, target))
    chex.assert_trees_all_equal(restored, state)
    chex.assert_trees_all_equal_shapes_and_dtypes(restored, state)
    self.assertEqual(restored_metadata, metadata)
    for leaf in jax.tree.leaves(restored):
      self.assertIsInstance(leaf, jax.Array)
      self.assertEqual(leaf.sharding, target)

  def test_progress_of_checksums_verification_and_restore(self):
    lines = []
    ticks = itertools.count(0.0, 5.0)  # Each reading of the clock 5 s on.
    reporter = progress.Reporter(
        progress.Lines(lines.append), interval_s=5.0, clock=lambda: next(ticks)
    )
    ckpt = self.make_checkpointer(progress=reporter)
    state = make_big_state(3.0, self.sharding)
    ckpt.save(3, state, {})
    ckpt.wait()
    with open(
        os.path.join(self.directory, "3", checksums.MANIFEST), encoding="utf-8"
    ) as f:
      files = json.load(f)["files"]
    size = progress.format_bytes(sum(f["size"] for f in files.values()))
    n = len(files)

    def job(prefix):
      return [line for line in lines if line.startswith(prefix)]

    # Written at save: a line after each file (5 s apart), then the last.
    written = job("checkpoint step 3: checksums: ")
    self.assertLen(written, n + 1)
    for i, line in enumerate(written[:-1], 1):
      self.assertTrue(line.endswith(f"; files {i}/{n}"), line)
    self.assertRegex(
        written[-1],
        rf"^checkpoint step 3: checksums: done, {size} in .*; files {n}/{n}$",
    )
    ckpt.restore(3, abstract_like(state, self.sharding))
    checked = job("checkpoint step 3: verifying: ")
    self.assertLen(checked, n + 1)
    self.assertRegex(
        checked[-1],
        rf"^checkpoint step 3: verifying: done, {size} in .*; files {n}/{n}$",
    )
    # Orbax's own work says its elapsed time, from a thread, as it is due.
    others = [line for line in lines if line not in written + checked]
    for line in others:
      self.assertRegex(
          line,
          r"^checkpoint step 3: (saving|writing|restoring)( \([\d.]+ KiB\))?: "
          r"(\d+ s elapsed|\d+m \d+s elapsed|done in .*)$",
      )

  def test_restore_casts_to_requested_dtype(self):
    ckpt = self.make_checkpointer()
    state = make_state(2.0, self.sharding)
    ckpt.save(2, state, {})
    abstract = abstract_like(state, self.sharding)
    abstract["params"]["embed"] = jax.ShapeDtypeStruct(
        (3, 4), jnp.bfloat16, sharding=self.sharding
    )
    restored, _ = ckpt.restore(2, abstract)
    self.assertEqual(restored["params"]["embed"].dtype, jnp.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(restored["params"]["embed"], np.float32),
        np.asarray(state["params"]["embed"]),
    )

  def test_save_period_force_and_latest_step(self):
    ckpt = self.make_checkpointer(save_period=2)
    self.assertIsNone(ckpt.latest_step())
    self.assertEqual(
        [ckpt.due(step) for step in range(1, 6)],
        [False, True, False, True, False],
    )
    state = make_state(1.0, self.sharding)
    self.assertFalse(ckpt.save(1, state, {}))
    self.assertTrue(ckpt.save(2, state, {}))
    self.assertFalse(ckpt.save(3, state, {}))
    self.assertTrue(ckpt.save(3, state, {}, force=True))
    # The same step again (e.g. a final forced save right after a periodic
    # one) is skipped, not an error.
    self.assertFalse(ckpt.save(3, state, {}, force=True))
    ckpt.wait()
    self.assertEqual(ckpt.all_steps(), [2, 3])
    self.assertEqual(ckpt.latest_step(), 3)
    ckpt.close()
    # A new run on the same directory (resume) sees the same checkpoints.
    reopened = self.make_checkpointer()
    self.assertEqual(reopened.latest_step(), 3)
    restored, _ = reopened.restore(3, abstract_like(state, self.sharding))
    chex.assert_trees_all_equal(restored, state)

  def test_max_to_keep_retention(self):
    ckpt = self.make_checkpointer(max_to_keep=2)
    for step in range(1, 6):
      ckpt.save(
          step,
          make_state(float(step), self.sharding),
          {"samples_count": step * 8},
      )
    ckpt.wait()
    self.assertEqual(ckpt.all_steps(), [4, 5])
    on_disk = sorted(int(n) for n in os.listdir(self.directory) if n.isdigit())
    self.assertEqual(on_disk, [4, 5])
    restored, metadata = ckpt.restore(
        4, abstract_like(make_state(4.0, self.sharding), self.sharding)
    )
    chex.assert_trees_all_equal(restored, make_state(4.0, self.sharding))
    self.assertEqual(metadata, {"samples_count": 32})

  def test_params_only_restore_from_latest_and_from_step_directory(self):
    ckpt = self.make_checkpointer()
    ckpt.save(1, make_state(1.0, self.sharding), {})
    ckpt.save(2, make_state(2.0, self.sharding), {})
    ckpt.close()
    abstract_params = abstract_like(
        make_state(0.0, self.sharding)["params"], self.sharding
    )

    latest = checkpointing.restore_params_only(self.directory, abstract_params)
    chex.assert_trees_all_equal(
        latest, make_state(2.0, self.sharding)["params"]
    )
    self.assertEqual(
        jax.tree.structure(latest), jax.tree.structure(abstract_params)
    )
    for leaf in jax.tree.leaves(latest):
      self.assertEqual(leaf.sharding, self.sharding)

    first = checkpointing.restore_params_only(
        os.path.join(self.directory, "1"), abstract_params
    )
    chex.assert_trees_all_equal(first, make_state(1.0, self.sharding)["params"])

  def test_params_only_restore_of_another_shape_names_the_leaf(self):
    ckpt = self.make_checkpointer()
    ckpt.save(1, make_state(1.0, self.sharding), {})
    ckpt.close()
    params = make_state(0.0, self.sharding)["params"]
    # Another vocabulary: one more row of the embedding.
    params["embed"] = jnp.zeros((4, 4), jnp.float32)
    with self.assertRaisesRegex(
        ValueError,
        r"abstract_state\['params'\]\['embed'\] has shape \(4, 4\) but "
        r"checkpoint step 1 holds shape \(3, 4\)",
    ):
      checkpointing.restore_params_only(
          self.directory, abstract_like(params, self.sharding)
      )

  def test_missing_and_empty_directories_name_the_path(self):
    abstract_params = abstract_like(
        make_state(0.0, self.sharding)["params"], self.sharding
    )
    missing = os.path.join(self.create_tempdir().full_path, "nowhere")
    with self.assertRaisesRegex(FileNotFoundError, f"{missing} does not exist"):
      checkpointing.restore_params_only(missing, abstract_params)
    empty = self.create_tempdir().full_path
    with self.assertRaisesRegex(
        FileNotFoundError, f"{empty} holds no checkpoint"
    ):
      checkpointing.restore_params_only(empty, abstract_params)
    self.assertFalse(os.path.exists(missing))

  def test_restore_missing_step_names_directory_and_steps(self):
    ckpt = self.make_checkpointer()
    state = make_state(1.0, self.sharding)
    ckpt.save(1, state, {})
    with self.assertRaisesRegex(
        FileNotFoundError, rf"step 7 in {self.directory}.*\[1\]"
    ):
      ckpt.restore(7, abstract_like(state, self.sharding))

  def test_abstract_leaf_without_sharding_is_rejected(self):
    ckpt = self.make_checkpointer()
    state = make_state(1.0, self.sharding)
    ckpt.save(1, state, {})
    abstract = abstract_like(state, self.sharding)
    abstract["opt_state"]["mu"] = jax.ShapeDtypeStruct((4, 2), jnp.float32)
    with self.assertRaisesRegex(
        ValueError, r"\['opt_state'\]\['mu'\].*sharding"
    ):
      ckpt.restore(1, abstract)

  @parameterized.named_parameters(
      ("zero_period", dict(save_period=0), ValueError, "save_period"),
      ("float_period", dict(save_period=1.5), TypeError, "save_period"),
      ("negative_keep", dict(max_to_keep=-1), ValueError, "max_to_keep"),
      ("empty_directory", dict(directory=""), ValueError, "directory"),
  )
  def test_bad_constructor_arguments(self, override, error, regex):
    args = dict(directory=self.directory, save_period=1, max_to_keep=1)
    args.update(override)
    with self.assertRaisesRegex(error, regex):
      checkpointing.Checkpointer(**args)

  @parameterized.named_parameters(
      ("negative_step", -1, {}, ValueError, "step"),
      ("array_metadata", 1, {"x": np.ones(2)}, TypeError, "metadata"),
      ("nan_metadata", 1, {"loss": float("nan")}, ValueError, "metadata"),
      ("non_str_key", 1, {1: 2}, TypeError, "metadata keys"),
  )
  def test_bad_save_arguments_save_nothing(self, step, metadata, error, regex):
    ckpt = self.make_checkpointer()
    with self.assertRaisesRegex(error, regex):
      ckpt.save(step, make_state(1.0, self.sharding), metadata)
    ckpt.wait()
    self.assertEqual(ckpt.all_steps(), [])

  def test_closed_checkpointer_refuses_work(self):
    ckpt = self.make_checkpointer()
    ckpt.close()
    ckpt.close()
    with self.assertRaisesRegex(RuntimeError, "closed"):
      ckpt.save(1, make_state(1.0, self.sharding), {})


class RestoreNewestTest(parameterized.TestCase):
  """restore_newest over real checkpoints damaged on disk."""

  def setUp(self):
    super().setUp()
    self.directory = os.path.join(
        self.create_tempdir().full_path, "checkpoints"
    )
    self.sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    self.abstract = abstract_like(
        make_big_state(0.0, self.sharding), self.sharding
    )

  def write_steps(self, *steps, directory=None, run_id=None):
    with checkpointing.Checkpointer(
        directory or self.directory,
        save_period=1,
        max_to_keep=0,
        run_id=run_id,
    ) as ckpt:
      for step in steps:
        ckpt.save(
            step,
            make_big_state(float(step), self.sharding),
            {"samples_count": step * 8},
        )

  def make_checkpointer(self, run_id=None):
    ckpt = checkpointing.Checkpointer(
        self.directory, save_period=1, max_to_keep=0, run_id=run_id
    )
    self.addCleanup(ckpt.close)
    return ckpt

  def test_no_checkpoint_gives_none(self):
    self.assertIsNone(self.make_checkpointer().restore_newest(self.abstract))

  def test_intact_newest_is_restored(self):
    self.write_steps(4, 8)
    restored = self.make_checkpointer().restore_newest(self.abstract)
    self.assertEqual(restored.step, 8)
    self.assertEqual(restored.set_aside, ())
    self.assertEqual(restored.metadata, {"samples_count": 64})
    chex.assert_trees_all_equal(
        restored.state, make_big_state(8.0, self.sharding)
    )

  @parameterized.named_parameters(*DAMAGES)
  def test_damaged_newest_is_set_aside(self, damage):
    self.write_steps(4, 8)
    damage(os.path.join(self.directory, "8"))
    damaged_files = snapshot(os.path.join(self.directory, "8"))
    ckpt = self.make_checkpointer()
    with self.assertLogs(level="WARNING") as logs:
      restored = ckpt.restore_newest(self.abstract)

    self.assertEqual(restored.step, 4)
    self.assertEqual(restored.metadata, {"samples_count": 32})
    chex.assert_trees_all_equal(
        restored.state, make_big_state(4.0, self.sharding)
    )
    self.assertLen(restored.set_aside, 1)
    entry = restored.set_aside[0]
    self.assertEqual(entry.step, 8)
    self.assertRegex(
        os.path.basename(entry.moved_to), r"^8\.corrupt-\d{8}T\d{6}Z$"
    )
    self.assertNotIn("\n", entry.reason)
    # Moved, not deleted: every file as the damage left it.
    self.assertEqual(snapshot(entry.moved_to), damaged_files)
    self.assertFalse(os.path.exists(os.path.join(self.directory, "8")))
    warnings = [
        r.getMessage()
        for r in logs.records
        if "cannot be restored" in r.getMessage()
    ]
    self.assertLen(warnings, 1)
    self.assertIn("step 8", warnings[0])
    self.assertIn(entry.reason, warnings[0])
    self.assertIn(entry.moved_to, warnings[0])
    # orbax no longer lists it, here or in a new run.
    self.assertEqual(ckpt.all_steps(), [4])
    self.assertEqual(ckpt.latest_step(), 4)
    ckpt.close()
    reopened = self.make_checkpointer()
    self.assertEqual(reopened.all_steps(), [4])
    self.assertEqual(reopened.restore_newest(self.abstract).step, 4)
    # Saving step 8 again works beside the set-aside copy.
    self.assertTrue(reopened.save(8, make_big_state(8.0, self.sharding), {}))
    reopened.wait()
    self.assertEqual(reopened.all_steps(), [4, 8])

  def test_every_step_carries_checksums_of_its_items(self):
    self.write_steps(4)
    step_dir = os.path.join(self.directory, "4")
    with open(
        os.path.join(step_dir, checksums.MANIFEST), encoding="utf-8"
    ) as f:
      files = json.load(f)["files"]
    on_disk = sorted(
        os.path.relpath(os.path.join(root, name), step_dir)
        for item in ("state", "metadata")
        for root, _, names in os.walk(os.path.join(step_dir, item))
        for name in names
    )
    self.assertEqual(sorted(files), on_disk)
    self.assertIn("metadata/metadata", files)

  def test_flipped_bytes_are_set_aside_naming_the_file(self):
    self.write_steps(4, 8)
    data_file = _largest_data_file(os.path.join(self.directory, "8"))
    flip_bytes(data_file)
    ckpt = self.make_checkpointer()
    with self.assertLogs(level="WARNING"):
      restored = ckpt.restore_newest(self.abstract)
    self.assertEqual(restored.step, 4)
    chex.assert_trees_all_equal(
        restored.state, make_big_state(4.0, self.sharding)
    )
    (entry,) = restored.set_aside
    self.assertEqual(
        entry.reason,
        f"ChecksumError: checkpoint step 8: {data_file} is damaged "
        + re.search(r"\(crc32c .*", entry.reason).group(0),
    )
    self.assertRegex(
        entry.reason, r"\(crc32c [0-9a-f]{8}, [0-9a-f]{8} recorded at save\)$"
    )

  def test_an_edited_metadata_value_is_damage(self):
    # JSON that still parses, holding another number: read silently
    # without the checksums.
    self.write_steps(4, 8)
    path = os.path.join(self.directory, "8", "metadata", "metadata")
    with open(path, encoding="utf-8") as f:
      text = f.read()
    self.assertIn("64", text)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text.replace("64", "65"))
    with self.assertLogs(level="WARNING"):
      restored = self.make_checkpointer().restore_newest(self.abstract)
    self.assertEqual(restored.step, 4)
    self.assertIn(f"{path} is damaged", restored.set_aside[0].reason)

  def test_a_checkpoint_without_checksums_restores_unverified(self):
    # A run of before checksums: none of its steps has them.
    self.write_steps(4, 8)
    for step in (4, 8):
      os.remove(os.path.join(self.directory, str(step), checksums.MANIFEST))
    with self.assertLogs(level="WARNING") as logs:
      restored = self.make_checkpointer().restore_newest(self.abstract)
    self.assertEqual(restored.step, 8)
    self.assertEqual(restored.set_aside, ())
    self.assertIn(
        f"checkpoint step 8 in {self.directory} has no checksums.json "
        "(written before checkpoints carried checksums): read unverified",
        [r.getMessage() for r in logs.records],
    )

  def _restored_past(self, step: int, run_id=None) -> str:
    """Restores, checks that `step` was set aside for step 4; its reason."""
    with self.assertLogs(level="WARNING"):
      restored = self.make_checkpointer(run_id).restore_newest(self.abstract)
    self.assertEqual(restored.step, 4)
    chex.assert_trees_all_equal(
        restored.state, make_big_state(4.0, self.sharding)
    )
    (entry,) = restored.set_aside
    self.assertEqual(entry.step, step)
    self.assertNotIn("\n", entry.reason)
    return entry.reason

  def test_a_missing_manifest_beside_others_is_damage(self):
    self.write_steps(4, 8)
    manifest = os.path.join(self.directory, "8", checksums.MANIFEST)
    os.remove(manifest)
    self.assertEqual(
        self._restored_past(8),
        f"ChecksumError: checkpoint step 8: {manifest} is missing, and "
        "every checkpoint of this run carries one",
    )

  def test_every_save_names_its_run_and_step(self):
    self.write_steps(4, run_id="run-a")
    with open(
        os.path.join(self.directory, "4", checksums.MANIFEST), encoding="utf-8"
    ) as f:
      manifest = json.load(f)
    self.assertEqual((manifest["run_id"], manifest["step"]), ("run-a", 4))
    restored = self.make_checkpointer("run-a").restore_newest(self.abstract)
    self.assertEqual((restored.step, restored.set_aside), (4, ()))

  def test_another_runs_step_is_set_aside(self):
    self.write_steps(4, run_id="run-a")
    elsewhere = os.path.join(self.create_tempdir().full_path, "other")
    self.write_steps(8, directory=elsewhere, run_id="run-b")
    shutil.copytree(
        os.path.join(elsewhere, "8"), os.path.join(self.directory, "8")
    )
    self.assertIn(
        "names run 'run-b', not this run (run-a): a checkpoint of another "
        "run",
        self._restored_past(8, "run-a"),
    )

  def test_the_latest_own_step_passes_over_another_runs(self):
    self.write_steps(4, run_id="run-a")
    elsewhere = os.path.join(self.create_tempdir().full_path, "other")
    self.write_steps(8, directory=elsewhere, run_id="run-b")
    shutil.copytree(
        os.path.join(elsewhere, "8"), os.path.join(self.directory, "8")
    )
    ckpt = self.make_checkpointer("run-a")
    self.assertEqual(ckpt.latest_step(), 8)
    self.assertEqual(ckpt.latest_own_step(), 4)
    self.assertEqual(self.make_checkpointer("run-b").latest_own_step(), 8)

  def test_a_step_without_a_run_in_a_run_with_one_is_set_aside(self):
    self.write_steps(4, run_id="run-a")
    self.write_steps(8)
    self.assertIn("names no run", self._restored_past(8, "run-a"))
    # Nor does a run with an id read a step without checksums.
    self.write_steps(12, run_id="run-a")
    os.remove(os.path.join(self.directory, "12", checksums.MANIFEST))
    self.assertIn("is missing", self._restored_past(12, "run-a"))

  def test_a_step_directory_copied_over_a_newer_one_is_set_aside(self):
    self.write_steps(4, 8, run_id="run-a")
    newer = os.path.join(self.directory, "8")
    shutil.rmtree(newer)
    shutil.copytree(os.path.join(self.directory, "4"), newer)
    self.assertIn("records step 4: a step directory copied over another",
                  self._restored_past(8, "run-a"))  # fmt: skip

  def test_params_only_restore_refuses_flipped_bytes_in_one_line(self):
    self.write_steps(4, 8)
    data_file = _largest_data_file(os.path.join(self.directory, "8"))
    flip_bytes(data_file)
    abstract_params = self.abstract["params"]
    with self.assertRaises(checksums.ChecksumError) as caught:
      checkpointing.restore_params_only(self.directory, abstract_params)
    message = str(caught.exception)
    self.assertNotIn("\n", message)
    self.assertStartsWith(
        message, f"checkpoint step 8: {data_file} is damaged (crc32c "
    )
    # The intact older step still loads, named as a step directory.
    params = checkpointing.restore_params_only(
        os.path.join(self.directory, "4"), abstract_params
    )
    chex.assert_trees_all_equal(
        params, make_big_state(4.0, self.sharding)["params"]
    )

  def test_every_checkpoint_damaged_lists_each(self):
    self.write_steps(4, 8)
    _truncate_data_file(os.path.join(self.directory, "8"))
    os.remove(os.path.join(self.directory, "4", "metadata", "metadata"))
    ckpt = self.make_checkpointer()
    with self.assertRaises(checkpointing.CheckpointError) as raised:
      ckpt.restore_newest(self.abstract)
    message = str(raised.exception)
    self.assertIsInstance(raised.exception, RuntimeError)
    self.assertNotIn("\n", message)
    self.assertRegex(
        message,
        rf"^no checkpoint in {re.escape(self.directory)} could be restored: "
        r"step 8 \(moved to .*8\.corrupt-.*\): .*; "
        r"step 4 \(moved to .*4\.corrupt-.*\): .*metadata",
    )
    self.assertEqual(ckpt.all_steps(), [])
    self.assertLen(glob.glob(os.path.join(self.directory, "*.corrupt-*")), 2)

  def test_partial_step_is_set_aside_at_open_not_restored(self):
    self.write_steps(4, 8)
    # What a bucket holds when an upload stopped before the commit marker.
    os.remove(os.path.join(self.directory, "8", checkpointing.COMMIT_MARKER))
    partial_files = snapshot(os.path.join(self.directory, "8"))
    with self.assertLogs(level="WARNING") as logs:
      ckpt = self.make_checkpointer()
    self.assertEqual(ckpt.all_steps(), [4])
    (entry,) = ckpt.partial
    self.assertEqual(entry.step, 8)
    self.assertRegex(
        os.path.basename(entry.moved_to), r"^8\.partial-\d{8}T\d{6}Z$"
    )
    self.assertEqual(snapshot(entry.moved_to), partial_files)
    self.assertRegex(
        "\n".join(logs.output),
        r"step 8 .* is partial: no commit_success\.txt .* moved it aside",
    )
    restored = ckpt.restore_newest(self.abstract)
    self.assertEqual((restored.step, restored.set_aside), (4, ()))
    self.assertEqual(glob.glob(os.path.join(self.directory, "*.corrupt-*")), [])

  @parameterized.named_parameters(
      (
          "shape",
          lambda a: a["params"].update(
              big=a["params"]["big"].update(shape=(128, 64))
          ),
          r"abstract_state\['params'\]\['big'\] has shape \(128, 64\) but "
          r"checkpoint step 8 holds shape \(256, 64\)",
      ),
      (
          "extra_leaf",
          lambda a: a["params"].update(extra=a["params"]["big"]),
          r"abstract_state\['params'\]\['extra'\] is not in checkpoint step 8",
      ),
      (
          "missing_leaf",
          lambda a: a["opt_state"].pop("mu"),
          r"checkpoint step 8 holds \['opt_state'\]\['mu'\]",
      ),
  )
  def test_config_change_is_not_damage(self, change, regex):
    self.write_steps(4, 8)
    before = snapshot(self.directory)
    change(self.abstract)
    ckpt = self.make_checkpointer()
    with self.assertRaisesRegex(ValueError, regex):
      ckpt.restore_newest(self.abstract)
    with self.assertRaisesRegex(ValueError, regex):
      ckpt.restore(8, self.abstract)
    self.assertEqual(snapshot(self.directory), before)
    self.assertEqual(ckpt.all_steps(), [4, 8])

  def test_dtype_change_is_a_cast_not_an_error(self):
    self.write_steps(8)
    self.abstract["params"]["big"] = jax.ShapeDtypeStruct(
        (256, 64), jnp.bfloat16, sharding=self.sharding
    )
    restored = self.make_checkpointer().restore_newest(self.abstract)
    self.assertEqual(restored.step, 8)
    self.assertEqual(restored.state["params"]["big"].dtype, jnp.bfloat16)


# Run inside a 1 MiB tmpfs: saves a 4 MiB array, then reaches the point
# (`mode`) where orbax reports the background write's failure.
_FULL_DISK_CHILD = textwrap.dedent("""
    import json, os, sys
    import jax, jax.numpy as jnp
    from maxtext.storage import checkpointing
    directory, mode = sys.argv[1], sys.argv[2]
    key = jax.random.key(0)
    if mode == "before":
      # 4 MiB of arrays for the 1 MiB disk: refused before writing.
      state = {"params": {"w": jax.random.normal(key, (1024, 1024))}}
    else:
      # 1000 KiB of incompressible arrays: the check before writing passes,
      # the write with its metadata files fills the disk in the background.
      state = {"params": {"w": jax.random.bits(key, (250, 1024))}}
    ckpt = checkpointing.Checkpointer(directory, save_period=1, max_to_keep=0)
    code = 0
    try:
      ckpt.save(1, state, {})
      if mode == "wait":
        ckpt.wait()
      elif mode == "next_save":
        ckpt.save(2, {"params": {"w": jnp.ones(4)}}, {})
      ckpt.close()
    except checkpointing.CheckpointError as e:
      print("CheckpointError:", e, flush=True)
      code = 3
    ckpt.close()
    print("LEFT:", json.dumps(sorted(
        os.path.relpath(os.path.join(root, name), directory)
        for root, dirs, files in os.walk(directory)
        for name in dirs + files)), flush=True)
    sys.exit(code)
""")


class FullDiskTest(parameterized.TestCase):
  """A save onto a full disk: one clear error and no temporary files left."""

  @parameterized.named_parameters(
      (
          "before_writing",
          "before",
          " (its arrays need 4.0 MiB before compression, 1.0 MiB free)",
      ),
      ("in_wait", "wait", ""),
      ("in_next_save", "next_save", ""),
      ("in_close", "close", ""),
  )
  def test_full_disk(self, mode, detail):
    self.assertTrue(
        tmpfs.available(), "the test needs `unshare -Urm` and tmpfs mounts"
    )
    mount = self.create_tempdir().full_path
    directory = os.path.join(mount, "checkpoints")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(sys.path), JAX_PLATFORMS="cpu"
    )
    result = subprocess.run(
        tmpfs.command(
            mount,
            "1M",
            [sys.executable, "-c", _FULL_DISK_CHILD, directory, mode],
        ),
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    output = result.stdout + result.stderr
    self.assertEqual(result.returncode, 3, output)
    self.assertEqual(
        process_output.one_line_starting(
            result.stdout, "CheckpointError:", output
        ),
        f"CheckpointError: could not write checkpoint step 1 to {directory}: "
        f"[Errno 28] No space left on device{detail}",
    )
    left = process_output.one_line_starting(result.stdout, "LEFT:", output)
    self.assertEqual(json.loads(left[len("LEFT:") :]), [], output)
    # orbax's own reports of the failed write are one line each: no
    # traceback through orbax's code.
    self.assertEqual(
        re.findall(r'(?m)^\s+File ".*/orbax/.*', result.stderr), [], output
    )


class ReportedWriteErrorsTest(absltest.TestCase):
  """Sibling write tasks of a reported full-disk failure log nothing more."""

  def _unretrieved_task_error(self, error):
    """Lets a task fail with `error` unretrieved, as orbax's siblings do."""

    async def write():
      raise error

    loop = asyncio.new_event_loop()
    task = loop.create_task(write())
    loop.run_until_complete(asyncio.sleep(0))  # The task runs and fails.
    loop.close()
    del task
    gc.collect()  # asyncio reports the unretrieved exception here.

  def _unretrieved_gather_error(self, error):
    """The same for a gather of failing tasks, whose siblings it retrieves."""

    async def write():
      raise error

    async def start():
      return asyncio.gather(write(), write())

    loop = asyncio.new_event_loop()
    gathering = loop.run_until_complete(start())
    loop.run_until_complete(asyncio.sleep(0))
    loop.run_until_complete(asyncio.sleep(0))
    self.assertTrue(gathering.done())
    loop.close()
    del gathering
    gc.collect()

  def test_only_storage_errors_are_dropped_once_a_failure_was_reported(self):
    directory = self.create_tempdir().full_path
    checkpointer = checkpointing.Checkpointer(
        directory, save_period=1, max_to_keep=0
    )
    self.addCleanup(checkpointer.close)
    full = OSError(errno.ENOSPC, "No space left on device")
    with self.assertRaises(checkpointing.CheckpointError):
      # The way a failed save is reported.
      checkpointer._save_failed(1, full)  # pylint: disable=protected-access
    with self.assertLogs("asyncio", level="ERROR") as logs:
      self._unretrieved_task_error(full)
      self._unretrieved_gather_error(full)
      self._unretrieved_task_error(TypeError("a bug, not the disk"))
    self.assertLen(logs.records, 1)
    self.assertIsInstance(logs.records[0].exc_info[1], TypeError)


if __name__ == "__main__":
  absltest.main()
