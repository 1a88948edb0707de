"""Checkpoints of arrays sharded over 4 fake CPU devices, restored resharded.

Its own target: the device count is fixed before JAX starts.
"""

import os

from maxtext.runtime import cpu_devices

cpu_devices.request(4)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from maxtext.storage import checkpointing


class ShardedCheckpointTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.assertEqual(jax.device_count(), 4, "needs 4 fake CPU devices")
    self.directory = os.path.join(self.create_tempdir().full_path, "ckpt")
    devices = np.array(jax.devices())
    self.mesh_2x2 = Mesh(devices.reshape(2, 2), ("data", "fsdp"))
    self.mesh_1x4 = Mesh(devices.reshape(1, 4), ("data", "fsdp"))

  def test_save_on_one_mesh_restore_on_another(self):
    saved_sharding = NamedSharding(self.mesh_2x2, P("fsdp", None))
    state = {
        "params": {
            "w": jax.device_put(
                jnp.arange(32, dtype=jnp.float32).reshape(8, 4), saved_sharding
            )
        },
        "opt_state": {
            "mu": jax.device_put(jnp.ones((8, 4), jnp.float32), saved_sharding)
        },
        "step": jnp.asarray(5, jnp.int32),
    }
    with checkpointing.Checkpointer(
        self.directory, save_period=5, max_to_keep=1
    ) as ckpt:
      self.assertTrue(ckpt.save(5, state, {"samples_count": 40}))

    target = NamedSharding(self.mesh_1x4, P(None, "fsdp"))
    replicated = NamedSharding(self.mesh_1x4, P())
    abstract = {
        "params": {
            "w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=target)
        },
        "opt_state": {
            "mu": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=target)
        },
        "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
    }
    with checkpointing.Checkpointer(
        self.directory, save_period=5, max_to_keep=1
    ) as ckpt:
      self.assertEqual(ckpt.latest_step(), 5)
      restored, metadata = ckpt.restore(5, abstract)
    chex.assert_trees_all_equal(restored, state)
    self.assertEqual(metadata, {"samples_count": 40})
    self.assertEqual(restored["params"]["w"].sharding, target)
    # Each of the 4 devices holds one (8, 1) column block.
    shard_shapes = {
        s.data.shape for s in restored["params"]["w"].addressable_shards
    }
    self.assertEqual(shard_shapes, {(8, 1)})

    params = checkpointing.restore_params_only(
        self.directory,
        {
            "w": jax.ShapeDtypeStruct(
                (8, 4), jnp.float32, sharding=saved_sharding
            )
        },
    )
    chex.assert_trees_all_equal(params, state["params"])
    self.assertEqual(params["w"].sharding, saved_sharding)


if __name__ == "__main__":
  absltest.main()
