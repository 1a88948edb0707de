"""Per-device bytes of a run's training state, from shapes and shardings.

What every device holds between steps, before any activation: its shard of
the parameters (`weight_dtype`), of the gradient accumulator (the engine
accumulates in float32 or wider) and of the optimizer state (AdamW's two
moments in the parameters' dtype, plus step counters). The shards come from
the model's own partition specs (`transformer.param_partition_specs`) for a
stated mesh, so the report needs no devices and allocates nothing: a 671B
model on 256 devices is computed on a laptop.
"""

import dataclasses
import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.runtime import mesh as mesh_lib
from maxtext.model import transformer
from maxtext.config import optimizer as optimizer_lib

# The mesh axes a stated mesh may name (maxtext.runtime.mesh's).
AXES = (mesh_lib.DATA_AXIS, mesh_lib.FSDP_AXIS, mesh_lib.EXPERT_AXIS)


@dataclasses.dataclass(frozen=True)
class StateBytes:
  """Bytes one device holds of each part of the training state."""

  params: int
  grads: int
  opt_state: int

  @property
  def total(self) -> int:
    return self.params + self.grads + self.opt_state


def parse_mesh(text: str) -> dict[str, int]:
  """Parses "expert=32,fsdp=8" into axis sizes; unnamed axes are 1.

  Raises:
    ValueError: an unknown or repeated axis, or a size that is not a positive
      integer.
  """
  sizes = {axis: 1 for axis in AXES}
  seen = set()
  for part in text.split(","):
    name, sep, value = part.strip().partition("=")
    if not sep or name not in sizes or name in seen:
      raise ValueError(
          f"mesh={text!r}: expected comma-separated AXIS=SIZE with AXIS one "
          f"of {list(AXES)}, each at most once; got {part!r}"
      )
    try:
      size = int(value)
    except ValueError:
      size = 0
    if size < 1:
      raise ValueError(f"mesh={text!r}: {name} must be a positive integer")
    sizes[name] = size
    seen.add(name)
  return sizes


def _shard_shape(shape, spec, sizes: Mapping[str, int]) -> tuple[int, ...]:
  """One device's block of an array of `shape` laid out by `spec`."""
  out = []
  for dim, entry in zip(shape, tuple(spec) + (None,) * len(shape)):
    names = (
        () if entry is None else (entry,) if isinstance(entry, str) else entry
    )
    out.append(math.ceil(dim / math.prod(sizes[n] for n in names)))
  return tuple(out)


def _bytes(tree) -> int:
  return sum(
      int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
      for x in jax.tree_util.tree_leaves(tree)
  )


def abstract_params(config: Any) -> Any:
  """The config's parameter shapes and dtypes; allocates nothing."""
  return jax.eval_shape(
      functools.partial(transformer.init_params, config), jax.random.PRNGKey(0)
  )


def state_bytes(config: Any, sizes: Mapping[str, int]) -> StateBytes:
  """Per-device bytes of parameters, gradients and optimizer state.

  Args:
    config: a validated run config.
    sizes: mesh axis sizes, as `parse_mesh` returns them.

  Returns:
    The bytes of one device's shards (the largest, where a dimension does
    not split evenly; the model's specs only split dimensions that do).

  Raises:
    ValueError: the expert axis does not divide the number of experts.
  """
  params = abstract_params(config)
  specs = transformer.param_partition_specs(
      params,
      sizes[mesh_lib.FSDP_AXIS],
      expert_size=sizes[mesh_lib.EXPERT_AXIS],
  )
  shards = jax.tree_util.tree_map(
      lambda x, spec: jax.ShapeDtypeStruct(
          _shard_shape(x.shape, spec, sizes), x.dtype
      ),
      params,
      specs,
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
  )
  grads = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(
          x.shape, jnp.promote_types(x.dtype, jnp.float32)
      ),
      shards,
  )
  # The optimizer's state of a model whose parameters are the shards: its
  # moments mirror the shards, its counters are per device anyway.
  settings = optimizer_lib.OptimizerConfig.from_config(config)
  optimizer = optimizer_lib.make_optimizer(
      settings, optimizer_lib.make_schedule(settings), include_clipping=False
  )
  opt_state = jax.eval_shape(optimizer.init, shards)
  return StateBytes(_bytes(shards), _bytes(grads), _bytes(opt_state))
