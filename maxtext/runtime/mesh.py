"""The device mesh and how parameters and batches are laid out on it.

Every run is built on a mesh with two named axes, ("data", "fsdp"); one CPU is
a 1x1 mesh, so single- and multi-device runs share the same code. Batches are
split over both axes (every device holds a different slice of the batch);
parameters, and the optimizer state that mirrors them, are split over "fsdp"
and replicated over "data".

With `expert_parallelism` > 1 the mesh has a third axis, "expert": the experts
of the mixture-of-experts layers are split over it, and batches are split over
it as well, so its devices do not repeat each other's work outside the
experts; every other parameter is split over "fsdp" and "expert" together, so
no expert group holds a copy of another's share. Which mesh axes split which
parameter dimension is the table of `maxtext.runtime.axis_rules`
(`transformer.param_partition_specs` applies it).

With `tensor_parallelism` > 1 the mesh has a last axis, "tensor" (the
innermost, so its devices are nearest neighbours on the chips' links): the
attention heads and the MLP and expert hidden widths are split over it, the
Megatron way (the projections into them by columns, the projections out by
rows, one all-reduce of the output), and batches are not: every device of a
tensor group holds the same rows.

With `context_parallelism` > 1 the mesh has an axis "context" (between
"expert" and "tensor"): each row's tokens are split over it, in the
zig-zag order of `maxtext.model.zigzag` (device i holds the row's chunks i
and 2C - 1 - i of 2C, so every device has the same causal attention work),
and the devices of a context group hold the same rows. Parameters are
split over it as over "fsdp" (its devices compute different tokens with
the same weights); attention all-gathers the keys and values over it.

On TPUs the mesh follows the slice's physical torus
(`jax.experimental.mesh_utils`), so neighbours on a mesh axis are neighbours
on the chips' links. Devices of several slices (`slice_index`) make a hybrid
mesh: `dcn_data_parallelism` x `dcn_fsdp_parallelism` slices joined by the
data-center network, each axis within a slice as `data_parallelism` and
`fsdp_parallelism` say; by default data parallelism spans the slices, so
only its gradient reduction crosses the slower network.

The mesh's settings are `MeshConfig`: the config's parallelism fields and
`generation_devices`, which the run's workload sets (a GRPO run's
`grpo_generation_devices`, 0 for every other workload:
`Workload.mesh_config`), so the mesh reads no workload's name or field.
"""

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

from maxtext.core import component_config

DATA_AXIS = "data"
FSDP_AXIS = "fsdp"
EXPERT_AXIS = "expert"
TENSOR_AXIS = "tensor"
CONTEXT_AXIS = "context"
BATCH_AXES = (DATA_AXIS, FSDP_AXIS)


@dataclasses.dataclass(frozen=True)
class MeshConfig(component_config.ComponentConfig):
  """The mesh's settings (`maxtext/configs/base.py` documents each field).

  Attributes:
    data_parallelism: data-parallel replicas within a slice; -1 = all
      devices the other axes leave.
    fsdp_parallelism: devices that shard parameters within a slice; -1 as
      above (at most one of the two is -1).
    expert_parallelism: the "expert" axis.
    tensor_parallelism: the "tensor" axis.
    context_parallelism: the "context" axis.
    dcn_data_parallelism: slices holding data-parallel replicas; -1 = all
      slices the other leaves.
    dcn_fsdp_parallelism: slices FSDP shards over; -1 as above.
    generation_devices: devices that generate instead of training
      (`generation_split`); 0 = all train. The workload decides
      (`Workload.mesh_config`): the config's for a GRPO run, else 0.
  """

  data_parallelism: int = -1
  fsdp_parallelism: int = 1
  expert_parallelism: int = 1
  tensor_parallelism: int = 1
  context_parallelism: int = 1
  dcn_data_parallelism: int = -1
  dcn_fsdp_parallelism: int = 1
  generation_devices: int = 0

  def validate(self) -> None:
    """The axes' sizes on their own (against the devices: `make_mesh`).

    Raises:
      ValueError: a size neither -1 nor >= 1, or both of a pair -1.
    """
    for prefix, unit in (("", "devices"), ("dcn_", "slices")):
      data = f"{prefix}data_parallelism"
      fsdp = f"{prefix}fsdp_parallelism"
      for key in (data, fsdp):
        value = getattr(self, key)
        if value != -1 and value < 1:
          raise component_config.fail(
              key, value, f"must be -1 (all remaining {unit}) or >= 1"
          )
      if getattr(self, data) == -1 and getattr(self, fsdp) == -1:
        raise component_config.fail(
            fsdp, -1, f"only one of {data} and {fsdp} may be -1"
        )


def mesh_shape(
    data_parallelism: int,
    fsdp_parallelism: int,
    num_devices: int,
    *,
    prefix: str = "",
    unit: str = "devices",
) -> tuple[int, int]:
  """Resolves the (data, fsdp) sizes; -1 means "all devices the other leaves".

  Args:
    data_parallelism: the data axis size, or -1.
    fsdp_parallelism: the FSDP axis size, or -1.
    num_devices: what the two split (devices, or slices).
    prefix: the config fields' prefix in messages ("dcn_" for the axes
      across slices).
    unit: what `num_devices` counts, in messages.

  Raises:
    ValueError: the sizes are not positive (or -1), both are -1, or their
      product is not the number of devices.
  """
  sizes = {
      f"{prefix}data_parallelism": data_parallelism,
      f"{prefix}fsdp_parallelism": fsdp_parallelism,
  }
  for key, value in sizes.items():
    if value != -1 and value < 1:
      raise ValueError(f"{key} must be -1 or positive, got {value}")
  if data_parallelism == -1 and fsdp_parallelism == -1:
    raise ValueError(
        f"at most one of {prefix}data_parallelism and "
        f"{prefix}fsdp_parallelism may be -1"
    )
  if data_parallelism == -1 or fsdp_parallelism == -1:
    known_key, known = (
        ((f"{prefix}fsdp_parallelism", fsdp_parallelism))
        if data_parallelism == -1
        else (f"{prefix}data_parallelism", data_parallelism)
    )
    if num_devices % known:
      raise ValueError(
          f"{known_key}={known} does not divide the {num_devices} {unit}"
      )
    rest = num_devices // known
    return (rest, known) if data_parallelism == -1 else (known, rest)
  if data_parallelism * fsdp_parallelism != num_devices:
    raise ValueError(
        f"{prefix}data_parallelism={data_parallelism} x "
        f"{prefix}fsdp_parallelism={fsdp_parallelism} = "
        f"{data_parallelism * fsdp_parallelism} does not match the "
        f"{num_devices} {unit}"
    )
  return data_parallelism, fsdp_parallelism


def num_slices(devices: Sequence[jax.Device]) -> int:
  """TPU slices among `devices` (`slice_index`); 1 for other devices."""
  return len({getattr(d, "slice_index", 0) for d in devices})


def generation_split(settings: MeshConfig) -> tuple[list, list]:
  """(training devices, generation devices): each process's last
  `settings.generation_devices` / `jax.process_count()` devices
  generate and the rest train (a job of one process: the last N devices);
  all train when it is 0. Both lists are in `jax.devices()` order (process
  by process), so every process holds a part of both meshes and takes part
  in both meshes' programs, as a multi-controller job needs.

  Raises:
    ValueError: more generation devices than leave one to train, or a
      number (or processes of devices) that cannot be shared evenly.
  """
  devices = list(jax.devices())
  n = settings.generation_devices
  if not n:
    return devices, []
  if n >= len(devices):
    raise ValueError(
        f"grpo_generation_devices={n} must leave training at least one of "
        f"the {len(devices)} devices"
    )
  processes = jax.process_count()
  if n % processes:
    raise ValueError(
        f"grpo_generation_devices={n}: each of the {processes} processes "
        f"gives generation the same number of its devices, so it must be a "
        f"multiple of {processes}"
    )
  by_process: dict[int, list] = {}
  for device in devices:
    by_process.setdefault(device.process_index, []).append(device)
  counts = sorted({len(own) for own in by_process.values()})
  if len(counts) > 1:
    raise ValueError(
        f"grpo_generation_devices={n}: the processes hold different numbers "
        f"of devices ({', '.join(map(str, counts))}), so they cannot give "
        "generation the same share"
    )
  # Equal counts and n < len(devices) leave each process one to train.
  keep = counts[0] - n // processes
  train, generate = [], []
  for own in by_process.values():
    train += own[:keep]
    generate += own[keep:]
  return train, generate


def make_mesh(
    settings: MeshConfig, devices: Optional[Sequence[jax.Device]] = None
) -> Mesh:
  """The run's mesh over the training devices (`generation_split`: all of
  them unless `settings.generation_devices` generate), or the given
  ones.

  ("data", "fsdp"), plus "expert" (last, so expert groups are neighbouring
  devices) when `settings.expert_parallelism` > 1. On TPUs the devices are
  laid out on the torus and across slices as the module docstring says.

  Raises:
    ValueError: bad sizes (see `mesh_shape`), or expert_parallelism does not
      divide the number of devices (of one slice).
  """
  devices = list(generation_split(settings)[0] if devices is None else devices)
  slices = num_slices(devices)
  within, names = _slice_axes(settings, len(devices) // slices, slices > 1)
  if devices[0].platform != "tpu":
    # Processes own contiguous blocks of the device list, so data-parallel
    # groups line up with hosts and FSDP collectives stay within a host
    # where they can.
    return Mesh(np.asarray(devices).reshape(within), names)
  if slices == 1:
    return Mesh(_torus_mesh(within, devices), names)
  across = mesh_shape(
      settings.dcn_data_parallelism,
      settings.dcn_fsdp_parallelism,
      slices,
      prefix="dcn_",
      unit="slices",
  )
  across += (1,) * (len(within) - 2)
  return Mesh(
      mesh_utils.create_hybrid_device_mesh(
          within, across, devices, allow_split_physical_axes=True
      ),
      names,
  )


def _slice_axes(
    settings: MeshConfig, per_slice: int, multislice: bool
) -> tuple[tuple[int, ...], tuple[str, ...]]:
  """The mesh's sizes and axis names within one slice of `per_slice`
  devices: the batch axes, then expert, context and tensor where > 1.

  Raises:
    ValueError: as `make_mesh`; "of a slice" when `multislice`.
  """
  experts = settings.expert_parallelism
  tensor = settings.tensor_parallelism
  context = settings.context_parallelism
  where = " of a slice" if multislice else ""
  if experts < 1 or per_slice % experts:
    raise ValueError(
        f"expert_parallelism={experts} must be >= 1 and divide "
        f"the {per_slice} devices" + where
    )
  if tensor < 1 or per_slice % (experts * tensor):
    raise ValueError(
        f"tensor_parallelism={tensor} must be >= 1 and divide the "
        f"{per_slice // experts} devices{where} left by "
        f"expert_parallelism={experts}"
    )
  if context < 1 or per_slice % (experts * tensor * context):
    raise ValueError(
        f"context_parallelism={context} must be >= 1 and divide the "
        f"{per_slice // (experts * tensor)} devices{where} left by "
        f"expert_parallelism={experts} and tensor_parallelism={tensor}"
    )
  within = mesh_shape(
      settings.data_parallelism,
      settings.fsdp_parallelism,
      per_slice // (experts * tensor * context),
  )
  names = BATCH_AXES
  for size, name in (
      (experts, EXPERT_AXIS),
      (context, CONTEXT_AXIS),
      (tensor, TENSOR_AXIS),
  ):
    if size > 1:
      within += (size,)
      names += (name,)
  return within, names


def _torus_mesh(shape: tuple[int, ...], devices: list) -> np.ndarray:
  """`devices` as an array of `shape` along the slice's physical axes; an
  axis that no set of physical axes makes splits one of them."""
  try:
    return mesh_utils.create_device_mesh(shape, devices)
  except (NotImplementedError, ValueError):
    return mesh_utils.create_device_mesh(
        shape, devices, allow_split_physical_axes=True
    )


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
  """The mesh axes a batch's rows are split over: all of them but
  "context" (which splits each row's tokens) and "tensor"."""
  return tuple(
      name for name in BATCH_AXES + (EXPERT_AXIS,) if name in mesh.axis_names
  )


def expert_size(mesh: Mesh) -> int:
  """Devices on the mesh's expert axis (1 when it has none)."""
  return mesh.shape.get(EXPERT_AXIS, 1)


def tensor_size(mesh: Mesh) -> int:
  """Devices on the mesh's tensor axis (1 when it has none)."""
  return mesh.shape.get(TENSOR_AXIS, 1)


def context_size(mesh: Optional[Mesh]) -> int:
  """Devices on the mesh's context axis (1 when it has none, or no mesh)."""
  return 1 if mesh is None else mesh.shape.get(CONTEXT_AXIS, 1)


@dataclasses.dataclass(frozen=True)
class BatchLayout(component_config.ComponentConfig):
  """The batch's sizes that must split evenly over the mesh
  (`check_batch_layout`); the config's fields of these names.

  Attributes:
    global_batch_size: sequences per step, over all processes.
    gradient_accumulation_steps: micro-batches per step.
    eval_batch_size: sequences per eval batch, over all processes.
    max_sequence_length: tokens per sequence.
  """

  global_batch_size: int = 16
  gradient_accumulation_steps: int = 1
  eval_batch_size: int = 16
  max_sequence_length: int = 64


def check_batch_layout(batch: BatchLayout, mesh: Mesh) -> None:
  """Checks that the global and micro batches split evenly over the mesh.

  Raises:
    ValueError: naming the batch size and the number of batch shards.
  """
  shards = math.prod(mesh.shape[name] for name in batch_axes(mesh))
  micro = batch.global_batch_size // batch.gradient_accumulation_steps
  if micro % shards:
    raise ValueError(
        f"global_batch_size={batch.global_batch_size} / "
        f"gradient_accumulation_steps={batch.gradient_accumulation_steps} = "
        f"{micro} sequences per micro-batch is not divisible by the {shards} "
        f"batch shards (data x fsdp x expert devices)"
    )
  if batch.eval_batch_size % shards:
    raise ValueError(
        f"eval_batch_size={batch.eval_batch_size} is not divisible by "
        f"the {shards} batch shards (data x fsdp x expert devices)"
    )
  context = context_size(mesh)
  if context > 1 and batch.max_sequence_length % (2 * context):
    raise ValueError(
        f"max_sequence_length={batch.max_sequence_length} is not divisible "
        f"by 2 x context_parallelism={context} (the zig-zag layout gives "
        f"each device two equal chunks of every row)"
    )
  processes = jax.process_count()
  if micro % processes or batch.eval_batch_size % processes:
    raise ValueError(
        f"micro-batch size {micro} and "
        f"eval_batch_size={batch.eval_batch_size} must be divisible by the "
        f"{processes} processes"
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a [batch, sequence] array: batch over the batch axes."""
  return NamedSharding(mesh, PartitionSpec(batch_axes(mesh), None))


def param_shardings(partition_specs: Any, mesh: Mesh) -> Any:
  """NamedShardings from a pytree of PartitionSpecs."""
  return jax.tree_util.tree_map(
      lambda spec: NamedSharding(mesh, spec),
      partition_specs,
      is_leaf=lambda x: isinstance(x, PartitionSpec),
  )


def global_batch(
    local_batch: Mapping[str, np.ndarray], sharding: NamedSharding
) -> dict[str, jax.Array]:
  """Assembles this process's rows into global arrays sharded as `sharding`.

  Args:
    local_batch: name -> [local_rows, ...] NumPy arrays: this process's
      contiguous share of the global batch, in process order.
    sharding: the batch sharding.

  Returns:
    name -> global jax.Array of shape [local_rows * process_count, ...].
  """
  return {
      name: jax.make_array_from_process_local_data(sharding, value)
      for name, value in local_batch.items()
  }
