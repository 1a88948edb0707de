"""Where the paged engine's arrays live: data-parallel replicas on a mesh.

On a mesh whose "data" axis has R > 1 devices, the paged decoder
(`paged_decoder`) runs R replicas of itself, one per index of that axis.
Each replica holds the whole model (the parameters are replicated over
"data" on the meshes the engine runs on; inside a replica they stay split
over "fsdp", "expert" and "tensor" as the caller placed them) and its own
blocks of the engine's arrays:

* the slots: every per-slot array (page tables [S, W], steps, positions,
  budgets, rows, active [S], logits [S, V], recurrent states [L, S, ...])
  is split over "data" on its slot dimension, replica r holding slots
  r * S / R .. (r + 1) * S / R - 1;
* the pages: the pool's [L, N, P, K, D] leaves are split over "data" on
  the page dimension N, replica r holding pages r * N / R .. (r + 1) * N
  / R - 1, which its page tables name by their local ids 0 .. N / R - 1.

The engine's programs run their body once per replica (`per_replica`:
`jax.shard_map` manual over "data" only, the other axes left to XLA as in
a program without it), on the replica's blocks, so the replicas exchange
no weights, pages or activations. A value that differs per replica (the
slot a call sets, the page it copies, a prefill's length) is an [R]
array split over "data", each replica reading its own entry.

Without a mesh, or with no "data" axis or one of size 1, R = 1: no
`shard_map`, every array whole on each device (the pool split by heads
over "tensor" where that divides them).
"""

import dataclasses
from typing import Any, Callable, Optional

import jax
import numpy as np

from maxtext.model import model_config
from maxtext.runtime import mesh as mesh_lib

P = jax.sharding.PartitionSpec


@dataclasses.dataclass(frozen=True)
class Layout:
  """The engine's mesh and how its arrays split over it (hashable: the
  programs take it as a static argument).

  Attributes:
    mesh: the devices; None = one device.
    heads_axis: the mesh axis the pool's key/value heads split over
      (`for_model`), or None.
  """

  mesh: Optional[jax.sharding.Mesh] = None
  heads_axis: Optional[str] = None

  @property
  def replicas(self) -> int:
    """R: the devices on the mesh's "data" axis (1 without one)."""
    if self.mesh is None:
      return 1
    return self.mesh.shape.get(mesh_lib.DATA_AXIS, 1)

  def split(self, dim: int) -> P:
    """The spec of an array whose dimension `dim` is split over the
    replicas (replicated when R = 1)."""
    data = mesh_lib.DATA_AXIS if self.replicas > 1 else None
    return P(*(None,) * dim, data)

  def pool_spec(self) -> P:
    """The spec of a pool leaf: [L, N, P, K, D] (grouped-query) or [L, N,
    P, D] (MLA's latents): pages over "data", heads over `heads_axis`."""
    if self.heads_axis is None:
      return self.split(1)
    data = mesh_lib.DATA_AXIS if self.replicas > 1 else None
    return P(None, data, None, self.heads_axis, None)

  def sharding(self, spec: P) -> Optional[jax.sharding.NamedSharding]:
    """`spec` on the mesh; None without one."""
    if self.mesh is None:
      return None
    return jax.sharding.NamedSharding(self.mesh, spec)

  def constrain(self, tree: Any, spec: P) -> Any:
    """Every leaf of `tree` placed by `spec` (inside a program; unchanged
    without a mesh)."""
    sharding = self.sharding(spec)
    if sharding is None:
      return tree
    return jax.tree_util.tree_map(
        lambda x: jax.lax.with_sharding_constraint(x, sharding), tree
    )

  def put(self, value: Any, spec: P = P()) -> jax.Array:
    """A host value on the engine's devices, placed by `spec` (each
    process passes the same whole value)."""
    # A transfer, not a program (`jnp.asarray` would launch one), of a
    # private copy: on a CPU the device array may share the host buffer,
    # and the engine reuses its host arrays while calls are in flight.
    return jax.device_put(np.array(value), self.sharding(spec))

  def per_replica(
      self, body: Callable[..., Any], in_specs: tuple, out_specs: Any
  ) -> Callable[..., Any]:
    """`body` run on each replica's blocks.

    Args:
      body: a function of local blocks (an array split over "data" by its
        spec arrives as its replica's block; an [R] per-replica value as
        [1]).
      in_specs, out_specs: `shard_map`'s, naming "data" only (`split`;
        P() for a value every replica takes whole, the parameters).

    Returns:
      `jax.shard_map` of `body`, manual over "data" and automatic over the
      other axes; `body` itself when R = 1 (its arguments are then the
      whole arrays, which are its blocks).
    """
    if self.replicas == 1:
      return body
    return jax.shard_map(
        body,
        mesh=self.mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        axis_names={mesh_lib.DATA_AXIS},
        # The decode loop's carry turns from replicated constants into
        # per-replica values; the specs above say where everything is.
        check_vma=False,
    )


def for_model(
    config: model_config.ModelConfig, mesh: Optional[jax.sharding.Mesh]
) -> Layout:
  """The engine's layout of `config`'s pool on `mesh` (None: one device).

  A grouped-query pool's heads (K) split over the mesh's tensor axis when
  it divides them: each device keeps the heads its attention computes (the
  projections are split so, `transformer.param_partition_specs`), and the
  pool takes 1 / tensor of the bytes on each. MLA's latent entries have no
  heads, and heads the tensor axis does not divide stay whole.
  """
  if mesh is None:
    return Layout()
  tensor = mesh_lib.tensor_size(mesh)
  heads = (
      mesh_lib.TENSOR_AXIS
      if tensor > 1
      and config.attention_type != "mla"
      and config.num_kv_heads % tensor == 0
      else None
  )
  return Layout(mesh, heads)
