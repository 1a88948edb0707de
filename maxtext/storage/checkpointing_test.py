"""Tests for maxtext.storage.checkpointing with real orbax checkpoints in temp dirs."""

import os

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.storage import checkpointing


def make_state(scale: float, sharding: jax.sharding.Sharding):
  """A small train state shaped like the trainer's, placed on `sharding`."""
  put = lambda x: jax.device_put(x, sharding)
  return {
      "params": {
          "embed": put(jnp.arange(12, dtype=jnp.float32).reshape(3, 4) * scale),
          "layer": {"w": put(jnp.full((4, 2), scale, jnp.float32))},
      },
      "opt_state": {"mu": put(jnp.ones((4, 2), jnp.float32) * -scale),
                    "count": put(jnp.asarray(int(scale), jnp.int32))},
      "step": put(jnp.asarray(int(scale), jnp.int32)),
  }


def abstract_like(tree, sharding):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


class CheckpointingTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.directory = os.path.join(self.create_tempdir().full_path, "checkpoints")
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
    self.sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec())

  def make_checkpointer(self, directory=None, **kwargs):
    args = dict(save_period=1, max_to_keep=0)
    args.update(kwargs)
    ckpt = checkpointing.Checkpointer(directory or self.directory, **args)
    self.addCleanup(ckpt.close)
    return ckpt

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

  def test_restore_casts_to_requested_dtype(self):
    ckpt = self.make_checkpointer()
    state = make_state(2.0, self.sharding)
    ckpt.save(2, state, {})
    abstract = abstract_like(state, self.sharding)
    abstract["params"]["embed"] = jax.ShapeDtypeStruct(
        (3, 4), jnp.bfloat16, sharding=self.sharding)
    restored, _ = ckpt.restore(2, abstract)
    self.assertEqual(restored["params"]["embed"].dtype, jnp.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(restored["params"]["embed"], np.float32),
        np.asarray(state["params"]["embed"]))

  def test_save_period_force_and_latest_step(self):
    ckpt = self.make_checkpointer(save_period=2)
    self.assertIsNone(ckpt.latest_step())
    self.assertEqual([ckpt.due(step) for step in range(1, 6)],
                     [False, True, False, True, False])
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
      ckpt.save(step, make_state(float(step), self.sharding),
                {"samples_count": step * 8})
    ckpt.wait()
    self.assertEqual(ckpt.all_steps(), [4, 5])
    on_disk = sorted(int(n) for n in os.listdir(self.directory) if n.isdigit())
    self.assertEqual(on_disk, [4, 5])
    restored, metadata = ckpt.restore(
        4, abstract_like(make_state(4.0, self.sharding), self.sharding))
    chex.assert_trees_all_equal(restored, make_state(4.0, self.sharding))
    self.assertEqual(metadata, {"samples_count": 32})

  def test_params_only_restore_from_latest_and_from_step_directory(self):
    ckpt = self.make_checkpointer()
    ckpt.save(1, make_state(1.0, self.sharding), {})
    ckpt.save(2, make_state(2.0, self.sharding), {})
    ckpt.close()
    abstract_params = abstract_like(
        make_state(0.0, self.sharding)["params"], self.sharding)

    latest = checkpointing.restore_params_only(self.directory, abstract_params)
    chex.assert_trees_all_equal(latest, make_state(2.0, self.sharding)["params"])
    self.assertEqual(jax.tree.structure(latest),
                     jax.tree.structure(abstract_params))
    for leaf in jax.tree.leaves(latest):
      self.assertEqual(leaf.sharding, self.sharding)

    first = checkpointing.restore_params_only(
        os.path.join(self.directory, "1"), abstract_params)
    chex.assert_trees_all_equal(first, make_state(1.0, self.sharding)["params"])

  def test_missing_and_empty_directories_name_the_path(self):
    abstract_params = abstract_like(
        make_state(0.0, self.sharding)["params"], self.sharding)
    missing = os.path.join(self.create_tempdir().full_path, "nowhere")
    with self.assertRaisesRegex(FileNotFoundError, f"{missing} does not exist"):
      checkpointing.restore_params_only(missing, abstract_params)
    empty = self.create_tempdir().full_path
    with self.assertRaisesRegex(FileNotFoundError, f"{empty} holds no checkpoint"):
      checkpointing.restore_params_only(empty, abstract_params)
    self.assertFalse(os.path.exists(missing))

  def test_restore_missing_step_names_directory_and_steps(self):
    ckpt = self.make_checkpointer()
    state = make_state(1.0, self.sharding)
    ckpt.save(1, state, {})
    with self.assertRaisesRegex(
        FileNotFoundError, rf"step 7 in {self.directory}.*\[1\]"):
      ckpt.restore(7, abstract_like(state, self.sharding))

  def test_abstract_leaf_without_sharding_is_rejected(self):
    ckpt = self.make_checkpointer()
    state = make_state(1.0, self.sharding)
    ckpt.save(1, state, {})
    abstract = abstract_like(state, self.sharding)
    abstract["opt_state"]["mu"] = jax.ShapeDtypeStruct((4, 2), jnp.float32)
    with self.assertRaisesRegex(ValueError, r"\['opt_state'\]\['mu'\].*sharding"):
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
    directory = args.pop("directory")
    with self.assertRaisesRegex(error, regex):
      checkpointing.Checkpointer(directory, **args)

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


if __name__ == "__main__":
  absltest.main()
