"""One device's logits, loss and gradients against a mesh's: the check the
multi-device model tests (tensor, context parallelism) share.

The reference is the same model on one device, in the same process; the
mesh run places the parameters by the logical-axis rules
(`model_setup.setup_model`) and the batch as the trainer does.
"""

import functools

import jax
import numpy as np

from maxtext.engine import engine_config
from maxtext.engine import model_setup
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.runtime import mesh as mesh_lib
from testing import tiny_configs

# The models the multi-device tests compare, each with 4 query and 2
# key/value heads so that tensor parallelism of 2 splits them: dense,
# mixture-of-experts (no capacity limit: nothing dropped on any layout), and
# Qwen3.5's hybrid (Gated DeltaNet layers beside attention layers).
DENSE = dict(num_heads=4, num_kv_heads=2, mlp_dim=64)
MOE = dict(
    tiny_configs.TINY_MOE, num_heads=4, num_kv_heads=2, capacity_factor=0.0
)
HYBRID = dict(
    tiny_configs.TINY_QWEN35, num_heads=4, num_kv_heads=2, capacity_factor=0.0
)


def batch(config, packed: bool, rows: int = 8) -> dict[str, np.ndarray]:
  """`rows` random rows of `config.max_sequence_length` tokens; with
  `packed` two sequences a row (3/8 and 5/8 of it), each with its own
  segment id and positions from 0."""
  rng = np.random.default_rng(0)
  length = config.max_sequence_length
  shape = (rows, length)
  out = {
      "inputs": rng.integers(0, config.vocab_size, shape).astype(np.int32),
      "targets": rng.integers(0, config.vocab_size, shape).astype(np.int32),
  }
  if packed:
    first = 3 * length // 8
    ids = np.repeat([1, 2], [first, length - first])
    positions = np.concatenate([np.arange(first), np.arange(length - first)])
    out["segment_ids"] = np.tile(ids, (rows, 1)).astype(np.int32)
    out["positions"] = np.tile(positions, (rows, 1)).astype(np.int32)
  return out


def _loss_and_grads(config, mesh):
  return jax.jit(
      jax.value_and_grad(
          functools.partial(transformer.loss_fn, config=config, mesh=mesh),
          has_aux=True,
      )
  )


def assert_matches_one_device(
    test, config, device_mesh, packed: bool, axis: str
) -> None:
  """Asserts that `config`'s model on `device_mesh` gives one device's
  logits, loss and gradients for `batch(config, packed)` (the gradients
  within rtol 1e-4 and an absolute 1e-6, 4e-6 for a hybrid: its Gated
  DeltaNet's split heads and its chunk states composed across the context
  axis sum in orders of their own, and on some CPUs a gradient of about
  1.7e-3 differs from one device's by 2e-6), and that the rules split at
  least three parameters over the mesh axis `axis`."""
  grad_atol = 4e-6 if config.full_attention_interval else 1e-6
  setup = model_setup.setup_model(model_config.of(config), device_mesh)
  specs = jax.tree_util.tree_leaves(
      jax.tree_util.tree_map(lambda s: s.spec, setup.param_shardings),
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
  )
  test.assertGreaterEqual(
      sum(
          any(
              axis == entry or (isinstance(entry, tuple) and axis in entry)
              for entry in tuple(spec)
          )
          for spec in specs
      ),
      3,
  )
  params = model_setup.init_params(
      engine_config.EngineConfig.from_config(config), setup
  )
  single = jax.device_get(params)
  rows = batch(config, packed)
  placed = mesh_lib.global_batch(rows, setup.batch_sharding)

  want_logits = jax.jit(
      functools.partial(
          transformer.apply, config=config, rows=transformer.Rows.of(rows)
      )
  )(single, rows["inputs"])
  got_logits = jax.jit(
      functools.partial(
          transformer.apply,
          config=config,
          mesh=device_mesh,
          rows=transformer.Rows.of(placed),
      )
  )(params, placed["inputs"])
  np.testing.assert_allclose(got_logits, want_logits, rtol=2e-5, atol=2e-5)

  (want_loss, want_aux), want_grads = _loss_and_grads(config, None)(
      single, rows
  )
  (got_loss, got_aux), got_grads = _loss_and_grads(config, device_mesh)(
      params, placed
  )
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  np.testing.assert_allclose(
      got_aux["loss_sum"], want_aux["loss_sum"], rtol=1e-5
  )
  jax.tree_util.tree_map(
      lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=grad_atol),
      jax.device_get(got_grads),
      want_grads,
  )
