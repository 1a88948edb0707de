"""Eight fake CPU devices: GRPO steps on a mesh match the same on one device.

The device count is fixed when JAX starts, so this test has its own target
and sets XLA_FLAGS before importing JAX. The sharded run has the
parameters split as the trainer splits them (FSDP over 4, data over 2) and
the rollout's rows over the batch axes; the reference is the same steps
with everything on one device, in the same process. Same seeds: the same
completions, rewards and advantages, and the same losses and gradient norms
up to the order of float32 sums.
"""

from maxtext.runtime import cpu_devices

cpu_devices.request(8)

# JAX reads the device count when it starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import functools
import time

from absl.testing import absltest
import jax
import ml_collections
import numpy as np
import optax

from maxtext import workloads
from maxtext.engine import engine as engine_lib
from maxtext.runtime import mesh as mesh_lib
from maxtext.engine import engine_config
from maxtext.engine import model_setup
from maxtext.model import model_config
from maxtext.generation import decode_weights
from maxtext.grpo.rollout import generation_mesh
from maxtext.grpo.rollout import rollout_config
from maxtext.grpo.tasks import prompts
from maxtext.grpo.tasks import task_config
from maxtext.grpo.rewards import rewards
from maxtext.grpo.rollout import rollout_batches
from maxtext.grpo.loss import train_loss
from maxtext.grpo import grpo_config
from maxtext.grpo import grpo_workload
from maxtext.metrics import recorder as recorder_lib
from maxtext.model import transformer
from maxtext.run import batch_source
from maxtext.run import run_settings
from testing import tiny_configs

_ATOL = 1e-4


def _run(config) -> run_settings.RunSettings:
  """The run's settings, as the top builds them."""
  return run_settings.RunSettings.from_config(config)


def _grpo(config) -> grpo_workload.GrpoWorkload:
  """The GRPO workload of `config`, as the top builds it."""
  return grpo_workload.GrpoWorkload(grpo_config.GrpoConfig.from_config(config))


def _steps(config, mesh, setup, steps, generation=None):
  """Runs `steps` GRPO steps (generating on `generation`'s devices when
  given); returns (completions, metrics) per step."""
  frozen = ml_collections.FrozenConfigDict(config)
  settings = grpo_config.GrpoConfig.from_config(config)
  options = grpo_workload.loss_options(settings)
  if setup is None:
    params = transformer.init_params(config, jax.random.PRNGKey(config.seed))
    reference = transformer.init_params(config, jax.random.PRNGKey(config.seed))
    shardings = {}
  else:
    params = model_setup.init_params(
        engine_config.EngineConfig.from_config(config), setup
    )
    reference = model_setup.init_params(
        engine_config.EngineConfig.from_config(config), setup
    )
    shardings = dict(
        param_shardings=setup.param_shardings,
        batch_sharding=grpo_workload.batch_shardings(
            settings, setup.batch_sharding
        ),
    )
  engine = engine_lib.Engine(
      functools.partial(
          train_loss.loss_fn, config=frozen, options=options, mesh=mesh
      ),
      params,
      optax.adam(1e-2),
      1e-2,
      recorder_lib.MetricsRecorder(),
      2,
      **shardings,
  )
  task = prompts.make_task(task_config.TaskConfig.from_config(config))
  grpo = rollout_batches.RolloutBatches(
      engine,
      frozen,
      lambda s: task.train_prompts(s, 4),
      functools.partial(grpo_workload.rollout_options, settings),
      rewards.load(config.grpo_reward_functions),
      num_micro_batches=2,
      width=config.grpo_prompt_length + config.grpo_max_completion_length,
      reference_params=reference,
      mesh=mesh,
      generation=generation,
      logprob_error_threshold=options.logprob_error_threshold,
  )
  out = []
  for step in range(steps):
    # One update on the rollout, as the training loop dispatches it.
    start = time.perf_counter()
    prepared = grpo.prepare(
        step, batch_source.Policy(engine.params, engine.step)
    )
    for micro_batch in prepared.batches:
      engine.fwd_bwd(micro_batch)
    record = engine.update(release=True)
    grpo.complete(record, start, prepared)
    out.append(
        (prepared.rollout.completions, recorder_lib.reduce_buffer(record))
    )
  return out


def _held_bytes(params) -> int:
  """The bytes every device's shards of `params` take, summed."""
  return sum(
      shard.data.nbytes
      for leaf in jax.tree.leaves(params)
      for shard in leaf.addressable_shards
  )


class GrpoMultiDeviceTest(absltest.TestCase):

  def test_sharded_steps_match_one_device(self):
    self.assertEqual(jax.device_count(), 8)
    jax.config.update(
        "jax_compilation_cache_dir", tiny_configs.compilation_cache_dir()
    )
    config = tiny_configs.model_config(
        data_parallelism=2,
        fsdp_parallelism=4,
        global_batch_size=16,
        gradient_accumulation_steps=2,
        # The log-prob-error gate's programs on the mesh too.
        grpo_logprob_error_threshold=2.0,
        **tiny_configs.TINY_GRPO,
    )
    mesh = mesh_lib.make_mesh(_grpo(config).mesh_config(_run(config)))
    sharded = _steps(
        config, mesh, model_setup.setup_model(model_config.of(config), mesh), 3
    )
    single = _steps(config, None, None, 3)
    for step, ((ids8, m8), (ids1, m1)) in enumerate(zip(sharded, single)):
      self.assertEqual(ids8, ids1, f"step {step}")
      for name in ("loss", "pg_loss", "kl", "grad_norm", "entropy"):
        np.testing.assert_allclose(
            m8[name], m1[name], atol=_ATOL, rtol=1e-4, err_msg=name
        )
      for name in ("rewards/mean", "advantage/abs_mean"):
        self.assertEqual(m8[name], m1[name], name)
    # The steps trained: the policy moved away from the reference.
    self.assertGreater(abs(single[-1][1]["kl"]), 0.0)

  def test_generation_on_devices_of_its_own(self):
    # Training on the first 4 devices (FSDP), generation on the last 4 (2
    # replicas of the paged decoder, FSDP over 2 each) with the parameters
    # copied there before each rollout: the same steps as one device's.
    jax.config.update(
        "jax_compilation_cache_dir", tiny_configs.compilation_cache_dir()
    )
    config = tiny_configs.model_config(
        data_parallelism=1,
        fsdp_parallelism=4,
        global_batch_size=16,
        gradient_accumulation_steps=2,
        grpo_generation_devices=4,
        grpo_generation_replicas=2,
        **tiny_configs.TINY_GRPO,
    )
    mesh_config = _grpo(config).mesh_config(_run(config))
    mesh = mesh_lib.make_mesh(mesh_config)
    setup = model_setup.setup_model(model_config.of(config), mesh)
    generation = generation_mesh.make(
        rollout_config.RolloutConfig.from_config(config), mesh_config
    )
    train_devices = set(mesh.devices.flat)
    generation_devices = set(generation.mesh.devices.flat)
    self.assertEqual(train_devices, set(jax.devices()[:4]))
    self.assertEqual(generation_devices, set(jax.devices()[4:]))
    self.assertEqual(dict(generation.mesh.shape), {"data": 2, "fsdp": 2})
    separate = _steps(config, mesh, setup, 3, generation)
    single = _steps(config, None, None, 3)
    for step, ((ids8, m8), (ids1, m1)) in enumerate(zip(separate, single)):
      self.assertEqual(ids8, ids1, f"step {step}")
      for name in ("loss", "pg_loss", "kl", "grad_norm"):
        np.testing.assert_allclose(
            m8[name], m1[name], atol=_ATOL, rtol=1e-4, err_msg=name
        )
      self.assertEqual(m8["rewards/mean"], m1["rewards/mean"])
      # 4 training and 4 generation devices: each training device's shards
      # (float32, the compute dtype) go to one generation device.
      self.assertEqual(
          m8["rollout/weight_copy_bytes"],
          _held_bytes(
              model_setup.init_params(
                  engine_config.EngineConfig.from_config(config), setup
              )
          ),
      )
      self.assertGreater(m8["timing/weight_copy"], 0.0)

  def test_copy_puts_the_cast_parameters_on_the_generation_mesh(self):
    # Training + generation devices 6 + 2 (laid out over 2 of the 6
    # first), 4 + 4 (each training device's shards to one generation
    # device) and 2 + 6 (to three): the generation mesh holds the
    # parameters as a decoder reads them (`decode_weights`: the matrices
    # in the compute dtype), exactly.
    # The last two with 2 replicas on the generation mesh's data axis.
    for n, copies, replicas in ((2, None, 1), (4, 1, 2), (6, 3, 2)):
      config = tiny_configs.model_config(
          data_parallelism=1,
          fsdp_parallelism=-1,
          compute_dtype="bfloat16",
          grpo_generation_devices=n,
          grpo_generation_replicas=replicas,
          **tiny_configs.TINY_GRPO,
      )
      mesh_config = _grpo(config).mesh_config(_run(config))
      mesh = mesh_lib.make_mesh(mesh_config)
      params = model_setup.init_params(
          engine_config.EngineConfig.from_config(config),
          model_setup.setup_model(model_config.of(config), mesh),
      )
      generation = generation_mesh.make(
          rollout_config.RolloutConfig.from_config(config), mesh_config
      )
      copied, _ = generation.copy(params)
      self.assertEqual(
          set(generation.mesh.devices.flat), set(jax.devices()[8 - n :])
      )
      self.assertEqual(generation.mesh.shape["data"], replicas)
      dtypes = decode_weights.dtypes(params, config.compute_dtype)
      for path, got in jax.tree_util.tree_leaves_with_path(copied):
        want = functools.reduce(lambda t, k: t[k.key], path, params)
        dtype = functools.reduce(lambda t, k: t[k.key], path, dtypes)
        self.assertEqual(got.dtype, dtype, path)
        self.assertEqual(
            set(got.sharding.device_set), set(jax.devices()[8 - n :])
        )
        np.testing.assert_array_equal(
            np.asarray(got), np.asarray(want.astype(dtype)), str(path)
        )
      # Matrices in bfloat16, norm scales in float32.
      self.assertEqual(
          {str(x.dtype) for x in jax.tree.leaves(copied)},
          {"bfloat16", "float32"},
      )
      if copies is not None:
        # Each training device's shards, as copied, to `copies` devices.
        self.assertEqual(
            generation.copy_bytes,
            copies
            * _held_bytes(decode_weights.cast(params, config.compute_dtype)),
        )

  def test_generation_devices_must_leave_training_some(self):
    config = tiny_configs.model_config(
        grpo_generation_devices=8, **tiny_configs.TINY_GRPO
    )
    with self.assertRaisesRegex(
        ValueError,
        "^grpo_generation_devices=8 must leave training at least one of the "
        "8 devices$",
    ):
      mesh_lib.make_mesh(_grpo(config).mesh_config(_run(config)))
    # Only GRPO generates: pretraining trains on every device.
    config.workload = "pretraining"
    self.assertEqual(
        mesh_lib.make_mesh(
            workloads.for_config(config).mesh_config(_run(config))
        ).devices.size,
        8,
    )


if __name__ == "__main__":
  absltest.main()
