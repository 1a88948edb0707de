r"""What a compiled program's fusions compute: a census of its optimized HLO.

Runbook:

  # The step's programs compiled for one v5e chip, their HLO text kept:
  tools/bazel run --config=tpu //tools:train_compile -- \
      --config=maxtext/configs/gpu_1b.py --config.num_layers=8 \
      --config.global_batch_size=8 --topology=v5e:1x1 --hlo_dir=/tmp/hlo
  tools/bazel run //tools/benchmarks:hlo_census -- \
      --hlo=/tmp/hlo/micro_step.hlo.txt

A profile names a fusion after its root instruction, so the weight-gradient
matmul of a scanned layer stack, whose output the compiler converts and
writes into the stacked gradient in place, shows as a "dynamic-update-slice
fusion" of the whole stack's shape. This module reads the text of a
compiled program (`jax.stages.Compiled.as_text()`, after the backend's
optimizations) and says, for each fusion the program launches, what is
inside it: its root, the matrix products it holds and their floating-point
operations, the bytes a root dynamic-update-slice writes, and how many times
it runs per call of the program (the trip counts of the while loops around
it); and how many times each custom call (a kernel) runs.

Counting rules:
  * A `dot` does 2 x (output elements) x (the product of its left operand's
    contracting dimensions) operations; a `convolution` (how the TPU
    compiler writes many products) 2 x (output rows and features) x (the
    kernel's input features) x (the window positions that fall inside the
    unpadded input, summed over output positions); dilations are not read
    (a dilated window counts as an undilated one).
  * A while loop whose condition compares its counter (tuple element 0)
    against a constant N with `direction=LT` runs N times (the counter
    starts at 0, as `jax.lax.scan` and `fori_loop` lower); a loop of any
    other form counts once and is listed in `Census.unknown_loops`.
  * A conditional's branches each count as if taken (an upper bound).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Optional

from absl import app
from absl import flags

from maxtext.core import caller_paths
from tools import command_line

_HLO = flags.DEFINE_string(
    "hlo", None, "A compiled program's HLO text (train_compile --hlo_dir)."
)
_TOP = flags.DEFINE_integer(
    "top", 15, "Fusions listed, by floating-point operations per call."
)

# "bf16[8,2048,8192]{2,1,0:T(8,128)(2,1)}" -> dtype, dims.
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
# "%name = SHAPE opcode(operands), attributes".
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$"
)
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*\(")
_CALLS = re.compile(r"\b(calls|body|condition|to_apply)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_WINDOW_FIELD = re.compile(r"(size|stride|pad)=([0-9_x]+)")
_CONSTANT = re.compile(r"constant\((-?[0-9]+)\)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')

_BYTES = {
    "pred": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
    "c64": 8,
    "c128": 16,
}


@dataclasses.dataclass(frozen=True)
class Array:
  """An array's element type and dimensions."""

  dtype: str
  dims: tuple[int, ...]

  @property
  def elements(self) -> int:
    return math.prod(self.dims)

  @property
  def bytes(self) -> int:
    return self.elements * _BYTES.get(self.dtype, 4)

  def __str__(self) -> str:
    return f"{self.dtype}[{','.join(str(d) for d in self.dims)}]"


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One HLO instruction: its name, result shape text, opcode, the names of
  its operands, the computations it calls, and its whole line."""

  name: str
  shape: str
  opcode: str
  operands: tuple[str, ...]
  calls: tuple[str, ...]
  line: str

  @property
  def array(self) -> Optional[Array]:
    """The result when it is one array (not a tuple)."""
    if self.shape.startswith("("):
      return None
    return _parse_array(self.shape)


def _parse_array(text: str) -> Optional[Array]:
  match = _ARRAY.search(text)
  if not match:
    return None
  dims = tuple(int(d) for d in match.group(2).split(",") if d)
  return Array(match.group(1), dims)


def _split_operands(text: str) -> tuple[str, ...]:
  """The `%names` of an operand list (the text after the opening '(')."""
  depth, end = 1, len(text)
  for i, char in enumerate(text):
    if char in "({[":
      depth += 1
    elif char in ")}]":
      depth -= 1
      if depth == 0:
        end = i
        break
  return tuple(re.findall(r"%([\w.\-]+)", text[:end]))


def parse(text: str) -> tuple[dict[str, list[Instruction]], str]:
  """The module's computations (name -> instructions, in order) and the
  name of its entry computation.

  Raises:
    ValueError: the text has no ENTRY computation.
  """
  computations: dict[str, list[Instruction]] = {}
  entry = None
  current = None
  for line in text.splitlines():
    header = _COMPUTATION.match(line)
    if header and line.rstrip().endswith("{"):
      current = header.group(2)
      computations[current] = []
      if header.group(1):
        entry = current
      continue
    if current is None:
      continue
    if line.rstrip() == "}":
      current = None
      continue
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, shape, opcode, rest = match.groups()
    calls = [m.group(2) for m in _CALLS.finditer(rest)]
    branches = _BRANCHES.search(rest)
    if branches:
      calls += re.findall(r"%([\w.\-]+)", branches.group(1))
    computations[current].append(
        Instruction(
            name, shape, opcode, _split_operands(rest), tuple(calls), line
        )
    )
  if entry is None:
    raise ValueError("the HLO text has no ENTRY computation")
  return computations, entry


def _root(instructions: list[Instruction]) -> Optional[Instruction]:
  """A computation's ROOT instruction (its last when none is marked)."""
  for instruction in instructions:
    if instruction.line.lstrip().startswith("ROOT"):
      return instruction
  return instructions[-1] if instructions else None


def trip_count(
    condition: list[Instruction],
    computations: Optional[dict[str, list[Instruction]]] = None,
) -> Optional[int]:
  """N for a loop condition whose root is `compare(counter, constant(N)),
  direction=LT` (or a fusion of that compare alone, as the CPU compiler
  wraps it), else None."""
  constants = {}
  for instruction in condition:
    if instruction.opcode == "constant":
      value = _CONSTANT.search(instruction.line)
      if value:
        constants[instruction.name] = int(value.group(1))
  root = _root(condition)
  if root is None or len(root.operands) != 2:
    return None
  compare = root
  if root.opcode == "fusion" and computations and root.calls:
    compare = _root(computations.get(root.calls[0], []))
  if (
      compare is None
      or compare.opcode != "compare"
      or "direction=LT" not in compare.line
  ):
    return None
  return constants.get(root.operands[1])


def product_flops(
    instruction: Instruction, shapes: dict[str, Optional[Array]]
) -> int:
  """Floating-point operations of a `dot` or `convolution` (0 for others)."""
  out = instruction.array
  if out is None or instruction.opcode not in ("dot", "convolution"):
    return 0
  if len(instruction.operands) < 2:
    return 0
  lhs, rhs = (shapes.get(name) for name in instruction.operands[:2])
  if lhs is None or rhs is None:
    return 0
  if instruction.opcode == "dot":
    contracting = _CONTRACTING.search(instruction.line)
    if contracting is None:
      return 0
    dims = [int(d) for d in contracting.group(1).split(",") if d]
    return 2 * out.elements * math.prod(lhs.dims[d] for d in dims)
  return _convolution_flops(instruction.line, lhs, rhs, out)


def _convolution_flops(line: str, lhs: Array, rhs: Array, out: Array) -> int:
  """2 x the multiply-adds of a convolution: for each output batch row and
  feature, the kernel's input features times, per spatial dimension, the
  (output position, window position) pairs that land inside the unpadded
  input (the TPU compiler pads a dimension so that a window slides over
  heads or layers, where most window positions read padding)."""
  labels = _DIM_LABELS.search(line)
  if labels is None:
    return 0
  lhs_labels, rhs_labels, out_labels = labels.groups()
  window = _WINDOW.search(line)
  fields = dict(_WINDOW_FIELD.findall(window.group(1))) if window else {}
  spatial = sorted(c for c in out_labels if c.isdigit())
  sizes = _window_list(fields.get("size"), len(spatial), "1", int)
  strides = _window_list(fields.get("stride"), len(spatial), "1", int)
  pads = _window_list(
      fields.get("pad"),
      len(spatial),
      "0_0",
      lambda p: tuple(int(x) for x in p.split("_")),
  )
  taps = 1
  for d, digit in enumerate(spatial):
    n = lhs.dims[lhs_labels.index(digit)]
    m = out.dims[out_labels.index(digit)]
    taps *= sum(
        sum(
            1
            for w in range(sizes[d])
            if 0 <= p * strides[d] + w - pads[d][0] < n
        )
        for p in range(m)
    )
  macs = (
      out.dims[out_labels.index("b")]
      * out.dims[out_labels.index("f")]
      * rhs.dims[rhs_labels.index("i")]
      * taps
  )
  return 2 * macs


def _window_list(text, count, default, convert):
  """A window field's per-dimension values ("8x16" -> [8, 16])."""
  parts = text.split("x") if text else [default] * count
  return [convert(p) for p in parts]


@dataclasses.dataclass(frozen=True)
class Fusion:
  """A fusion (or a lone product) the program launches.

  Attributes:
    name: the instruction's name.
    computation: the computation it is in.
    root: the opcode of its fused computation's root ("dot" for a lone
      product).
    shape: its result.
    flops: the floating-point operations of the products inside it, once.
    updated_bytes: for a root dynamic-update-slice, the bytes of the update
      it writes (the buffer it writes into is updated in place); else 0.
    runs: how many times it runs per call of the program.
  """

  name: str
  computation: str
  root: str
  shape: str
  flops: int
  updated_bytes: int
  runs: int


@dataclasses.dataclass(frozen=True)
class Census:
  """The fusions of a program and its loops."""

  fusions: tuple[Fusion, ...]
  # (while instruction, trip count) for each loop reached.
  loops: tuple[tuple[str, int], ...]
  unknown_loops: tuple[str, ...]
  # (custom call, runs per call of the program): the kernels (a Pallas
  # kernel on the TPU is a custom call named after it), or the target of a
  # custom call the compiler named "custom-call.N".
  custom_calls: tuple[tuple[str, int], ...] = ()

  def custom_call_runs(self) -> dict[str, int]:
    """Runs per call of the program by custom call, its name without the
    numeric suffix ("splash_mha_fwd_residuals")."""
    runs: dict[str, int] = {}
    for name, n in self.custom_calls:
      kernel = re.sub(r"\.\d+$", "", name)
      runs[kernel] = runs.get(kernel, 0) + n
    return runs

  def total_flops(self) -> int:
    """The products' floating-point operations per call of the program."""
    return sum(f.flops * f.runs for f in self.fusions)

  def rooted(self, opcode: str) -> list[Fusion]:
    """The fusions whose root is `opcode`."""
    return [f for f in self.fusions if f.root == opcode]


def _shapes(instructions: list[Instruction]) -> dict[str, Optional[Array]]:
  return {i.name: i.array for i in instructions}


def _inside(
    computations: dict[str, list[Instruction]], name: str
) -> tuple[int, str, int]:
  """(flops of the products, root opcode, bytes a root dynamic-update-slice
  writes) of a fused computation, nested fusions included."""
  instructions = computations.get(name, [])
  shapes = _shapes(instructions)
  flops = 0
  root = _root(instructions)
  for instruction in instructions:
    flops += product_flops(instruction, shapes)
    if instruction.opcode == "fusion":
      for called in instruction.calls:
        flops += _inside(computations, called)[0]
  if root is None:
    return flops, "", 0
  updated = 0
  if root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
    update = shapes.get(root.operands[1])
    updated = update.bytes if update else 0
  return flops, root.opcode, updated


def census(text: str) -> Census:
  """The census of a compiled program's HLO text (`Compiled.as_text()`)."""
  computations, entry = parse(text)
  fusions, loops, unknown, custom_calls = [], [], [], []

  def walk(name: str, runs: int) -> None:
    instructions = computations.get(name, [])
    shapes = _shapes(instructions)
    for instruction in instructions:
      if instruction.opcode == "fusion" and instruction.calls:
        flops, root, updated = _inside(computations, instruction.calls[0])
        fusions.append(
            Fusion(
                instruction.name,
                name,
                root,
                instruction.shape.split("{")[0],
                flops,
                updated,
                runs,
            )
        )
      elif instruction.opcode in ("dot", "convolution"):
        fusions.append(
            Fusion(
                instruction.name,
                name,
                instruction.opcode,
                instruction.shape.split("{")[0],
                product_flops(instruction, shapes),
                0,
                runs,
            )
        )
      elif instruction.opcode == "while":
        body, condition = _loop_parts(instruction)
        trips = trip_count(computations.get(condition, []), computations)
        if trips is None:
          unknown.append(instruction.name)
        loops.append((instruction.name, trips or 1))
        walk(body, runs * (trips or 1))
      elif instruction.opcode == "custom-call":
        custom_calls.append((_custom_call_name(instruction), runs))
      elif instruction.opcode in ("call", "conditional"):
        for called in instruction.calls:
          walk(called, runs)

  walk(entry, 1)
  return Census(
      tuple(fusions), tuple(loops), tuple(unknown), tuple(custom_calls)
  )


def _custom_call_name(instruction: Instruction) -> str:
  """A custom call's instruction name (a kernel's, on the TPU), or its
  target when the name is only "custom-call.N" (the compiler's own)."""
  target = _TARGET.search(instruction.line)
  if instruction.name.startswith("custom-call") and target:
    return target.group(1)
  return instruction.name


def _loop_parts(instruction: Instruction) -> tuple[str, str]:
  """(body, condition) computation names of a while instruction."""
  found = dict(_CALLS.findall(instruction.line))
  return found.get("body", ""), found.get("condition", "")


def report(found: Census, top: int) -> list[str]:
  """The census as lines: the loops, the custom calls (kernels) by runs,
  the `top` fusions by operations per call of the program, every fusion
  whose root is a dynamic-update-slice, and a last line of counts."""
  lines = [
      "loops: "
      + (", ".join(f"{name} x{trips}" for name, trips in found.loops) or "-")
      + (
          f" (trips unknown: {', '.join(found.unknown_loops)})"
          if found.unknown_loops
          else ""
      )
  ]
  header = (
      f"{'fusion':<44} {'root':<22} {'shape':<30} {'GFLOP':>9} "
      f"{'runs':>5} {'update MiB':>10}"
  )

  def row(f: Fusion) -> str:
    return (
        f"{f.name:<44} {f.root:<22} {f.shape[:30]:<30} "
        f"{f.flops / 1e9:>9.1f} {f.runs:>5} "
        f"{f.updated_bytes / 2**20:>10.1f}"
    )

  ranked = sorted(found.fusions, key=lambda f: -f.flops * f.runs)
  kernels = found.custom_call_runs()
  lines.append(
      "custom calls: "
      + (", ".join(f"{name} x{n}" for name, n in kernels.items()) or "-")
  )
  lines += [f"the {top} fusions with the most operations per call:", header]
  lines += [row(f) for f in ranked[:top]]
  updating = found.rooted("dynamic-update-slice")
  lines += ["fusions whose root is a dynamic-update-slice:", header]
  lines += [row(f) for f in updating]
  with_product = [f for f in updating if f.flops]
  updated = sum(f.updated_bytes * f.runs for f in updating)
  lines.append(
      f"hlo_census: fusions={len(found.fusions)} "
      f"product_tflop={found.total_flops() / 1e12:.3f} "
      f"dus_fusions={len(updating)} dus_with_product={len(with_product)} "
      f"dus_update_mib={updated / 2**20:.1f} "
      f"custom_call_runs={sum(kernels.values())}"
  )
  return lines


def _read(path: str) -> str:
  """The text of --hlo (relative to where the user ran the tool).

  Raises:
    ValueError: naming the path, when it cannot be read.
  """
  try:
    with open(caller_paths.resolve_local_path(path), encoding="utf-8") as f:
      return f.read()
  except OSError as e:
    raise ValueError(f"--hlo={path}: {e.strerror}") from None


def main(argv: list[str]) -> None:
  command_line.check(argv, _HLO)
  with command_line.user_errors("hlo_census"):
    text = _read(_HLO.value)
    try:
      found = census(text)
    except ValueError as e:
      raise ValueError(f"--hlo={_HLO.value}: {e}") from None
  for line in report(found, _TOP.value):
    print(line)


if __name__ == "__main__":
  app.run(main)
