r"""Compiles a config's training step for a TPU slice, on this host.

Runbook (the TPU package set holds the TPU compiler, libtpu; no TPU needed):

  tools/bazel run --config=tpu //tools:train_compile -- \
      --config=maxtext/configs/llama31_8b.py --topology=v5p-8
  # Two slices joined by the data-center network, an override:
  tools/bazel run --config=tpu //tools:train_compile -- \
      --config=maxtext/configs/llama31_8b.py --topology=v5p:2x2x1 \
      --num_slices=2 --config.gradient_accumulation_steps=2

It builds the run's mesh on the named slice's devices as libtpu describes
them, compiles the programs one training step runs (the trainer's own:
`model_setup` and `Engine.lower`; for a GRPO config, `grpo_workload`'s engine
with the GRPO loss on rollout rows of grpo_prompt_length +
grpo_max_completion_length tokens) with the TPU compiler, and prints per
program the per-device arguments, outputs, aliases, temporaries, resident
training state, peak and compile seconds, then one line:

  train_compile: topology=v5p:2x2x1 devices=4 chips=4 peak=X.XX GiB
      hbm=95.74 GiB fits=yes compile_s=T

(one line in the output). HBM is per device, in GiB (the TPU compiler's "G").
With --search it tries remat policies and gradient accumulation and prints
the least-recomputing, fewest-micro-step setting that fits (the last line
then describes that setting); when none fits, the same again with twice the
tensor parallelism, while it divides the devices and the heads.
A step the compiler refuses for memory (RESOURCE_EXHAUSTED) is fits=no with
what it needed and had, exit status 1; a bad topology, or a mesh or batch
that does not divide the slice, is one line and exit status 2.

--topology takes JAX's names (v5p:2x2x1, v5e:4x4, v6e:2x4, v4:2x2x2,
tpu7x:2x2x1) or Cloud TPU's accelerator types (v5p-8, v5e-16, v5litepod-16,
v6e-8, v4-8, tpu7x-8): v4, v5p and tpu7x types count TensorCores (two per
chip), v5e and v6e types count chips, and one chip of those two is a slice
of its own (v5litepod-1, v5e:1x1, v6e-1). cpu:N compiles for N fake CPU
devices (with --hbm_gib), to try the tool without libtpu.

--program=generate compiles a rollout's generation programs instead: the
paged decoder's prefill and decode programs (`maxtext.generation.
paged_programs`, the programs GRPO's rollouts run, lowered by
`paged_lowering`) for --slots sequences of up to --length positions,
contexts of up to --prompt_length ids (by default the config's rollout's:
its prompts, or for a text task's episodes the whole conversation a turn
continues), pages of --page_size positions
(--num_pages of them; by default the engine's), with the parameters in
the compute dtype split over the config's mesh as the
trainer splits them; on a mesh with a data axis of R devices, R replicas
each hold 1 / R of the slots (rounded up to a multiple of R) and of the
pages, as the engine runs them. It prints the same table, the bytes of one
weight copy onto that mesh, and one line:

  train_compile: program=generate topology=v5p:2x2x1 devices=4 chips=4
      slots=S pages=N page_size=P length=T params=X.XX GiB pool=X.XX GiB
      states=X.XX GiB state_bytes_per_slot=B peak=X.XX GiB hbm=95.74 GiB
      fits=yes compile_s=T

(one line; params, pool and states per device).

  tools/bazel run --config=tpu //tools:train_compile -- \
      --config=maxtext/configs/llama31_8b.py --topology=v5p-8 \
      --program=generate --slots=64 --length=8192 --prompt_length=1024 \
      --config.fsdp_parallelism=1 --config.tensor_parallelism=4

--hlo_dir=DIR writes each compiled program's optimized HLO text to
DIR/<program>.hlo.txt (`tools/benchmarks/hlo_census.py` says what its
fusions compute and how often they run); not with --search or
--program=generate.

--compiled_step_file=PATH saves every program a run's engine runs, with the
config fields, devices and versions they were compiled for, once the step
fits; `train_main --config.compiled_step_file=PATH` then compiles none of
them (`maxtext/engine/saved_step.py`). It cannot be combined with --search.

A compile that takes long says so on stderr while it runs
(`train_compile: compiling micro_step: 1m 40s elapsed`, a line every
--progress_interval_s seconds, or one line redrawn on a terminal), then
`train_compile: compiling micro_step: done in 2m 31s`; stdout is as above.
"""

import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

# Imports no JAX, which must start only once main() has set its platform.
from maxtext.core import caller_paths
from maxtext.core import progress
from maxtext.runtime import cpu_devices
from maxtext.runtime import topology
from tools import command_line

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file (a module with get_config()).",
    lock_config=True,
)
_TOPOLOGY = flags.DEFINE_string(
    "topology",
    None,
    "The slice to compile for: v5p:2x2x1, v5e:4x4, ... or a Cloud TPU "
    "accelerator type: v5p-8, v5e-16, v5litepod-16, v6e-8, v4-8, tpu7x-8 "
    "(v4, v5p and tpu7x types count TensorCores, two per chip; v5e and v6e "
    "types count chips; v5litepod-1 and v6e-1 are one chip); cpu:N for N "
    "fake CPU devices.",
)
_NUM_SLICES = flags.DEFINE_integer(
    "num_slices",
    1,
    "Slices joined by the data-center network (data parallelism across "
    "them: dcn_data_parallelism).",
    lower_bound=1,
)
_SEARCH = flags.DEFINE_bool(
    "search",
    False,
    "Search what fits: the remat policies from the least recomputation "
    "(none, save_dots, save_named, full) and, for each, the micro-steps "
    "(gradient_accumulation_steps) that divide the batch from the fewest, "
    "then the same at doubled context and tensor parallelism (fewest "
    "devices a row first, context before tensor); stops at the first "
    "setting that fits and prints it.",
)
_HBM_GIB = flags.DEFINE_float(
    "hbm_gib",
    None,
    "Judge the fit against this many GiB per device instead of the slice's "
    "HBM (e.g. less, for headroom); required for cpu:N.",
)

_COMPILED_STEP_FILE = flags.DEFINE_string(
    "compiled_step_file",
    None,
    "Also compile the run's other programs (the accumulator's allocation, "
    "the eval) and, if the step fits, save them all to this file with the "
    "config fields, devices and versions they were compiled for; "
    "train_main --config.compiled_step_file=PATH then runs them and "
    "compiles none. A pickle: load only files you made.",
)

_HLO_DIR = flags.DEFINE_string(
    "hlo_dir",
    None,
    "Write each compiled program's optimized HLO text into this directory "
    "as <program>.hlo.txt (tools/benchmarks/hlo_census.py summarises it).",
)

_PROGRESS_S = flags.DEFINE_float(
    "progress_interval_s",
    10.0,
    "Seconds between the lines of a long compile's elapsed time on stderr "
    "when it is not a terminal.",
)
_COMPILE = flags.DEFINE_enum(
    "program",
    "train",
    ["train", "generate"],
    "What to compile: the training step, or a rollout's generation "
    "programs (the paged decoder's prefill and decode).",
)
_SLOTS = flags.DEFINE_integer(
    "slots",
    0,
    "--program=generate: sequences decoded together; 0 = the config's "
    "grpo_decode_slots.",
)
_LENGTH = flags.DEFINE_integer(
    "length",
    0,
    "--program=generate: positions of the longest sequence (context plus "
    "completion); 0 = the config's max_sequence_length.",
)
_PROMPT_LENGTH = flags.DEFINE_integer(
    "prompt_length",
    0,
    "--program=generate: ids of the longest context prefilled; 0 = the "
    "config's rollout's (grpo_prompt_length; with grpo_task, a turn's whole "
    "conversation: grpo_prompt_length + grpo_max_completion_length - 1).",
)
_PAGE_SIZE = flags.DEFINE_integer(
    "page_size",
    0,
    "--program=generate: positions per page; 0 = the config's "
    "grpo_decode_page_size.",
)
_NUM_PAGES = flags.DEFINE_integer(
    "num_pages",
    0,
    "--program=generate: the page pool's pages; 0 = the engine's default, "
    "(slots + R) x the pages of the longest sequence for R data replicas.",
)

_PROGRAM = "train_compile"


def _devices(tpu_slice: topology.Slice) -> list:
  """The devices of --num_slices slices; JAX starts here."""
  if tpu_slice.generation is topology.CPU:
    cpu_devices.request(tpu_slice.devices * _NUM_SLICES.value)
  # The host's own accelerators (if any) are never used; libtpu may be loaded
  # by another process (a training job on a TPU host, a parallel test).
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # JAX starts only now, with the platform and device count set above.
  # pylint: disable-next=import-outside-toplevel
  import jax

  if tpu_slice.generation is topology.CPU:
    return jax.devices()
  return topology.abstract_devices(tpu_slice, _NUM_SLICES.value)


def _row_length(config) -> int:
  """Tokens a trained row holds: GRPO's prompt and completion together,
  else max_sequence_length."""
  if config.workload == "grpo":
    return config.grpo_prompt_length + config.grpo_max_completion_length
  return config.max_sequence_length


def _step_inputs(config):
  """The config's workload's step (`train_compile_lib.StepInputs`): GRPO's
  loss on its rollout rows, or the cross-entropy of pretraining and SFT.

  Raises:
    ValueError: a GRPO config that cannot be compiled ahead of time, or
      --compiled_step_file with one.
  """
  # pylint: disable=import-outside-toplevel  # After JAX has its platform.
  from maxtext.config import config_lib
  from maxtext.engine import train_compile_lib

  if config.workload != "grpo":
    return train_compile_lib.PRETRAINING
  from maxtext.grpo import grpo_config
  from maxtext.grpo import grpo_workload

  # pylint: enable=import-outside-toplevel
  if _COMPILED_STEP_FILE.value is not None:
    raise ValueError(
        "--compiled_step_file: not for config.workload='grpo' (its eval "
        "generates, it is not the engine's eval program)"
    )
  # Checks packing.
  grpo_workload.abstract_micro_batch(grpo_config.GrpoConfig.from_config(config))

  def chosen(settings):
    """GRPO's settings of the run's config with the compile's choices (a
    search's)."""
    return grpo_config.GrpoConfig.from_config(
        config_lib.with_values(config, settings.chosen_fields())
    )

  return train_compile_lib.StepInputs(
      make_engine=lambda settings, setup, params: grpo_workload.make_engine(
          chosen(settings), setup, params
      ),
      micro_batch=lambda settings: grpo_workload.abstract_micro_batch(
          chosen(settings)
      ),
      eval_batch=None,
  )


def main(argv):
  command_line.check(argv, _CONFIG, _TOPOLOGY)
  config = _CONFIG.value
  with command_line.user_errors(_PROGRAM, (TypeError, ValueError)):
    _check_flags(config)
    tpu_slice, hbm = _slice_and_hbm()
  devices = _devices(tpu_slice)
  # Imported once JAX has its platform (see _devices).
  # pylint: disable=import-outside-toplevel
  import jax

  if _COMPILED_STEP_FILE.value is not None:
    # Before the first compile, which fixes whether the process uses the
    # persistent compilation cache: an executable the cache hands back
    # serializes into a file whose programs fail to run (missing functions,
    # collectives that never meet), so each program is compiled anew.
    jax.config.update("jax_enable_compilation_cache", False)
  from maxtext.config import config_lib
  from maxtext.runtime import mesh as mesh_lib

  # pylint: enable=import-outside-toplevel
  rollout = inputs = None
  with command_line.user_errors(_PROGRAM, (TypeError, ValueError)):
    config_lib.validate(config)
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.from_config(config), devices)
    if _COMPILE.value == "generate":
      rollout = _rollout_shape(config)
    else:
      mesh_lib.check_batch_layout(
          mesh_lib.BatchLayout.from_config(config), mesh
      )
      inputs = _step_inputs(config)
  if _COMPILE.value == "generate":
    _generate(config, mesh, tpu_slice, devices, hbm, *rollout)
    return
  _train(config, mesh, tpu_slice, devices, hbm, inputs)


def _check_flags(config) -> None:
  """Raises ValueError for flags that do not go together, an --hlo_dir that
  cannot be made (it is made here, before any compile), or --program=generate
  without decode slots."""
  if _SEARCH.value and _COMPILED_STEP_FILE.value is not None:
    raise ValueError(
        "--compiled_step_file: give it without --search, with the "
        "setting the search chose"
    )
  if _HLO_DIR.value is not None and (
      _SEARCH.value or _COMPILE.value == "generate"
  ):
    raise ValueError(
        f"--hlo_dir={_HLO_DIR.value}: for the training step of one "
        "setting (not with --search or --program=generate)"
    )
  if _HLO_DIR.value is not None:
    # Made before any compile: a path under a file is one line, not a
    # traceback after minutes of compiling.
    try:
      os.makedirs(_hlo_dir(), exist_ok=True)
    except OSError as e:
      raise ValueError(f"--hlo_dir={_HLO_DIR.value}: {e.strerror}") from None
  if _COMPILE.value == "generate":
    if _SEARCH.value or _COMPILED_STEP_FILE.value is not None:
      raise ValueError(
          "--program=generate: --search and --compiled_step_file are for "
          "the training step"
      )
    slots = _SLOTS.value or config.grpo_decode_slots
    if slots < 1:
      raise ValueError(
          f"--slots={_SLOTS.value}: give the slots (>= 1); the config's "
          f"grpo_decode_slots is {config.grpo_decode_slots}"
      )


def _slice_and_hbm():
  """The --topology's slice and the HBM bytes of one of its devices
  (--hbm_gib where given).

  Raises:
    ValueError: a bad --topology or --hbm_gib, or no HBM to assume.
  """
  tpu_slice = topology.parse(_TOPOLOGY.value)
  hbm = tpu_slice.generation.hbm_bytes
  if _HBM_GIB.value is not None:
    if _HBM_GIB.value <= 0:
      raise ValueError(f"--hbm_gib={_HBM_GIB.value}: must be > 0")
    hbm = int(_HBM_GIB.value * 2**30)
  if not hbm:
    raise ValueError(
        f"--topology={_TOPOLOGY.value}: fake CPU devices have no HBM; "
        "give --hbm_gib"
    )
  return tpu_slice, hbm


def _hlo_dir():
  """--hlo_dir as an absolute path (relative to where the user ran it), or
  None."""
  if _HLO_DIR.value is None:
    return None
  return caller_paths.resolve_local_path(_HLO_DIR.value)


def _progress() -> progress.Reporter:
  """Where a long compile's elapsed time goes: stderr (stdout's last line
  is read by scripts)."""
  with command_line.user_errors(_PROGRAM, (ValueError,)):
    return progress.Reporter(progress.stderr(), _PROGRESS_S.value)


def _train(config, mesh, tpu_slice, devices, hbm, inputs) -> None:
  """Compiles the training step (`train_compile_lib.compile_step`, or the
  search), prints the table and the last line, saves --compiled_step_file;
  exits 1 when it does not fit."""
  # pylint: disable=import-outside-toplevel  # After JAX has its platform.
  from maxtext.engine import compile_config
  from maxtext.engine import saved_step
  from maxtext.engine import train_compile_lib

  # pylint: enable=import-outside-toplevel
  _print_setup(config, mesh, tpu_slice, devices)

  def log(line):
    print(f"{_PROGRAM}: {line}", flush=True)

  settings = compile_config.CompileConfig.from_config(config)
  if _SEARCH.value:
    step, compile_s = _search(settings, mesh, hbm, inputs, log)
  else:
    step = train_compile_lib.compile_step(
        settings,
        mesh,
        log=log,
        every_program=_COMPILED_STEP_FILE.value is not None,
        inputs=inputs,
        progress=_progress(),
        hlo_dir=_hlo_dir(),
    )
    compile_s = step.compile_s
  for line in train_compile_lib.table(step):
    print(line)
  oom = step.out_of_memory
  fits = oom is None and step.peak <= hbm
  chips = tpu_slice.chips * _NUM_SLICES.value
  print(
      f"{_PROGRAM}: topology={tpu_slice.name} devices={len(devices)} "
      f"chips={chips} peak={train_compile_lib.gib(step.peak)} GiB "
      f"hbm={train_compile_lib.gib(hbm)} GiB fits={'yes' if fits else 'no'} "
      f"compile_s={compile_s:.1f}"
  )
  if not fits:
    sys.exit(1)
  if _COMPILED_STEP_FILE.value is not None:
    path = caller_paths.resolve_local_path(_COMPILED_STEP_FILE.value)
    saved_step.save(
        path,
        step.executables,
        config.to_dict(),
        mesh,
        f"{tpu_slice.name} x {_NUM_SLICES.value}",
    )
    print(f"{_PROGRAM}: saved the compiled step to {path}")


def _print_setup(config, mesh, tpu_slice, devices) -> None:
  """The first line: the slice, the mesh and the run's shape."""
  print(
      f"{_PROGRAM}: {tpu_slice.name} x {_NUM_SLICES.value}: {len(devices)} "
      f"x {devices[0].device_kind}, mesh "
      + " ".join(f"{a}={n}" for a, n in mesh.shape.items())
      + f"; {config.workload}, global batch {config.global_batch_size} in "
      f"K={config.gradient_accumulation_steps}, seq {_row_length(config)}, "
      f"attention {config.attention}, remat "
      f"{config.remat_policy}, loss_chunk_size {config.loss_chunk_size}",
      flush=True,
  )


def _search(settings, mesh, hbm, inputs, log):
  """--search: compiles the candidates, prints each and the choice.

  Returns:
    (the chosen candidate's compiled step, or the last one tried when none
    fits; the seconds all the compiles took).
  """
  # pylint: disable=import-outside-toplevel  # After JAX has its platform.
  from maxtext.engine import train_compile_lib

  # pylint: enable=import-outside-toplevel
  tried, choice = train_compile_lib.search(
      settings,
      mesh,
      hbm,
      log=log,
      tensor=True,
      inputs=inputs,
      progress=_progress(),
  )
  for candidate in tried:
    print(
        f"{_PROGRAM}: "
        f"context_parallelism={candidate.context_parallelism} "
        f"tensor_parallelism={candidate.tensor_parallelism} "
        f"remat_policy={candidate.remat_policy} "
        f"gradient_accumulation_steps="
        f"{candidate.gradient_accumulation_steps} peak="
        f"{train_compile_lib.gib(candidate.step.peak)} GiB "
        f"fits={'yes' if candidate.fits(hbm) else 'no'}"
    )
  if choice:
    print(
        f"{_PROGRAM}: choice: "
        f"--config.context_parallelism={choice.context_parallelism} "
        f"--config.tensor_parallelism={choice.tensor_parallelism} "
        f"--config.remat_policy={choice.remat_policy} "
        f"--config.gradient_accumulation_steps="
        f"{choice.gradient_accumulation_steps}"
    )
  else:
    print(f"{_PROGRAM}: no remat policy and accumulation fits")
  step = (choice or tried[-1]).step
  return step, sum(c.step.compile_s for c in tried)


def _rollout_shape(config):
  """--program=generate's (slots, length, prompt length, engine options),
  checked (ValueError: one line naming the flag's value)."""
  # Imported once JAX has its platform (see _devices).
  # pylint: disable=import-outside-toplevel
  from maxtext.generation import paged_decoder
  from maxtext.generation import paged_lowering
  from maxtext.grpo import grpo_config
  from maxtext.grpo import grpo_workload

  # pylint: enable=import-outside-toplevel
  slots = _SLOTS.value or config.grpo_decode_slots
  length = _LENGTH.value or config.max_sequence_length
  prompt_length = _PROMPT_LENGTH.value or grpo_workload.longest_context(
      grpo_config.GrpoConfig.from_config(config)
  )
  engine = paged_decoder.EngineOptions(
      page_size=_PAGE_SIZE.value or config.grpo_decode_page_size,
      num_pages=_NUM_PAGES.value,
  )
  paged_lowering.check_lowering(config, slots, length, prompt_length)
  return slots, length, prompt_length, engine


def _generate(
    config, mesh, tpu_slice, devices, hbm, slots, length, prompt_length, engine
) -> None:
  """--program=generate: compiles and reports a rollout's programs."""
  # Imported once JAX has its platform (see _devices).
  # pylint: disable=import-outside-toplevel
  from maxtext.engine import model_setup
  from maxtext.engine import train_compile_lib
  from maxtext.generation import generate_compile_lib
  from maxtext.model import model_config

  # pylint: enable=import-outside-toplevel
  print(
      f"{_PROGRAM}: {tpu_slice.name} x {_NUM_SLICES.value}: {len(devices)} "
      f"x {devices[0].device_kind}, mesh "
      + " ".join(f"{a}={n}" for a, n in mesh.shape.items())
      + f"; generate: {slots} slots of up to {length} positions, contexts "
      f"of up to {prompt_length} ids, pages of {engine.page_size}, "
      f"{config.compute_dtype} parameters",
      flush=True,
  )
  result = generate_compile_lib.compile_generation(
      model_config.of(config),
      model_setup.setup_model(model_config.of(config), mesh),
      num_slots=slots,
      length=length,
      prompt_length=prompt_length,
      engine=engine,
      log=lambda line: print(f"{_PROGRAM}: {line}", flush=True),
      progress=_progress(),
  )
  gib = train_compile_lib.gib
  step = result.step
  for line in train_compile_lib.table(step):
    print(line)
  copy = result.copy
  print(
      f"{_PROGRAM}: weight copy: {copy.dtype} parameters "
      f"total_bytes={copy.total_bytes} ({gib(copy.total_bytes)} GiB), "
      f"per device {copy.device_bytes} ({gib(copy.device_bytes)} GiB), "
      f"{copy.devices} devices receive {copy.received_bytes} "
      f"({gib(copy.received_bytes)} GiB)"
  )
  fits = step.out_of_memory is None and step.peak <= hbm
  chips = tpu_slice.chips * _NUM_SLICES.value
  print(
      f"{_PROGRAM}: program=generate topology={tpu_slice.name} "
      f"devices={len(devices)} chips={chips} slots={result.num_slots} "
      f"pages={result.num_pages} page_size={result.page_size} "
      f"length={result.length} params={gib(result.param_bytes)} GiB "
      f"pool={gib(result.pool_bytes)} GiB "
      f"states={gib(result.state_bytes)} GiB "
      f"state_bytes_per_slot={result.state_bytes_per_slot} "
      f"peak={gib(step.peak)} GiB hbm={gib(hbm)} GiB "
      f"fits={'yes' if fits else 'no'} compile_s={step.compile_s:.1f}"
  )
  if not fits:
    sys.exit(1)


if __name__ == "__main__":
  app.run(
      main,
      flags_parser=lambda argv: app.parse_flags_with_usage(
          caller_paths.resolve_config_args(argv)
      ),
  )
