"""Generation on devices of its own: the mesh and the weight copy.

With `grpo_generation_devices` = N > 0, each of the job's P processes gives
its last N / P devices to generation and trains on the rest
(`mesh.generation_split`; a job of one process: the last N devices). The
generation mesh splits the parameters FSDP over its devices, with the
config's tensor parallelism where it divides them (and no expert or
context axis: a decode step holds one token a sequence). Every process holds a
part of both meshes, so every process dispatches both meshes' programs, in
the loop's one order, as a multi-controller job needs. With
`grpo_generation_replicas` R > 1 the generation mesh's data axis holds R
replicas of the parameters, each split FSDP (and tensor) over N / R
devices, and the paged decoder runs a replica of itself on each, with its
own slots and pages (`replica_layout`).

Before each rollout the engine's parameters are copied onto the generation
mesh in the compute dtype (`GenerationMesh.copy`). A multi-controller job
moves an array between two different sets of devices only within a
process: JAX refuses a reshard whose two sides are different devices of
several processes. So the copy pairs each generation device with a
training device of its own process. With a training and b generation
devices a process and s = gcd(a, b):

1. On the training mesh the parameters are cast to the compute dtype, in
   the training layout (one program). When s < a they are then laid out
   over the training devices as a/s replicas of one layout over P * s
   devices, each leaf split along its largest dimension that P * s
   divides (replicated when none does), so that the first replica's
   devices, s a process, hold one whole model between them; when s = a
   the training layout itself is the source.
2. Each process copies each of its s source devices' shards to b / s of
   its generation devices (source device i to generation devices
   j * s + i, j < b / s): single-device copies within the process.
3. Those copies are, leaf by leaf, one array on the generation devices
   laid out as b / s repeats of the source layout
   (`jax.make_array_from_single_device_arrays`: nothing moves), which one
   reshard on the generation devices lays out as the generation mesh's
   parameters.

`rollout/weight_copy_bytes` is what step 2 moves (b / s times the source
layout's bytes, replicated leaves counted on every device that holds one)
and `timing/weight_copy` the seconds from the cast's dispatch until the
parameters are on the generation mesh. For a moment the copy holds, on
each generation device, one source device's share of the model beside its
own share.

The rollout then runs there (its programs dispatched to other devices than
the training step's), so with `grpo_max_age` 1 the rollout of step s + 1 and
update s run at the same time on different devices; with `grpo_max_age` 0
the rollout waits for the update as it does on shared devices. The copy is
of the parameters the rollout is drawn with, so its samples' versions (ages)
are the same as on shared devices.
"""

import math
import time
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from maxtext.engine import model_setup
from maxtext.generation import decode_weights
from maxtext.grpo.rollout import rollout_config
from maxtext.runtime import mesh as mesh_lib

# The axes of the laid-out source (step 1 with s < a) and of the copies.
_REPLICA, _FLAT, _REPEAT = "replica", "flat", "repeat"


def _generation_mesh_config(
    settings: rollout_config.RolloutConfig, num_devices: int
) -> mesh_lib.MeshConfig:
  """The generation mesh's settings: `grpo_generation_replicas` on the
  data axis, FSDP over each replica's devices, the training mesh's tensor
  parallelism where it divides them, no other axis.

  Raises:
    ValueError: as `mesh.MeshConfig.validate`.
  """
  tensor = settings.tensor_parallelism
  replicas = settings.grpo_generation_replicas
  mesh_config = mesh_lib.MeshConfig(
      data_parallelism=replicas,
      fsdp_parallelism=-1,
      expert_parallelism=1,
      tensor_parallelism=(
          tensor if (num_devices // replicas) % tensor == 0 else 1
      ),
      context_parallelism=1,
      dcn_data_parallelism=1,
      dcn_fsdp_parallelism=1,
      generation_devices=0,
  )
  mesh_config.validate()
  return mesh_config


def _by_process(devices: list) -> list[list]:
  """`devices` grouped by process, in process order, each group in the
  list's order."""
  groups: dict[int, list] = {}
  for device in devices:
    groups.setdefault(device.process_index, []).append(device)
  return [groups[p] for p in sorted(groups)]


def _flat_spec(shape: tuple[int, ...], ways: int) -> PartitionSpec:
  """A leaf split `ways` ways along its largest dimension that `ways`
  divides (the first of equals), or replicated."""
  dims = [d for d, size in enumerate(shape) if size % ways == 0]
  if ways == 1 or not dims:
    return PartitionSpec()
  split = max(dims, key=lambda d: (shape[d], -d))
  return PartitionSpec(
      *[_FLAT if d == split else None for d in range(len(shape))]
  )


class _Route:
  """Which training devices send the parameters and which generation
  devices receive each one's shards (steps 1-3 of the module docstring)."""

  def __init__(self, train_devices: list, generation_devices: list):
    # `mesh.generation_split` gives every process as many of each.
    train = _by_process(train_devices)
    generate = _by_process(generation_devices)
    a, b = len(train[0]), len(generate[0])
    s = math.gcd(a, b)
    # Laid out (step 1 with s < a): replica r of the source layout is each
    # process's training devices r * s .. r * s + s - 1.
    self.staged = s < a
    self.replicas = (
        Mesh(
            np.array(
                [
                    [own[r * s + i] for own in train for i in range(s)]
                    for r in range(a // s)
                ]
            ),
            (_REPLICA, _FLAT),
        )
        if self.staged
        else None
    )
    self.ways = len(train) * s
    # Source device -> its generation devices, by process and place.
    sources = [own[:s] for own in train] if self.staged else train
    self.targets = {
        source: [own_g[j * s + i] for j in range(b // s)]
        for own_s, own_g in zip(sources, generate)
        for i, source in enumerate(own_s)
    }
    self.repeats = b // s

  def source_sharding(self, leaf: jax.Array) -> NamedSharding:
    """The leaf's layout on the source devices: the training layout, or
    (staged) the first replica's of `replicas`."""
    if not self.staged:
      return leaf.sharding
    return NamedSharding(self.replicas, _flat_spec(leaf.shape, self.ways))

  def transit_sharding(self, source: NamedSharding) -> NamedSharding:
    """`source` repeated over the generation devices the route pairs with
    its devices (only the first replica's, staged)."""
    devices = source.mesh.devices
    names = source.mesh.axis_names
    if self.staged:
      devices, names = devices[0], names[1:]
    repeated = np.array(
        [
            [self.targets[d][j] for d in devices.flat]
            for j in range(self.repeats)
        ]
    ).reshape((self.repeats,) + devices.shape)
    return NamedSharding(Mesh(repeated, (_REPEAT,) + tuple(names)), source.spec)

  def send(self, leaf: jax.Array, transit: NamedSharding) -> jax.Array:
    """Step 2 and 3 for one leaf laid out on the source devices: each of
    this process's source shards copied to its generation devices, the
    copies one array of `transit`."""
    copies = {}
    for shard in leaf.addressable_shards:
      for target in self.targets.get(shard.device, ()):
        copies[target] = jax.device_put(shard.data, target)
    return jax.make_array_from_single_device_arrays(
        leaf.shape,
        transit,
        [
            copies[d]
            for d in transit.addressable_devices_indices_map(leaf.shape)
        ],
    )

  def bytes_moved(self, leaf: jax.Array, source: NamedSharding) -> int:
    """Bytes step 2 moves for `leaf` over the whole job."""
    shard = math.prod(source.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    return shard * len(self.targets) * self.repeats


class GenerationMesh:
  """The generation devices' mesh and the copy of the weights onto it.

  Attributes:
    mesh: the generation mesh.
    copy_bytes: bytes one copy moves between the meshes (the module
      docstring's step 2); set by the first `copy`.
  """

  def __init__(
      self,
      settings: rollout_config.RolloutConfig,
      train_devices: list,
      devices: list,
  ):
    self.mesh = mesh_lib.make_mesh(
        _generation_mesh_config(settings, len(devices)), devices
    )
    setup = model_setup.setup_model(settings.model, self.mesh)
    self._shardings = setup.param_shardings
    self._route = _Route(train_devices, devices)
    self._compute_dtype = settings.model.compute_dtype
    self._cast = None
    # Each leaf's source and transit layouts, made by the first copy.
    self._layouts = None
    self.copy_bytes: Optional[int] = None

  def _cast_of(self, params: Any):
    """The jitted cast to the compute dtype, output in the parameters' own
    layout (each leaf's `NamedSharding`, the route's source)."""
    if self._cast is None:
      compute_dtype = self._compute_dtype

      def cast(tree):
        return jax.tree.map(
            lambda x, dtype: x.astype(dtype),
            tree,
            decode_weights.dtypes(tree, compute_dtype),
        )

      self._cast = jax.jit(
          cast, out_shardings=jax.tree.map(lambda x: x.sharding, params)
      )
    return self._cast

  def copy(self, params: Any) -> tuple[Any, float]:
    """(`params` cast to the compute dtype on the generation mesh, the
    seconds the copy took: dispatch to arrival, measured by waiting on
    it)."""
    start = time.perf_counter()
    route = self._route
    cast = self._cast_of(params)(params)
    if self._layouts is None:
      sources = jax.tree.map(route.source_sharding, cast)
      self._layouts = (sources, jax.tree.map(route.transit_sharding, sources))
      self.copy_bytes = sum(
          jax.tree.leaves(jax.tree.map(route.bytes_moved, cast, sources))
      )
    sources, transits = self._layouts
    if route.staged:
      cast = jax.device_put(cast, sources)
    transit = jax.tree.map(route.send, cast, transits)
    del cast
    copied = jax.device_put(transit, self._shardings)
    jax.block_until_ready(copied)
    return copied, time.perf_counter() - start


def make(
    settings: rollout_config.RolloutConfig, mesh_config: mesh_lib.MeshConfig
) -> Optional[GenerationMesh]:
  """The run's `GenerationMesh` for its generation settings, or None when
  generation shares the training devices (`mesh_config.generation_devices`
  0).

  Raises:
    ValueError: as `mesh.generation_split`.
  """
  train, devices = mesh_lib.generation_split(mesh_config)
  return GenerationMesh(settings, train, devices) if devices else None
