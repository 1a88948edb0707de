r"""The decoders' programs compiled for one device, never run: their memory.

Runbook:

  # One TPU v5e chip, compiled on this host with the TPU package set:
  tools/bazel run --config=tpu //tools/benchmarks:decode_memory -- \
      --config=maxtext/configs/gpu_1b.py --config.num_layers=8 \
      --config.weight_dtype=bfloat16 --topology=v5e:2x2 \
      --slots=32 --rows=128 --length=1088 --prompt_length=64
  # The default backend (the CPU here):
  tools/bazel run //tools/benchmarks:decode_memory -- --rows=16

For the model of `--config` (parameters as `jax.ShapeDtypeStruct`s:
nothing is allocated) it lowers and compiles, on one device (the first of
`--topology`'s TPU slice description, or the default backend's):

  paged   the paged decoder's decode program (`paged_lowering.lower`: the
          widest page table of `--length` positions, `--slots` slots) with
          the pool read as `--attention` says;
  static  the static decoder's program (`decoder._generate`: prefill of
          `--rows` prompts of `--prompt_length` ids, then the decode loop
          over a cache of `--length` positions), when `--rows` > 0.

and prints one line each:

  decode_memory: paged slots=S length=T attention=A temp_mib=X args_mib=Y
      bytes_accessed_mib=Z pool_copies_call=N pool_copies_step=M chunk=C
  decode_memory: static rows=R length=T prompt=P temp_mib=X args_mib=Y

temp is XLA's temporaries, args the arguments' bytes (parameters, cache or
pool); "bytes accessed" is the compiler's cost analysis, which counts a
loop's body once and knows nothing of a custom call's (the ragged paged
attention kernel's) own reads: a figure to compare programs by, not a
step's traffic. pool_copies_call and _step count the decode program's
copies of a whole pool leaf (`pool_copies`) outside its loop (once a call:
the TPU compiler's layout changes around the gather path's loop) and in it
(every step: 0 is right, since the loop updates the pool in place);
chunk is the program's most steps a call (`paged_decoder.configured`).
"""

import os
import re

from absl import app
from absl import flags
import jax
from jax.experimental import topologies
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags

from maxtext.configs import decode_bench
from maxtext.generation import decoder
from maxtext.generation import paged_decoder
from maxtext.generation import paged_lowering
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.runtime import mesh as mesh_lib
from tools import command_line

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.abspath(decode_bench.__file__),
    "Model config (default: configs/decode_bench.py).",
    lock_config=True,
)
_TOPOLOGY = flags.DEFINE_string(
    "topology",
    "",
    "A TPU topology name JAX describes (v5e:2x2, v5p:2x2x1); its first "
    "device is the target. Empty: the default backend's first device.",
)
_SLOTS = flags.DEFINE_integer("slots", 16, "Paged decoder slots.")
_ROWS = flags.DEFINE_integer("rows", 0, "Static decoder rows (0: skip).")
_LENGTH = flags.DEFINE_integer("length", 256, "Positions of a sequence.")
_PROMPT = flags.DEFINE_integer("prompt_length", 64, "Ids of a prompt.")
_ATTENTION = flags.DEFINE_enum(
    "attention",
    "auto",
    ["auto", "kernel", "gather"],
    "How the paged decoder reads its pool (EngineOptions.attention).",
)

MIB = 2**20
# HLO's names of the pool's element types.
_HLO_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def target_device(topology: str):
  """The first device of `topology`'s TPU slice description, or of the
  default backend.

  Raises:
    ValueError: naming `topology`, when libtpu cannot describe it (a name
      it lacks, or no TPU package set).
  """
  if not topology:
    return jax.devices()[0]
  try:
    description = topologies.get_topology_desc(
        platform="tpu", topology_name=topology
    )
  except Exception as e:  # libtpu's own types; its first line says why.
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ValueError(f"--topology={topology!r}: {first}") from None
  return description.devices[0]


def _abstract_params(config, mesh):
  """The parameters' shapes, whole on the mesh's one device."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  shapes = jax.eval_shape(
      lambda k: transformer.init_params(config, k), jax.random.PRNGKey(0)
  )
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
      shapes,
  )


def _figures(compiled) -> dict:
  """Temporaries, arguments and bytes accessed of a compiled program."""
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return {
      "temp_mib": memory.temp_size_in_bytes / MIB,
      "args_mib": memory.argument_size_in_bytes / MIB,
      "bytes_accessed_mib": float(cost.get("bytes accessed", 0.0)) / MIB,
  }


def pool_copies(text: str, pool) -> tuple[int, int]:
  """Copies of a whole pool leaf in the compiled program `text` (its
  optimized HLO): `copy` and `copy-start` instructions whose result holds a
  leaf's type and shape, as (in the entry computation: once a call, in the
  computations it calls: the decode loop's body and its conditionals, once
  a step). Each is a pass over all of a leaf's bytes."""
  shapes = {
      f"{_HLO_TYPES[jnp.dtype(leaf.dtype).name]}"
      f"[{','.join(map(str, leaf.shape))}]"
      for leaf in jax.tree_util.tree_leaves(pool)
  }
  counts = [0, 0]
  entry = False
  for line in text.splitlines():
    if line and not line[0].isspace():  # A computation's first line.
      entry = line.startswith("ENTRY ")
    result = re.search(r"= (.*?) copy(?:-start)?\(", line)
    if result and any(shape in result.group(1) for shape in shapes):
      counts[0 if entry else 1] += 1
  return counts[0], counts[1]


def paged(config, device, slots, length, prompt, attention) -> dict:
  """The paged decode program's `_figures`, and its `pool_copies`."""
  mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config), [device])
  lowered = paged_lowering.lower(
      _abstract_params(config, mesh),
      config,
      num_slots=slots,
      length=length,
      prompt_length=prompt,
      engine=paged_decoder.EngineOptions(attention=attention),
      mesh=mesh,
  )
  compiled = lowered.programs["decode"].compile()
  per_call, per_step = pool_copies(compiled.as_text(), lowered.pool)
  return _figures(compiled) | {
      "pool_copies_call": per_call,
      "pool_copies_step": per_step,
      "chunk": lowered.chunk,
  }


def static(config, device, rows, length, prompt) -> dict:
  """The static decoder's program's `_figures`, its prompts padded to
  their length bucket as `decoder.generate` pads them."""
  mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config), [device])
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def shape(dims, dtype, sharding=replicated):
    return jax.ShapeDtypeStruct(dims, dtype, sharding=sharding)

  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  bucket = decoder.cache_length(prompt, length)
  params = _abstract_params(config, mesh)
  # The program `decoder.generate` runs, lowered unrun.
  program = decoder._generate  # pylint: disable=protected-access
  lowered = program.lower(
      params,
      shape((rows, bucket), jnp.int32, decoder.batch_sharding(mesh, 2)),
      shape((rows,), jnp.int32, decoder.batch_sharding(mesh, 1)),
      shape(key.shape, key.dtype),
      shape((), jnp.float32),
      shape((), jnp.int32),
      shape((), jnp.float32),
      shape((), jnp.int32),
      shape((8,), jnp.int32),
      shape((), jnp.int32),
      config=model_config.of(config),
      length=length,
      greedy=True,
      filtered=False,
      mesh=mesh,
  )
  return _figures(lowered.compile())


def _line(kind: str, settings: dict, figures: dict) -> str:
  parts = [f"{k}={v}" for k, v in settings.items()]
  parts += [
      f"{k}={v}" if isinstance(v, int) else f"{k}={v:.1f}"
      for k, v in figures.items()
  ]
  return f"decode_memory: {kind} " + " ".join(parts)


def main(argv: list[str]) -> None:
  """Compiles the programs and prints their lines."""
  command_line.check(argv)
  config = ml_collections.FrozenConfigDict(_CONFIG.value)
  length, prompt = _LENGTH.value, _PROMPT.value
  with command_line.user_errors("decode_memory", (TypeError, ValueError)):
    paged_lowering.check_lowering(config, _SLOTS.value, length, prompt)
    device = target_device(_TOPOLOGY.value)
  count = transformer.num_params(
      _abstract_params(
          config,
          mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config), [device]),
      )
  )
  print(f"decode_memory: {count / 1e6:.1f}M parameters, {device.device_kind}")
  figures = paged(
      config, device, _SLOTS.value, length, prompt, _ATTENTION.value
  )
  print(
      _line(
          "paged",
          dict(slots=_SLOTS.value, length=length, attention=_ATTENTION.value),
          figures,
      )
  )
  if _ROWS.value > 0:
    figures = static(config, device, _ROWS.value, length, prompt)
    figures.pop("bytes_accessed_mib")
    print(
        _line(
            "static",
            dict(rows=_ROWS.value, length=length, prompt=prompt),
            figures,
        )
    )


if __name__ == "__main__":
  app.run(main)
