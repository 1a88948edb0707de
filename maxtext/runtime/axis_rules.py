"""Logical-axis rules: which mesh axes split each dimension of a parameter.

Every parameter dimension has a logical name (`transformer.param_logical_axes`:
"layers", "embed", "experts", ...). A `Rules` table maps those names onto the
mesh's axes (`maxtext.runtime.mesh`), in the spirit of MaxText's
`logical_axis_rules`, so a model's layout is a table, not code per model.
A parameter's `PartitionSpec` comes from two kinds of rule, applied in order:

  by name   a dimension with a listed name is split over the listed mesh
            axes: "experts" over "expert".
  FSDP      then the parameter's largest other dimension that divides evenly
            is split over the FSDP axes that are left: "fsdp" and "expert",
            every axis that holds a share of the batch but "data" (which
            replicates by definition). Never a dimension named in `never`:
            "layers", which `lax.scan` slices, and "experts", which only
            the expert axis splits (on a mesh without one, too).

A mesh axis splits at most one dimension of a parameter, so a routed expert's
weights ([layers, experts, embed, moe_mlp]) go over "expert" by name and over
"fsdp" by FSDP, while every other weight of an MoE model (attention, dense
and shared MLPs, router, embeddings, norms) is split over fsdp x expert: no
expert group repeats another's share. When no dimension divides by all the
FSDP axes' devices, the last axis is dropped and the rest tried ("fsdp"
alone); when none divides even by that, the parameter is replicated. Axes of
size 1 and axes the mesh lacks are skipped, so a mesh without an expert axis
shards exactly as one with "fsdp" alone.
"""

import dataclasses
import math
from typing import Mapping, Optional, Sequence

from jax.sharding import PartitionSpec

from maxtext.runtime import mesh as mesh_lib


@dataclasses.dataclass(frozen=True)
class Rules:
  """A layout: logical names to mesh axes (the module docstring).

  Attributes:
    by_name: (logical name, mesh axes) pairs; a dimension of that name is
      split over those axes (the ones of size > 1 not used already).
    fsdp: the mesh axes that split each parameter's largest remaining
      dimension, in order (the order of the devices along it).
    never: logical names never split by FSDP.
  """

  by_name: tuple[tuple[str, tuple[str, ...]], ...]
  fsdp: tuple[str, ...]
  never: tuple[str, ...] = ("layers", "experts")


# The layout every run uses: experts over "expert", everything else over
# every batch axis but "data".
PARAMETERS = Rules(
    by_name=(("experts", (mesh_lib.EXPERT_AXIS,)),),
    fsdp=(mesh_lib.FSDP_AXIS, mesh_lib.EXPERT_AXIS),
)

# The layout before: the non-expert weights of an MoE model split over
# "fsdp" only and repeated in each expert group (what checkpoints written
# before this table were sharded as; tests compare the two).
FSDP_ONLY = dataclasses.replace(PARAMETERS, fsdp=(mesh_lib.FSDP_AXIS,))


def largest_dividing(
    shape: Sequence[int],
    names: Sequence[str],
    devices: int,
    skip: Sequence[str] = (),
    taken: Sequence[int] = (),
) -> Optional[int]:
  """The largest dimension (the first of equals) that `devices` divides,
  none of whose name is in `skip` and which is not in `taken`; None if
  there is none, or `devices` is 1."""
  if devices == 1:
    return None
  best = None
  for dim, (size, name) in enumerate(zip(shape, names)):
    if dim in taken or name in skip or size % devices:
      continue
    if best is None or size > shape[best]:
      best = dim
  return best


def partition_spec(
    shape: Sequence[int],
    names: Sequence[str],
    sizes: Mapping[str, int],
    rules: Rules = PARAMETERS,
) -> PartitionSpec:
  """The `PartitionSpec` of one parameter under `rules`.

  Args:
    shape: the parameter's shape.
    names: its logical axis names, one per dimension.
    sizes: mesh axis name -> devices on it (missing axes count as 1).
    rules: the layout.

  Returns:
    One entry per dimension: None, a mesh axis, or a tuple of mesh axes
    (major to minor).

  Raises:
    ValueError: a dimension split by name is not divisible by its axes'
      devices, e.g. "expert_parallelism=3 does not divide the 4 experts".
  """
  if len(shape) != len(names):
    raise ValueError(f"shape {tuple(shape)} has no name for each of {names}")
  out: list = [None] * len(shape)
  used: set[str] = set()

  def usable(axes):
    return tuple(a for a in axes if sizes.get(a, 1) > 1 and a not in used)

  def place(dim, axes):
    out[dim] = axes[0] if len(axes) == 1 else axes
    used.update(axes)

  named = dict(rules.by_name)
  for dim, (size, name) in enumerate(zip(shape, names)):
    axes = usable(named.get(name, ()))
    if not axes:
      continue
    devices = math.prod(sizes[a] for a in axes)
    if size % devices:
      split = " x ".join(f"{a}_parallelism={sizes[a]}" for a in axes)
      raise ValueError(f"{split} does not divide the {size} {name}")
    place(dim, axes)

  axes = usable(rules.fsdp)
  taken = [dim for dim, entry in enumerate(out) if entry is not None]
  while axes:
    devices = math.prod(sizes[a] for a in axes)
    dim = largest_dividing(shape, names, devices, rules.never, taken)
    if dim is not None:
      place(dim, axes)
      break
    axes = axes[:-1]
  return PartitionSpec(*out)
