"""The attention a program runs is chosen for the devices it is compiled for.

On this host's CPU mesh "auto" is the einsum reference and the splash kernel
(Pallas interpret mode, in `shard_map` over the mesh) gives its numbers.
With the TPU package set (`--config=tpu`: the target's `--tpu` argument)
the model is compiled for a v5p slice that libtpu describes: "auto" is the
splash kernel, compiled as the real Mosaic kernel (a TPU custom call), even
though the host is a CPU.
"""

import os
import re
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.runtime import mesh as mesh_lib
from maxtext.engine import model_setup
from maxtext.model import model_config
from maxtext.runtime import topology
from maxtext.model import layers
from maxtext.model import transformer
from testing import tiny_configs

# `args` of the Bazel target: present when the build has the TPU packages.
_TPU_ARG = "--tpu"


def _config(*presets, **overrides):
  """The tiny model, FSDP over all devices, a batch of 4 sequences of 13."""
  fields = dict(
      max_sequence_length=13,
      data_parallelism=1,
      fsdp_parallelism=-1,
      global_batch_size=4,
  )
  fields.update(overrides)
  return tiny_configs.model_config(*presets, **fields)


def _batch(config, rows=4):
  rng = np.random.default_rng(0)
  shape = (rows, config.max_sequence_length)
  return {
      "inputs": jnp.asarray(rng.integers(0, config.vocab_size, shape)),
      "targets": jnp.asarray(rng.integers(0, config.vocab_size, shape)),
  }


class CpuMeshTest(absltest.TestCase):

  def test_auto_is_einsum_for_a_cpu_mesh(self):
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig.from_config(_config()), jax.devices()
    )
    self.assertEqual(
        transformer.attention_implementation(_config(), mesh), "einsum"
    )

  def test_splash_on_a_mesh_matches_einsum(self):
    config = _config(attention="splash")
    reference = _config(attention="einsum")
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig.from_config(config), jax.devices()
    )
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    batch = _batch(config)
    loss, _ = jax.jit(
        lambda p, b: transformer.loss_fn(p, b, config, mesh=mesh)
    )(params, batch)
    ref, _ = transformer.loss_fn(params, batch, reference)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)


def _grad_program(config, mesh):
  """The jitted gradient of the tiny model's loss on `mesh`, and its
  arguments."""
  params = transformer.init_params(config, jax.random.PRNGKey(0))
  grad = jax.jit(
      jax.grad(lambda p, b: transformer.loss_fn(p, b, config, mesh=mesh)[0])
  )
  return grad, (params, _batch(config))


class SplashRematTest(parameterized.TestCase):
  """The splash kernel's residuals (its output and log-sum-exp) carry the
  context's name, so "save_named" and "save_context" keep them: the
  backward pass runs the kernel's fused backward kernel and not its forward
  kernel again."""

  @parameterized.named_parameters(("gqa", "gqa"), ("mla", "mla"))
  def test_saved_context_runs_the_forward_kernel_once(self, kind):
    """`kind` is the attention type."""
    presets = [tiny_configs.TINY_MLA] if kind == "mla" else []
    loops = {}
    for policy in ("none", "save_named", "save_context", "full"):
      config = _config(*presets, attention="splash", remat_policy=policy)
      mesh = mesh_lib.make_mesh(
          mesh_lib.MeshConfig.from_config(config), jax.devices()
      )
      grad, args = _grad_program(config, mesh)
      # In interpret mode each kernel call is a loop over its grid.
      loops[policy] = grad.lower(*args).compile().as_text().count(" while(")
    # Full remat reruns the forward kernel to recompute the block; with the
    # residuals kept the backward pass runs as many kernels as without remat.
    self.assertEqual(loops["save_named"], loops["none"])
    self.assertEqual(loops["save_context"], loops["none"])
    self.assertEqual(loops["full"], loops["none"] + 1)

  def test_saved_context_gradients_match_no_remat(self):
    grads = {}
    for policy in ("none", "save_named", "save_context"):
      config = _config(attention="splash", remat_policy=policy)
      mesh = mesh_lib.make_mesh(
          mesh_lib.MeshConfig.from_config(config), jax.devices()
      )
      grad, args = _grad_program(config, mesh)
      grads[policy] = grad(*args)
    for policy in ("save_named", "save_context"):
      jax.tree.map(
          lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
          grads[policy],
          grads["none"],
      )


class SplashBlocksTest(parameterized.TestCase):
  """The splash kernel's blocks: the longest of 1,024, 512 and 128
  dividing the queries' length, the forward kernel's key steps at most 512
  of them; one fused backward kernel while the keys span at most two
  blocks, else the two backward kernels."""

  @parameterized.named_parameters(
      ("short", 256, None, 128, 128, True),
      ("three_short_blocks", 384, None, 128, 128, False),
      ("two_blocks", 2048, None, 1024, 512, True),
      ("three_blocks", 1536, None, 512, 512, False),
      ("long", 8192, None, 1024, 512, False),
      ("context_parallel", 4096, 65536, 1024, 512, False),
      ("context_parallel_short", 512, 1024, 512, 512, True),
  )
  def test_blocks(self, length, kv_length, block, forward_step, fused):
    # pylint: disable-next=protected-access  # The rule itself, not a run.
    sizes = layers._splash_blocks(length, kv_length)
    self.assertEqual(
        (sizes.block_q, sizes.block_kv, sizes.block_q_dkv), (block,) * 3
    )
    self.assertEqual(
        (sizes.block_kv_compute, sizes.block_kv_dkv_compute),
        (forward_step, block),
    )
    self.assertEqual(sizes.use_fused_bwd_kernel, fused)
    self.assertEqual(sizes.block_q_dq, None if fused else block)


class TpuSliceTest(parameterized.TestCase):
  """Compiles for a v5p-8 described by libtpu (TPU package set only)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    cls.devices = topology.abstract_devices(topology.parse("v5p-8"))

  @parameterized.named_parameters(("gqa", "gqa"), ("mla", "mla"))
  def test_auto_is_the_splash_kernel_compiled_for_the_tpu(self, kind):
    """`kind` is the attention type."""
    config = _config(
        *([tiny_configs.TINY_MLA] if kind == "mla" else []),
        compute_dtype="bfloat16",
        max_sequence_length=256,
    )
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig.from_config(config), self.devices
    )
    self.assertEqual(
        transformer.attention_implementation(config, mesh), "splash"
    )
    setup = model_setup.setup_model(model_config.of(config), mesh)
    params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        setup.abstract_params,
        setup.param_shardings,
    )
    batch = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=setup.batch_sharding
        ),
        _batch(config),
    )
    compiled = (
        jax.jit(
            jax.grad(
                lambda p, b: transformer.loss_fn(p, b, config, mesh=mesh)[0]
            )
        )
        .lower(params, batch)
        .compile()
    )
    # The Mosaic kernel (forward and backward), not the interpreter.
    self.assertIn("tpu_custom_call", compiled.as_text())

  @parameterized.named_parameters(
      ("gqa", "gqa", "save_named"),
      ("mla", "mla", "save_named"),
      ("gqa_context", "gqa", "save_context"),
  )
  def test_saved_context_compiles_the_forward_kernel_once(self, kind, policy):
    """`kind` is the attention type, `policy` the remat policy."""
    config = _config(
        *([tiny_configs.TINY_MLA] if kind == "mla" else []),
        compute_dtype="bfloat16",
        max_sequence_length=256,
        remat_policy=policy,
    )
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig.from_config(config), self.devices
    )
    setup = model_setup.setup_model(model_config.of(config), mesh)
    params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        setup.abstract_params,
        setup.param_shardings,
    )
    batch = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=setup.batch_sharding
        ),
        _batch(config),
    )
    text = (
        jax.jit(
            jax.grad(
                lambda p, b: transformer.loss_fn(p, b, config, mesh=mesh)[0]
            )
        )
        .lower(params, batch)
        .compile()
        .as_text()
    )
    # The kernels are custom calls named after them: the forward kernel in
    # the layers' forward scan only, the one fused backward kernel (named
    # for dk and dv; it computes dq too) in the backward scan.
    kernels = re.findall(r"%(splash_mha_\w+?)\.\d+ = ", text)
    self.assertEqual(
        sorted(kernels),
        ["splash_mha_dkv_no_residuals", "splash_mha_fwd_residuals"],
    )


if __name__ == "__main__":
  if _TPU_ARG in sys.argv:
    sys.argv.remove(_TPU_ARG)
  else:
    del TpuSliceTest  # The CPU package set has no libtpu.
  absltest.main()
