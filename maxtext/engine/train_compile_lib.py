"""Compiles a run's training step for given devices, ahead of time.

The programs are the trainer's own: the mesh of `mesh.make_mesh` on the
given devices, the model of `model_setup.setup_model` and the engine of
`model_setup.make_engine`, built on abstract parameters (nothing is
allocated), lowered by `Engine.lower` and compiled by the devices' compiler.
What it reads of the run is its settings (`compile_config.CompileConfig`).
The devices may be libtpu's description of a TPU slice
(`topology.abstract_devices`): then the real TPU compiler runs on this host
and its memory analysis says whether the step fits the slice's HBM.

Per program, per device:

  args      bytes of its arguments (parameters, accumulator, batch)
  out       bytes of its outputs
  alias     output bytes that reuse donated argument buffers
  temp      the compiler's temporaries (activations kept for the backward
            pass, ...)
  resident  training state on the device that is not an argument (the
            optimizer state beside the eval, and beside the micro-step
            with K = 1, whose update is a program of its own)
  peak      args + out - alias + temp + resident
"""

import dataclasses
import os
import re
import time
from typing import Any, Callable, Mapping, Optional, Union

import jax

from maxtext.core import progress as progress_lib
from maxtext.data import builtin_datasets
from maxtext.runtime import mesh as mesh_lib
from maxtext.engine import compile_config
from maxtext.engine import model_setup

_GIB = 2**30


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
  """One compiled program's per-device memory (bytes) and compile time."""

  program: str
  args: int
  out: int
  alias: int
  temp: int
  resident: int
  compile_s: float

  @property
  def peak(self) -> int:
    return self.args + self.out - self.alias + self.temp + self.resident


@dataclasses.dataclass(frozen=True)
class OutOfMemory:
  """A program the compiler refused for memory.

  Attributes:
    program: its name (`Engine.lower`'s key).
    required: bytes the compiler said it needs, or None if it said none.
    available: bytes it said one device has, or None.
    message: the compiler's message, first line.
    compile_s: seconds until the compiler refused it.
  """

  program: str
  required: Optional[int]
  available: Optional[int]
  message: str
  compile_s: float


@dataclasses.dataclass(frozen=True)
class StepCompile:
  """A step's compile: the programs that compiled, in the order a step runs
  them, and the one refused for memory (compiling stops there), if any."""

  programs: tuple[ProgramMemory, ...]
  out_of_memory: Optional[OutOfMemory]
  # Name -> compiled program, when `compile_step` was asked to keep them.
  executables: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def peak(self) -> int:
    """The largest program peak (the refused program's need, if larger)."""
    peaks = [p.peak for p in self.programs]
    if self.out_of_memory and self.out_of_memory.required:
      peaks.append(self.out_of_memory.required)
    return max(peaks, default=0)

  @property
  def compile_s(self) -> float:
    refused = self.out_of_memory.compile_s if self.out_of_memory else 0.0
    return sum(p.compile_s for p in self.programs) + refused


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
# "... the total memory required for HLO temporaries (98.33G) exceeds
# available HBM (95.74G)"; "Used 120.50G of 95.74G hbm".
_REQUIRED = re.compile(
    r"required for [^(]*\((\d+(?:\.\d+)?)([KMGTP]?)\) exceeds available "
    r"HBM \((\d+(?:\.\d+)?)([KMGTP]?)\)"
)
_USED = re.compile(
    r"Used (\d+(?:\.\d+)?)([KMGTP]?) of (\d+(?:\.\d+)?)([KMGTP]?) hbm"
)


def parse_out_of_memory(message: str) -> tuple[Optional[int], Optional[int]]:
  """(required, available) bytes from a TPU compiler's RESOURCE_EXHAUSTED
  message (binary units, as it prints them), or None for what it lacks."""
  for pattern in (_REQUIRED, _USED):
    match = pattern.search(message)
    if match:
      need, need_unit, have, have_unit = match.groups()
      return (
          int(float(need) * _UNITS[need_unit]),
          int(float(have) * _UNITS[have_unit]),
      )
  return None, None


def device_bytes(tree: Any) -> int:
  """Bytes one device holds of a pytree of (sharded) ShapeDtypeStructs."""
  total = 0
  for x in jax.tree_util.tree_leaves(tree):
    shape = x.shape
    sharding = getattr(x, "sharding", None)
    if sharding is not None:
      shape = sharding.shard_shape(shape)
    size = 1
    for n in shape:
      size *= n
    total += size * x.dtype.itemsize
  return total


def _shapes(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def abstract_micro_batch(settings: compile_config.CompileConfig) -> Any:
  """One micro-batch's shapes (the whole mesh's, as one process feeds it)."""
  train, _ = builtin_datasets.placeholder_batches(settings.data)
  return _shapes(
      builtin_datasets.split_micro_batches(
          train, settings.engine.gradient_accumulation_steps
      )[0]
  )


def abstract_eval_batch(settings: compile_config.CompileConfig) -> Any:
  """One eval batch's shapes (the whole mesh's, as one process feeds it)."""
  return _shapes(builtin_datasets.placeholder_batches(settings.data)[1])


def pretraining_engine(
    settings: compile_config.CompileConfig, setup: Any, params: Any
) -> Any:
  """Pretraining's engine (`model_setup.make_engine`)."""
  return model_setup.make_engine(settings.engine, setup, params)


@dataclasses.dataclass(frozen=True)
class StepInputs:
  """What a workload's training step is built from, for `compile_step`.

  Each takes the step's settings (a `CompileConfig`, as a search varies
  them); a workload whose step is built from the run's config sets their
  `chosen_fields` on it.

  Attributes:
    make_engine: (settings, setup, params) -> the workload's `Engine` on
      `model_setup.ModelSetup` `setup`; params may be shapes.
    micro_batch: settings -> one micro-batch's shapes (the whole mesh's).
    eval_batch: settings -> an eval batch's shapes for the engine's eval
      program, or None when the workload evaluates otherwise (GRPO
      generates).
  """

  make_engine: Callable[..., Any] = pretraining_engine
  micro_batch: Callable[[Any], Any] = abstract_micro_batch
  eval_batch: Optional[Callable[[Any], Any]] = abstract_eval_batch


# Pretraining's (and SFT's) step: the model's cross-entropy on token rows.
PRETRAINING = StepInputs()


def compile_program(
    name: str,
    lowered: Any,
    resident: int,
    log: Callable[[str], None] = lambda _: None,
    progress: progress_lib.Reporter = progress_lib.SILENT,
) -> tuple[Any, Union[ProgramMemory, OutOfMemory]]:
  """Compiles one lowered program and reads its memory.

  Args:
    name: the program's name in the figures.
    lowered: a `jax.stages.Lowered`.
    resident: bytes on the device beside the program's arguments while it
      runs (`ProgramMemory.resident`).
    log: called with a line as the compile starts and ends.
    progress: hears the compile's elapsed time while it runs (quiet when
      it is short).

  Returns:
    (the compiled program, its `ProgramMemory`), or (None, `OutOfMemory`)
    when the compiler refuses it for memory (RESOURCE_EXHAUSTED); other
    compiler errors are raised.
  """
  log(f"compiling {name}")
  start = time.perf_counter()
  try:
    with progress.waiting(
        f"train_compile: compiling {name}", quiet_if_short=True
    ):
      compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    seconds = time.perf_counter() - start
    required, available = parse_out_of_memory(str(e))
    return None, OutOfMemory(
        name, required, available, str(e).splitlines()[0], seconds
    )
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  log(f"compiled {name} in {seconds:.1f} s")
  return compiled, ProgramMemory(
      program=name,
      args=memory.argument_size_in_bytes,
      out=memory.output_size_in_bytes,
      alias=memory.alias_size_in_bytes,
      temp=memory.temp_size_in_bytes,
      resident=resident,
      compile_s=seconds,
  )


def compile_step(
    settings: compile_config.CompileConfig,
    mesh: jax.sharding.Mesh,
    programs: Optional[Callable[[str], bool]] = None,
    log: Callable[[str], None] = lambda _: None,
    every_program: bool = False,
    inputs: StepInputs = PRETRAINING,
    progress: progress_lib.Reporter = progress_lib.SILENT,
    hlo_dir: Optional[str] = None,
) -> StepCompile:
  """Compiles the programs one training step of `settings` runs on `mesh`.

  Args:
    settings: the step's settings, of a validated run config.
    mesh: the run's mesh (`mesh.make_mesh`) on the devices to compile for
      (abstract TPU devices, or this host's), its batch layout checked
      (`mesh.check_batch_layout`).
    programs: None for all, or a predicate on the programs' names
      (`Engine.lower`'s keys) to compile.
    log: called with a line as each compile starts and ends.
    every_program: also compile the programs a run needs besides the step's
      (`Engine.lower_programs`: the accumulator's allocation, the eval) and
      keep every compiled program in the result's `executables`, for
      `saved_step.save`.
    inputs: the workload's engine and batch shapes (`StepInputs`).
    progress: as `compile_program`'s, for each program.
    hlo_dir: a directory (made if missing) to write each compiled
      program's optimized HLO text into, as `<program>.hlo.txt`
      (`tools/benchmarks/hlo_census.py` reads it).

  Returns:
    The compiled programs' memory; a program the compiler refuses for memory
    (RESOURCE_EXHAUSTED) ends the compile and is reported, not raised.
  """
  setup = model_setup.setup_model(settings.engine.model, mesh)
  engine = inputs.make_engine(settings, setup, setup.abstract_params)
  opt_bytes, resident_bytes = _resident_bytes(engine)
  done = []
  kept = {}
  lowered_programs = _lower(settings, engine, inputs, every_program)
  for name, lowered in lowered_programs.items():
    if programs is not None and not programs(name):
      continue
    compiled, memory = compile_program(
        name, lowered, resident_bytes.get(name, opt_bytes), log, progress
    )
    if isinstance(memory, OutOfMemory):
      return StepCompile(tuple(done), memory)
    if hlo_dir is not None:
      write_hlo(compiled, name, hlo_dir)
    if every_program:
      kept[name] = compiled
    done.append(memory)
  return StepCompile(tuple(done), None, kept)


def _resident_bytes(engine: Any) -> tuple[int, dict[str, int]]:
  """The bytes of the training state that stay on the device while a
  program runs without being one of its arguments: (the optimizer state's,
  by program name where that differs).

  With K > 1 the micro-step takes all of it; with K = 1 the optimizer state
  stays beside the micro-step (its argument is the parameters) and the
  update takes all of it; the optimizer state stays beside the eval.
  """
  opt_bytes = device_bytes(engine.opt_state)
  separate_update = "update" in engine.program_names()
  return opt_bytes, {
      "micro_step": opt_bytes if separate_update else 0,
      "update": 0,
  }


def _lower(
    settings: compile_config.CompileConfig,
    engine: Any,
    inputs: StepInputs,
    every_program: bool,
) -> dict[str, Any]:
  """The lowered programs of `engine` by name: the step's, or with
  `every_program` every program a run needs (`compile_step`).

  Raises:
    ValueError: `every_program` for a workload whose eval is not the
      engine's.
  """
  micro_batch = inputs.micro_batch(settings)
  if not every_program:
    return engine.lower(micro_batch)
  if inputs.eval_batch is None:
    raise ValueError(
        f"config.workload={settings.workload!r}: its step's programs are "
        "not saved ahead of time (its eval is not the engine's)"
    )
  return engine.lower_programs(micro_batch, inputs.eval_batch(settings))


def write_hlo(compiled: Any, name: str, directory: str) -> str:
  """Writes a compiled program's optimized HLO text to
  `directory/<name>.hlo.txt` (the directory made if missing); its path."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"{name}.hlo.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write(compiled.as_text())
  return path


def gib(n: Optional[int]) -> str:
  """Bytes as GiB with two decimals (the TPU compiler's "G")."""
  return "?" if n is None else f"{n / _GIB:.2f}"


def table(step: StepCompile) -> list[str]:
  """The per-program lines: GiB per device and compile seconds."""
  lines = [
      f"{'program':<22} {'args':>8} {'out':>8} {'alias':>8} {'temp':>8} "
      f"{'resident':>8} {'peak':>8} {'compile_s':>9}   (GiB per device)"
  ]
  for p in step.programs:
    lines.append(
        f"{p.program:<22} {gib(p.args):>8} {gib(p.out):>8} "
        f"{gib(p.alias):>8} {gib(p.temp):>8} {gib(p.resident):>8} "
        f"{gib(p.peak):>8} {p.compile_s:>9.1f}"
    )
  oom = step.out_of_memory
  if oom:
    lines.append(
        f"{oom.program:<22} RESOURCE_EXHAUSTED: needs {gib(oom.required)} "
        f"GiB of {gib(oom.available)} GiB ({oom.compile_s:.1f} s): "
        f"{oom.message}"
    )
  return lines


# Remat policies from the least recomputation to the most: "none" recomputes
# nothing; "save_dots" keeps every projection's output and recomputes the
# element-wise work; "save_named" also recomputes the MLP's hidden layer and
# the attention scores; "save_context" keeps only the attention's context;
# "full" recomputes the whole block.
REMAT_BY_RECOMPUTATION = (
    "none",
    "save_dots",
    "save_named",
    "save_context",
    "full",
)


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One (context and tensor parallelism, remat policy, micro-steps)
  setting a search compiled."""

  remat_policy: str
  gradient_accumulation_steps: int
  step: StepCompile
  tensor_parallelism: int = 1
  context_parallelism: int = 1

  def fits(self, hbm: int) -> bool:
    return self.step.out_of_memory is None and self.step.peak <= hbm


def accumulation_choices(
    settings: compile_config.CompileConfig, mesh: jax.sharding.Mesh
) -> list[int]:
  """The micro-steps K (ascending) whose micro-batch splits over `mesh`."""
  shards = 1
  for name in mesh_lib.batch_axes(mesh):
    shards *= mesh.shape[name]
  batch = settings.data.global_batch_size
  return [
      k
      for k in range(1, batch + 1)
      if batch % k == 0 and (batch // k) % shards == 0
  ]


def tensor_choices(
    settings: compile_config.CompileConfig, mesh: jax.sharding.Mesh
) -> list[int]:
  """The tensor parallelism sizes a search tries, ascending: the mesh's,
  then each doubling that divides the devices the expert axis leaves on a
  slice and the model's query and key/value heads (the MLP widths are
  checked when the mesh is built)."""
  slices = mesh_lib.num_slices(list(mesh.devices.flat))
  room = mesh.devices.size // slices // mesh_lib.expert_size(mesh)
  room *= mesh_lib.tensor_size(mesh)
  model = settings.engine.model
  tensor = settings.engine.mesh.tensor_parallelism
  sizes, t = [], tensor
  while t <= room and room % t == 0:
    if model.attention_type == "mla" or model.num_kv_heads % t == 0:
      if model.num_heads % t == 0:
        sizes.append(t)
    t *= 2
  return sizes or [tensor]


def layout_choices(
    settings: compile_config.CompileConfig, mesh: jax.sharding.Mesh
) -> list[tuple[int, int]]:
  """The (context, tensor) parallelism pairs a search tries: the mesh's
  and their doublings whose product with the expert axis divides a slice's
  devices, tensor one of `tensor_choices` and 2 x context dividing the
  rows; by the devices a row is split over (context x tensor), then the
  least tensor parallelism first. Context parallelism all-gathers each
  layer's keys and values; tensor parallelism all-reduces each layer's
  attention and MLP outputs, activation-sized, forward and backward: more
  bytes than the keys and values of grouped-query attention."""
  slices = mesh_lib.num_slices(list(mesh.devices.flat))
  room = mesh.devices.size // slices // mesh_lib.expert_size(mesh)
  axes = settings.engine.mesh
  pairs, c = [], axes.context_parallelism
  while c <= room and room % c == 0:
    if settings.engine.model.max_sequence_length % (2 * c) == 0:
      for t in tensor_choices(settings, mesh):
        if room % (c * t) == 0:
          pairs.append((c, t))
    c *= 2
  pairs.sort(key=lambda pair: (pair[0] * pair[1], pair[1]))
  return pairs or [(axes.context_parallelism, axes.tensor_parallelism)]


def search(
    settings: compile_config.CompileConfig,
    mesh: jax.sharding.Mesh,
    hbm: int,
    log: Callable[[str], None] = lambda _: None,
    tensor: bool = False,
    inputs: StepInputs = PRETRAINING,
    progress: progress_lib.Reporter = progress_lib.SILENT,
) -> tuple[list[Candidate], Optional[Candidate]]:
  """The least-recomputing, then fewest-micro-step, setting that fits.

  Tries the remat policies in `REMAT_BY_RECOMPUTATION` order and, for each,
  the micro-step counts of `accumulation_choices` from the fewest, and
  stops at the first that fits `hbm` bytes per device: every setting
  before it recomputes more or runs more micro-steps. With `tensor`, all
  of that for each (context, tensor) pair of `layout_choices` in turn (both
  move activations over the links in every layer; they are chosen only
  when no setting fits with fewer devices a row), on a mesh rebuilt from
  the same devices.

  Args:
    settings: the step's settings, of a validated run config (its remat
      policy and K, and with `tensor` its context and tensor parallelism,
      are varied).
    mesh: as `compile_step`'s.
    hbm: bytes one device may use.
    log: as `compile_step`'s.
    tensor: also try larger context and tensor parallelism.
    inputs: as `compile_step`'s.
    progress: as `compile_step`'s.

  Returns:
    (the settings tried, in order; the one that fits, or None).
  """
  tried = []
  pairs = layout_choices(settings, mesh) if tensor else [None]
  devices = list(mesh.devices.flat)
  for pair in pairs:
    here = (mesh_lib.context_size(mesh), mesh_lib.tensor_size(mesh))
    if pair is not None and pair != here:
      settings = settings.with_layout(*pair)
      mesh = mesh_lib.make_mesh(settings.engine.mesh, devices)
    found = _search_mesh(settings, mesh, hbm, log, tried, inputs, progress)
    if found is not None:
      return tried, found
  return tried, None


def _search_mesh(
    settings: compile_config.CompileConfig,
    mesh,
    hbm,
    log,
    tried,
    inputs,
    progress,
) -> Optional[Candidate]:
  """`search` on one mesh: appends to `tried`; the first that fits."""
  for remat in REMAT_BY_RECOMPUTATION:
    for k in accumulation_choices(settings, mesh):
      log(
          f"trying context_parallelism={mesh_lib.context_size(mesh)} "
          f"tensor_parallelism={mesh_lib.tensor_size(mesh)} "
          f"remat_policy={remat} gradient_accumulation_steps={k}"
      )
      step = compile_step(
          settings.with_step(remat, k),
          mesh,
          log=log,
          inputs=inputs,
          progress=progress,
      )
      candidate = Candidate(
          remat,
          k,
          step,
          mesh_lib.tensor_size(mesh),
          mesh_lib.context_size(mesh),
      )
      tried.append(candidate)
      if candidate.fits(hbm):
        return candidate
  return None
