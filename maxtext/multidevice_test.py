"""Eight fake CPU devices: FSDP/data sharding, and the same training as one.

The device count is fixed when JAX starts, so this test has its own target and
sets XLA_FLAGS before importing JAX. The one-device reference run is a
subprocess.
"""

import os

from maxtext import workloads
from maxtext.runtime import cpu_devices

cpu_devices.request(8)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import functools
import json

from absl.testing import absltest
import chex
import jax
import numpy as np

from maxtext.runtime import mesh as mesh_lib
from maxtext.model import transformer
from maxtext.engine import engine_config
from maxtext.engine import model_setup
from maxtext.storage import checkpointing
from maxtext.configs import default
from testing import runfiles
from testing import tiny_configs

# pylint: enable=wrong-import-position,wrong-import-order,ungrouped-imports

_STEPS = 3


def _tiny_overrides(output_dir, **overrides):
  """Returns config overrides for a tiny run writing under output_dir."""
  values = dict(
      tiny_configs.TINY_MODEL,
      base_output_directory=output_dir,
      run_name="r",
      vocab_size=64,
      # 2 micro-batches of 8 sequences: one per device of the 2 x 4 mesh.
      global_batch_size=16,
      gradient_accumulation_steps=2,
      eval_steps=1,
      eval_interval=_STEPS,
      steps=_STEPS,
      warmup_steps=1,
      target_eval_loss=0.0,
      enable_mllog=False,
      checkpoint_period=_STEPS,
      jax_compilation_cache_dir=tiny_configs.compilation_cache_dir(),
  )
  values.update(overrides)
  return values


def _tiny_config(output_dir, **overrides):
  config = default.get_config()
  config.update(_tiny_overrides(output_dir, **overrides))
  return config


def _losses(run_dir):
  with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
    return [r["loss"] for r in map(json.loads, f) if r["kind"] == "train"]


class MultiDeviceTest(absltest.TestCase):

  def test_eight_devices(self):
    self.assertEqual(jax.device_count(), 8)

  def test_params_and_batches_are_sharded_as_configured(self):
    config = _tiny_config(
        self.create_tempdir().full_path, data_parallelism=2, fsdp_parallelism=4
    )
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config))
    self.assertEqual(dict(mesh.shape), {"data": 2, "fsdp": 4})
    engine, setup = model_setup.build_engine(
        engine_config.EngineConfig.from_config(config), config.to_dict(), mesh
    )
    abstract = setup.abstract_params
    fsdp_dims = transformer.param_fsdp_axis(abstract, 4)
    sharded = 0
    for leaf, dim in zip(
        jax.tree_util.tree_leaves(engine.params),
        jax.tree_util.tree_leaves(fsdp_dims, is_leaf=lambda x: x is None),
    ):
      shard_shape = leaf.addressable_shards[0].data.shape
      if dim is None:
        self.assertEqual(shard_shape, leaf.shape)
      else:
        sharded += 1
        expected = list(leaf.shape)
        expected[dim] //= 4
        self.assertEqual(shard_shape, tuple(expected))
    self.assertGreater(sharded, 0)
    batch = mesh_lib.global_batch(
        {"inputs": np.zeros((8, 16), np.int32)}, setup.batch_sharding
    )
    self.assertEqual(batch["inputs"].addressable_shards[0].data.shape, (1, 16))

  def test_matches_the_single_device_run(self):
    root = self.create_tempdir().full_path
    multi = workloads.run(
        _tiny_config(
            os.path.join(root, "multi"), data_parallelism=2, fsdp_parallelism=4
        )
    )
    self.assertEqual(multi.final_step, _STEPS)
    # The reference: the same config in a fresh process that sees one device.
    script = (
        "import json, sys, jax; from maxtext import workloads; "
        "from maxtext.configs import default; "
        "assert jax.device_count() == 1, jax.devices(); "
        "config = default.get_config(); "
        "config.update(json.loads(sys.argv[1])); "
        "workloads.run(config)"
    )
    proc = runfiles.run_python(
        script,
        [json.dumps(_tiny_overrides(os.path.join(root, "single")))],
        timeout_s=600,
        extra_env={
            "XLA_FLAGS": cpu_devices.with_device_count(
                os.environ.get("XLA_FLAGS", ""), None
            )
        },
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    single_dir = os.path.join(root, "single", "r")
    np.testing.assert_allclose(
        _losses(multi.run_dir), _losses(single_dir), rtol=2e-5
    )
    abstract = jax.eval_shape(
        functools.partial(transformer.init_params, _tiny_config(root)),
        jax.random.PRNGKey(0),
    )
    cpu = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    chex.assert_trees_all_close(
        self._params(multi.run_dir, abstract, cpu),
        self._params(single_dir, abstract, cpu),
        atol=2e-5,
        rtol=2e-5,
    )

  def _params(self, run_dir, abstract, sharding):
    abstract = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
        abstract,
    )
    return jax.device_get(
        checkpointing.restore_params_only(
            os.path.join(run_dir, "checkpoints"), abstract
        )
    )


if __name__ == "__main__":
  absltest.main()
