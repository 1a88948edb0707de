"""Named TPU slices: the names users type, their chips, devices and memory.

A slice is named two ways, and both are accepted:

* JAX's (libtpu's) form, `GENERATION:SHAPE`: the chips along each axis of
  the slice's torus, e.g. "v5p:2x2x1" (4 chips), "v5e:4x4" (16 chips).
* Cloud TPU's accelerator type, `GENERATION-COUNT`, e.g. "v5p-8", "v5e-16",
  "v5litepod-16". Cloud TPU counts TensorCores in v4, v5p and TPU7x names
  (two per chip: "v5p-8" is 4 chips) and chips in v5e and v6e names
  ("v5e-16" is 16 chips). A count names the usual shape of that many chips
  (powers of two: "v5p-128" is 4x4x4); other shapes are named in the
  first form.

A slice is whole hosts of 2x2 chips (2x2x1 on 3-D tori), except the
one-chip slices Cloud TPU offers of v5e and v6e ("v5litepod-1", "v5e-1",
"v6e-1", "v5e:1x1"): a single chip on a host of its own.

A JAX device is one chip on v4 and v5p (their two TensorCores run as one
"megacore" device), v5e and v6e (one TensorCore per chip); on TPU7x each of
a chip's two TensorCores is a device.

`hbm_bytes` per device is what the TPU compiler lets one program use
(its RESOURCE_EXHAUSTED message quotes it as "available HBM"), measured with
the TPU package set's libtpu; `topology_test` checks it against the
compiler. Parsing imports no JAX; `abstract_devices` calls libtpu.
"""

import dataclasses
import math
import re
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class Generation:
  """One TPU generation.

  Attributes:
    name: the name JAX's topology descriptions take ("v5p").
    aliases: other names users type ("v5litepod").
    device_kind: `jax.Device.device_kind` of its devices.
    dims: axes of its torus (2 or 3).
    counts_cores: whether Cloud TPU's accelerator type counts TensorCores
      (two per chip) rather than chips.
    devices_per_chip: JAX devices per chip.
    hbm_bytes: HBM one program may use on one device (the TPU compiler's
      "available HBM").
    chip_config: libtpu's chip configuration ("megacore": one device per
      chip), or None for the generation's default.
    one_chip: whether Cloud TPU offers a slice of one chip (1x1).
  """

  name: str
  aliases: tuple[str, ...]
  device_kind: str
  dims: int
  counts_cores: bool
  devices_per_chip: int
  hbm_bytes: int
  chip_config: Optional[str] = None
  one_chip: bool = False


_GIB = 2**30

# "available HBM" as the TPU compiler quotes it, in GiB (its "G").
GENERATIONS = (
    Generation("v4", (), "TPU v4", 3, True, 1, int(30.75 * _GIB), "megacore"),
    Generation(
        "v5e",
        ("v5litepod",),
        "TPU v5 lite",
        2,
        False,
        1,
        int(15.75 * _GIB),
        one_chip=True,
    ),
    Generation("v5p", (), "TPU v5", 3, True, 1, int(95.74 * _GIB)),
    Generation(
        "v6e", (), "TPU v6 lite", 2, False, 1, int(31.25 * _GIB), one_chip=True
    ),
    Generation("tpu7x", ("v7x",), "TPU7x", 3, True, 2, int(94.75 * _GIB)),
)

# Fake CPU devices ("cpu:N"), to try the compile path without libtpu: no
# HBM of their own.
CPU = Generation("cpu", (), "cpu", 1, False, 1, 0)

# A slice's shape is made of whole hosts: 2x2 chips (x1 on 3-D tori).
_HOST_CHIPS = (2, 2, 1)


@dataclasses.dataclass(frozen=True)
class Slice:
  """One TPU slice.

  Attributes:
    generation: the generation.
    shape: chips along each torus axis.
  """

  generation: Generation
  shape: tuple[int, ...]

  @property
  def name(self) -> str:
    """JAX's topology name, e.g. "v5p:2x2x1"."""
    return f"{self.generation.name}:{'x'.join(map(str, self.shape))}"

  @property
  def chips(self) -> int:
    return math.prod(self.shape)

  @property
  def devices(self) -> int:
    """JAX devices in the slice."""
    return self.chips * self.generation.devices_per_chip

  @property
  def chips_per_host(self) -> tuple[int, int, int]:
    """Chips on each host along each axis (three axes, as libtpu takes
    them): 1x1x1 for a one-chip slice, else 2x2x1."""
    if self.chips == 1:
      return (1, 1, 1)
    return _HOST_CHIPS


def _generation(name: str, text: str) -> Generation:
  for generation in GENERATIONS + (CPU,):
    if name == generation.name or name in generation.aliases:
      return generation
  known = sorted(n for g in GENERATIONS for n in (g.name,) + g.aliases)
  raise ValueError(
      f"--topology={text!r}: unknown TPU generation {name!r}; known: "
      f"{', '.join(known)}"
  )


def _shape_of_chips(chips: int, dims: int) -> tuple[int, ...]:
  """The usual torus of a power-of-two chip count: axes as even as may be,
  the larger ones last (3-D: 4 chips are 2x2x1, 8 are 2x2x2, 32 are 2x4x4)."""
  if dims == 3 and chips == 4:
    return (2, 2, 1)
  shape = [1] * dims
  for _ in range(chips.bit_length() - 1):
    shape[0] *= 2
    shape.sort()
  return tuple(shape)


def parse(text: str) -> Slice:
  """The slice a topology name names.

  Args:
    text: "v5p:2x2x1", "v5e:4x4", "v5p-8", "v5e-16", "v5litepod-16",
      "v5litepod-1", "v5e:1x1" ..., or "cpu:N" (N fake CPU devices).

  Returns:
    The slice.

  Raises:
    ValueError: one line naming the value: an unknown generation, a
      malformed name, a count that is not one chip (where Cloud TPU offers
      one) or a power of two of whole hosts, or a shape that is not whole
      hosts (2x2 chips) or such a chip.
  """
  if not isinstance(text, str):
    raise TypeError(f"topology must be a str, got {text!r}")
  spec = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)*)", text.strip().lower())
  count = re.fullmatch(r"([a-z0-9]+)-(\d+)", text.strip().lower())
  if spec:
    generation = _generation(spec.group(1), text)
    shape = tuple(int(n) for n in spec.group(2).split("x"))
    if generation.dims == 2 and len(shape) == 3 and shape[2] == 1:
      shape = shape[:2]
    if len(shape) != generation.dims:
      raise ValueError(
          f"--topology={text!r}: a {generation.name} slice has "
          f"{generation.dims} axes, e.g. {generation.name}:"
          + "x".join(["2"] * generation.dims)
      )
  elif count and count.group(1) != CPU.name:
    generation = _generation(count.group(1), text)
    shape = _shape_of_count(generation, int(count.group(2)), text)
  else:
    raise ValueError(
        f"--topology={text!r}: expected GENERATION:SHAPE (v5p:2x2x1, "
        f"v5e:4x4) or a Cloud TPU accelerator type (v5p-8, v5e-16)"
    )
  if generation is not CPU:
    _check_whole_hosts(generation, shape, text)
  return Slice(generation, shape)


def _shape_of_count(generation: Generation, number: int, text: str):
  """The shape of Cloud TPU's accelerator type `generation`-`number`."""
  chips = number // 2 if generation.counts_cores else number
  unit = "TensorCores" if generation.counts_cores else "chips"
  one_chip = generation.one_chip and chips == 1
  if (
      (chips < 4 and not one_chip)
      or chips & (chips - 1)
      or (generation.counts_cores and number % 2)
  ):
    chips_text = f" ({number / 2:g} chips)" if generation.counts_cores else ""
    smallest = "1 or " if generation.one_chip else ""
    raise ValueError(
        f"--topology={text!r}: {generation.name} names count {unit}; "
        f"{number} {unit}{chips_text} is not {smallest}a power of two of at "
        f"least 4 chips: name the shape instead, e.g. {generation.name}:"
        + "x".join(["4"] * generation.dims)
    )
  return _shape_of_chips(chips, generation.dims)


def _check_whole_hosts(generation: Generation, shape, text: str) -> None:
  """Refuses a shape that is neither whole hosts nor an offered one-chip
  slice."""
  if generation.one_chip and all(n == 1 for n in shape):
    return
  host = _HOST_CHIPS[: generation.dims]
  if any(n < 1 for n in shape) or any(n % h for n, h in zip(shape, host)):
    one_chip = (
        f" (or one chip, {generation.name}:"
        + "x".join(["1"] * generation.dims)
        + ")"
        if generation.one_chip
        else ""
    )
    raise ValueError(
        f"--topology={text!r}: a {generation.name} slice is whole hosts of "
        f"{'x'.join(map(str, host))} chips{one_chip}; "
        f"{'x'.join(map(str, shape))} is not"
    )


def by_device_kind(device_kind: str) -> Optional[Generation]:
  """The generation whose devices are of `device_kind`, or None."""
  for generation in GENERATIONS:
    if generation.device_kind == device_kind:
      return generation
  return None


def abstract_devices(tpu_slice: Slice, num_slices: int = 1) -> list[Any]:
  """The devices of `num_slices` such slices, described by libtpu.

  They compile programs (`jit(...).lower(...).compile()` runs the TPU
  compiler) but hold no memory and run nothing; no TPU need be present.

  Args:
    tpu_slice: the slice.
    num_slices: slices joined by the data-center network (>= 1); their
      devices' `slice_index` tells them apart.

  Returns:
    The devices, slice by slice.
  """
  # Parsing names needs no JAX, so JAX loads only here.
  # pylint: disable-next=import-outside-toplevel
  from jax.experimental import topologies

  kwargs = {"chips_per_host_bounds": tpu_slice.chips_per_host}
  if tpu_slice.generation.chip_config:
    kwargs["chip_config_name"] = tpu_slice.generation.chip_config
  return list(
      topologies.get_topology_desc(
          platform="tpu",
          topology_name=tpu_slice.name,
          num_slices=num_slices,
          **kwargs,
      ).devices
  )
