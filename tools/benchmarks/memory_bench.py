r"""Memory report: the compiled training step's device memory, never run.

Runbook:

  tools/bazel run //tools/benchmarks:memory_bench -- \
      --config=maxtext/configs/gpu_1b.py [--device_memory_gb=141,80]
  # 8 fake CPU devices, FSDP over all of them:
  tools/bazel run //tools/benchmarks:memory_bench -- \
      --config=maxtext/configs/llama31_8b.py --host_devices=8

It builds the config's engine on abstract parameters (`jax.ShapeDtypeStruct`s
with their real shardings: nothing is allocated), lowers the programs one
training step runs with `Engine.lower` (the trainer's own micro-step, whose
last call in a step takes the update with K > 1, and with K = 1 the update,
a program of its own; not copies) and compiles them for the default
backend: the micro-step once per attention implementation the backend has
and per remat policy, and the program that takes the update twice. For each
program it prints XLA's memory analysis per device:

  args      bytes of the program's arguments (parameters, accumulator, batch)
  out       bytes of its outputs
  alias     output bytes that reuse donated argument buffers
  temp      XLA's temporaries (activations kept for the backward pass, ...)
  peak      args + out - alias + temp, plus the training state that stays on
            the device without being an argument (the optimizer state beside
            a K = 1 micro-step; the update, and a K > 1 micro-step, take all
            of it): what the device holds while the program runs.

A step fits a device if its largest program peak is at most the device
memory (`--device_memory_gb`, decimal GB) times `--usable_fraction` (what the
runtime leaves to programs; on GPUs set XLA_PYTHON_CLIENT_MEM_FRACTION to
match). The program that takes the update is shown twice: donating
parameters and optimizer state (the engine's default, one copy of the
state) and not donating (two copies while the flush decides).

The closing line compares the temporaries of full rematerialisation with none
for the config's own attention implementation (its largest micro-step):

  memory_bench: temp_full/none=R

With `--mesh` it compiles nothing and needs no devices: it prints the
per-device bytes of the training state (parameters, float32 gradient
accumulator, AdamW moments) for that mesh, from the model's shapes and
partition specs (`state_memory`), and whether the state alone fits each
device memory (activations come on top):

  tools/bazel run //tools/benchmarks:memory_bench -- \
      --config=maxtext/configs/deepseekv3_671b.py --mesh=expert=32,fsdp=8

  memory_bench state: total=T GB fits 141=yes 80=NO
"""

import math
import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

# A config file and cpu_devices import no jax, which must load only once main()
# has set the CPU device count (see below).
from maxtext.runtime import cpu_devices
from maxtext.configs import gpu_1b
from tools import command_line

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.abspath(gpu_1b.__file__),
    "Model and run config (default: configs/gpu_1b.py).",
    lock_config=True,
)
_ATTENTION = flags.DEFINE_list(
    "attention",
    [],
    "Attention implementations to compile (default: every "
    "one the backend has).",
)
_REMAT = flags.DEFINE_list(
    "remat_policy",
    ["none", "full", "save_dots", "save_named"],
    "Remat policies to compile.",
)
_DEVICE_MEMORY_GB = flags.DEFINE_list(
    "device_memory_gb",
    ["141", "80"],
    "Device memories (decimal GB) to check the step against.",
)
_USABLE = flags.DEFINE_float(
    "usable_fraction",
    0.95,
    "Fraction of a device's memory that programs may use.",
)
_UNIT = flags.DEFINE_enum(
    "unit", "GB", ["GB", "MB"], "Unit of the table (decimal)."
)
_MESH = flags.DEFINE_string(
    "mesh",
    "",
    "If set, e.g. expert=32,fsdp=8 (axes data, fsdp, expert; unnamed = 1): "
    "report the training state's per-device bytes on that mesh from shapes "
    "alone, compiling nothing.",
)
_HOST_DEVICES = flags.DEFINE_integer(
    "host_devices",
    0,
    "If > 0, run on this many fake CPU devices "
    "(--xla_force_host_platform_device_count).",
)

_GB = 1e9


def _attentions(config) -> list[str]:
  """The attention implementations the default backend has."""
  # jax, and maxtext that imports it, load only after main() has set
  # XLA_FLAGS (--host_devices), which the CPU backend reads once.
  import jax  # pylint: disable=import-outside-toplevel

  backend = jax.default_backend()
  names = ["einsum", "dot_product"]
  if backend == "gpu" and config.compute_dtype in ("bfloat16", "float16"):
    names.append("cudnn")
  if backend == "tpu":
    names.append("splash")
  return names


def analyse(config, donate: bool = True, programs=None) -> list[dict]:
  """Compiles the step's programs for `config`; returns one row per program.

  The compile is `train_compile_lib.compile_step`'s (the trainer's engine
  from `model_setup`), on this host's devices.

  Args:
    config: a run config (base.py's fields).
    donate: the engine's `donate_state`.
    programs: None for all, or a predicate on the names (`Engine.lower`'s
      keys) of the programs to compile.

  Returns:
    Rows {"program", "args", "out", "alias", "temp", "resident", "peak"},
    per-device bytes, in the order the step runs the programs.
  """
  # jax, and maxtext that imports it, load only after main() has set
  # XLA_FLAGS (--host_devices), which the CPU backend reads once.
  # pylint: disable=import-outside-toplevel
  from maxtext.runtime import mesh as mesh_lib
  from maxtext.engine import compile_config
  from maxtext.engine import train_compile_lib
  # pylint: enable=import-outside-toplevel
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.donate_state = donate
  step = train_compile_lib.compile_step(
      compile_config.CompileConfig.from_config(config),
      mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config)),
      programs,
  )
  if step.out_of_memory is not None:
    raise RuntimeError(step.out_of_memory.message)
  return [
      {
          "program": p.program,
          "args": p.args,
          "out": p.out,
          "alias": p.alias,
          "temp": p.temp,
          "resident": p.resident,
          "peak": p.peak,
      }
      for p in step.programs
  ]


def _gb(n: int) -> str:
  return f"{n / (_GB if _UNIT.value == 'GB' else 1e6):.3f}"


def _print_rows(label: str, rows: list[dict], memories: list[float]) -> None:
  for row in rows:
    fits = " ".join(
        "yes" if row["peak"] <= m * _GB * _USABLE.value else "NO"
        for m in memories
    )
    print(
        f"{label:<24} {row['program']:<22} {_gb(row['args']):>9} "
        f"{_gb(row['out']):>9} {_gb(row['alias']):>9} "
        f"{_gb(row['temp']):>9} {_gb(row['resident']):>9} "
        f"{_gb(row['peak']):>9}  {fits}"
    )


def _state_report(config, mesh_text: str, memories: list[float]) -> None:
  """Prints the training state's per-device bytes on a stated mesh."""
  # jax, and maxtext that imports it, load only after main() has set
  # XLA_FLAGS (--host_devices), which the CPU backend reads once.
  # pylint: disable=import-outside-toplevel
  from tools.benchmarks import state_memory

  # pylint: enable=import-outside-toplevel
  with command_line.user_errors("memory_bench"):
    sizes = state_memory.parse_mesh(mesh_text)
    # A mesh the config cannot use (e.g. an expert axis that does not divide
    # num_experts) is the user's mistake too.
    state = state_memory.state_bytes(config, sizes)
  devices = math.prod(sizes.values())
  mesh = " ".join(f"{a}={n}" for a, n in sizes.items())
  print(
      f"memory_bench state: emb "
      f"{config.emb_dim}, {config.num_layers} layers, {config.num_experts} "
      f"routed experts; mesh {mesh} ({devices} devices); weights "
      f"{config.weight_dtype}"
  )
  print(
      f"per-device {_UNIT.value}, training state only (activations and "
      f"temporaries come on top); fits = total <= {_USABLE.value:g} x "
      f"device memory:"
  )
  for name, value in (
      ("parameters", state.params),
      ("gradients", state.grads),
      ("optimizer", state.opt_state),
      ("total", state.total),
  ):
    print(f"  {name:<12} {_gb(value):>12}")
  fits = " ".join(
      f"{m:g}={'yes' if state.total <= m * _GB * _USABLE.value else 'NO'}"
      for m in memories
  )
  print(
      f"memory_bench state: total={_gb(state.total)} {_UNIT.value} "
      f"fits {fits}"
  )


def _print_header(
    base, devices: list, backend: str, memories: list[float]
) -> None:
  """Prints the run's devices and shape, the units and the table's header."""
  print(
      f"memory_bench: {len(devices)} x {devices[0].device_kind} "
      f"({backend}); emb {base.emb_dim}, {base.num_layers} "
      f"layers, seq {base.max_sequence_length}, global batch "
      f"{base.global_batch_size} in K={base.gradient_accumulation_steps}, "
      f"mesh data={base.data_parallelism} fsdp={base.fsdp_parallelism}, "
      f"weights {base.weight_dtype}, compute {base.compute_dtype}, "
      f"loss_chunk_size {base.loss_chunk_size}"
  )
  print(
      f"per-device {_UNIT.value}; fits = peak <= {_USABLE.value:g} x "
      f"{', '.join(f'{m:g}' for m in memories)} GB"
  )
  print(
      f"{'attention/remat':<24} {'program':<22} {'args':>9} {'out':>9} "
      f"{'alias':>9} {'temp':>9} {'resident':>9} {'peak':>9}  fits"
  )
  sys.stdout.flush()


def _sweep(
    base, attentions: list[str], memories: list[float]
) -> tuple[dict, dict]:
  """Prints the micro-step's row of each attention and --remat policy.

  Returns:
    (its temporary bytes, its peak bytes), each by (attention, remat).
  """
  micro_temp = {}
  peaks = {}
  for attention in attentions:
    for remat in _REMAT.value:
      config = base.copy_and_resolve_references()
      with config.unlocked():
        config.attention = attention
        config.remat_policy = remat
      rows = analyse(config, programs=lambda name: name == "micro_step")
      _print_rows(f"{attention}/{remat}", rows, memories)
      sys.stdout.flush()
      micro_temp[(attention, remat)] = max(r["temp"] for r in rows)
      peaks[(attention, remat)] = max(r["peak"] for r in rows)
  return micro_temp, peaks


def _update_peak(base, memories: list[float]) -> int:
  """Prints the rows of the program that takes the update, donating the
  state and not; returns its peak bytes when donating.

  With K = 1 that program is the update, a program of its own (the attention
  and remat policy do not change it); with K > 1 the config's micro-step,
  whose last call in a step takes it.
  """
  takes = "update" if base.gradient_accumulation_steps == 1 else "micro_step"
  peaks = {}
  for donate in (True, False):
    rows = analyse(base, donate=donate, programs=lambda name: name == takes)
    _print_rows(
        f"{takes}/{'donated' if donate else 'not_donated'}", rows, memories
    )
    peaks[donate] = rows[0]["peak"]
  return peaks[True]


def main(argv):
  command_line.check(argv)
  if _MESH.value:
    # Imported here, like below: jax loads only after XLA_FLAGS is final.
    # pylint: disable=import-outside-toplevel
    from maxtext.config import config_lib

    # pylint: enable=import-outside-toplevel
    with command_line.user_errors("memory_bench", (TypeError, ValueError)):
      config_lib.validate(_CONFIG.value)
    _state_report(
        _CONFIG.value, _MESH.value, [float(m) for m in _DEVICE_MEMORY_GB.value]
    )
    return
  if _HOST_DEVICES.value > 0:
    cpu_devices.request(_HOST_DEVICES.value)
  # Only now, with XLA_FLAGS set: the CPU backend reads it once.
  # pylint: disable=import-outside-toplevel
  import jax
  from maxtext.config import config_lib
  from maxtext.model import transformer
  # pylint: enable=import-outside-toplevel
  base = _CONFIG.value
  config_lib.validate(base)
  memories = [float(m) for m in _DEVICE_MEMORY_GB.value]
  attentions = _ATTENTION.value or _attentions(base)
  _print_header(base, jax.devices(), jax.default_backend(), memories)
  own = transformer.attention_implementation(base)
  micro_temp, peaks = _sweep(base, attentions, memories)
  update_peak = _update_peak(base, memories)
  print(
      "step peak (largest program) with the donating update: "
      + ", ".join(
          f"{a}/{r} {_gb(max(p, update_peak))}" for (a, r), p in peaks.items()
      )
  )
  if (own, "full") in micro_temp and (own, "none") in micro_temp:
    ratio = micro_temp[(own, "full")] / max(micro_temp[(own, "none")], 1)
    print(f"memory_bench: temp_full/none={ratio:.3f}")


if __name__ == "__main__":
  app.run(main)
