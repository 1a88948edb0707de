"""A training step compiled ahead of time, saved to a file, loaded by a run.

`train_compile --compiled_step_file=PATH` compiles every program the engine
runs (`Engine.lower_programs`, in `maxtext/engine/step_lowering.py`) and
`save` writes them, serialized by JAX
(`jax.experimental.serialize_executable`), with what they were compiled for:

  fields    every config field that shapes the programs: all of them but
            `NOT_SHAPING` (names, paths, step counts, logging, ...), with
            the learning-rate schedule's length resolved (`steps` shapes
            the programs when `lr_schedule_steps` is 0: the schedule is
            traced into them);
  devices   the mesh: its axes and sizes, the device ids in mesh order,
            their platform and kind, and the topology as the user named it;
  versions  jax, jaxlib and libtpu (None where not installed).

A run with `compiled_step_file` set gives `load` its config's values and
its mesh:
anything that differs is refused with one line naming it, before the
parameters are made, and otherwise the engine runs the loaded executables
and compiles none of its programs.

The programs must be compiled anew, not taken from JAX's persistent
compilation cache: an executable the cache hands back serializes into a
file whose programs fail to run (train_compile turns the cache off).

What the programs were compiled for is every field of the config, so this
module takes the config as a record: its values by field name (a plain
mapping, `ConfigDict.to_dict()`), never the `ConfigDict` itself.

The file is two pickles: the description (plain values), then the programs.
Unpickling can run any code the file names: load only files you made.
"""

import importlib.metadata
import os
import pickle
from typing import Any, Mapping, Optional

import jax
from jax.experimental import serialize_executable
import jaxlib

# The file's format. 4: with K = 1 "update" also takes the micro-step's
# packed metrics and returns them with its own. 3: the step's update rides
# its last micro-step (programs "allocate", "micro_step", "eval"; with K =
# 1 "micro_step", "update", "eval"; formats 1 and 2 held "measure" and
# "apply" instead).
# 2: the parameters' layout follows
# `maxtext/runtime/axis_rules.py` (an MoE model's non-expert weights over
# fsdp x expert), so programs compiled for the layout before it, whose
# inputs are sharded otherwise, are refused as another format.
FORMAT = 4

# Config fields that do not change the compiled programs: where outputs go,
# how long the run is, how often it evaluates, logs and checkpoints, which
# data it reads (the batch's shapes come from shaping fields), the random
# seeds (values, not shapes), the process layout (the devices say it), the
# submission's labels. Any other field, including one added later, shapes
# them: a mismatch in a field not listed here is refused, never ignored.
NOT_SHAPING = frozenset(
    {
        "run_name",
        "base_output_directory",
        "local_staging_directory",
        "gcs_sync_interval_seconds",
        "gcs_request_timeout_seconds",
        "gcs_startup_timeout_seconds",
        "gcs_final_timeout_seconds",
        "run_lock_refresh_interval_seconds",
        "checkpoint_directory",
        "resume",
        "start_over",
        "load_parameters_path",
        "checkpoint_period",
        "max_checkpoints_to_keep",
        "seed",
        "data_shuffle_seed",
        "dataset_type",
        "train_data_path",
        "eval_data_path",
        "tokenizer_path",
        "grain_worker_count",
        "steps",  # In `fields` as the schedule's length where it is that.
        "eval_interval",
        "first_eval_samples",
        "eval_steps",
        "target_eval_loss",
        "log_period",
        "profiler_steps",
        "profiler_start_step",
        "max_consecutive_skipped_steps",
        "num_processes",
        "coordinator_address",
        "process_id",
        "distributed_init_timeout_seconds",
        "jax_compilation_cache_dir",
        "hardware",
        "allow_cpu_fallback",
        "enable_mllog",
        "mllog_file",
        "cache_clear_command",
        "warmup_steps_before_run_start",
        "mllog_ruleset",
        "submission_org",
        "submission_platform",
        "submission_division",
        "submission_status",
        "submission_benchmark",
        "mllog_train_samples",
        "compiled_step_file",
        "grpo_reward_timeout_seconds",
    }
)


def shaping_fields(values: Mapping[str, Any]) -> dict[str, Any]:
  """The fields that shape the compiled programs, by name, of a config's
  values by field name."""
  fields = {
      name: value for name, value in values.items() if name not in NOT_SHAPING
  }
  # The schedule traced into the programs runs over lr_schedule_steps,
  # or `steps` when that is 0.
  fields["lr_schedule_steps"] = values["lr_schedule_steps"] or values["steps"]
  return fields


def describe_devices(mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """What the programs were compiled for on `mesh`'s devices."""
  first = mesh.devices.flat[0]
  return {
      "mesh": ", ".join(f"{a}={n}" for a, n in mesh.shape.items()),
      "device_ids": tuple(int(i) for i in mesh.device_ids.flat),
      "platform": first.platform,
      "device_kind": first.device_kind,
  }


def versions() -> dict[str, Optional[str]]:
  """The versions of the packages that compile and run the programs."""
  try:
    libtpu = importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    libtpu = None
  return {
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "libtpu": libtpu,
  }


def save(
    path: str,
    executables: Mapping[str, jax.stages.Compiled],
    values: Mapping[str, Any],
    mesh: jax.sharding.Mesh,
    topology: str,
) -> None:
  """Writes the compiled programs and what they were compiled for.

  Args:
    path: the file (replaced whole: written beside it, then renamed).
    executables: `Engine.lower_programs`' names -> their compiled programs.
    values: the values by field name of the config they were compiled for.
    mesh: the mesh they were compiled for.
    topology: the slice as the user named it (for messages).
  """
  description = {
      "format": FORMAT,
      "topology": topology,
      "fields": shaping_fields(values),
      "devices": describe_devices(mesh),
      "versions": versions(),
      "programs": tuple(executables),
  }
  programs = {
      name: serialize_executable.serialize(compiled)
      for name, compiled in executables.items()
  }
  partial = f"{path}.partial"
  with open(partial, "wb") as f:
    pickle.dump(description, f)
    pickle.dump(programs, f)
  os.replace(partial, path)


def _differences(kind: str, saved: Mapping, live: Mapping) -> list[str]:
  """`kind` entries whose saved and live values differ, as name=a (here b)."""
  missing = object()
  out = []
  for name in sorted(set(saved) | set(live)):
    was, now = saved.get(name, missing), live.get(name, missing)
    if was != now:
      was = "absent" if was is missing else repr(was)
      now = "absent" if now is missing else repr(now)
      out.append(f"{kind} {name}={was} (this run: {now})")
  return out


def load(
    path: str, values: Mapping[str, Any], mesh: jax.sharding.Mesh
) -> dict[str, jax.stages.Compiled]:
  """The saved programs, if they were compiled for the config of `values`
  (its values by field name) on `mesh`.

  Raises:
    ValueError: one line naming the file and what differs (versions,
      devices, shaping fields), or why the file cannot be read.
  """
  where = f"compiled_step_file={path}"
  try:
    f = open(path, "rb")
  except OSError as e:
    raise ValueError(f"{where}: cannot open: {e.strerror}") from e
  with f:
    description = _check_description(where, _unpickle(where, f, "description"))
    # Versions first: the programs' pickle holds JAX objects.
    differences = _differences("version", description["versions"], versions())
    differences += _differences(
        "devices", description["devices"], describe_devices(mesh)
    )
    differences += _differences(
        "field", description["fields"], shaping_fields(values)
    )
    if differences:
      raise ValueError(
          f"{where} was compiled for {description['topology']} with "
          f"another setup: " + "; ".join(differences)
      )
    programs = _check_programs(
        where, _unpickle(where, f, "programs"), description["programs"]
    )
  backend = mesh.devices.flat[0].client
  loaded = {}
  for name, (payload, in_tree, out_tree) in programs.items():
    try:
      loaded[name] = serialize_executable.deserialize_and_load(
          payload, in_tree, out_tree, backend=backend
      )
    # A damaged payload fails inside XLA with any error type; the user's
    # answer is the same line.
    except Exception as e:
      raise ValueError(
          f"{where}: program {name} does not load ({_first_line(e)}); "
          "write the file again with train_compile --compiled_step_file"
      ) from e
  return loaded


def _first_line(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  return (
      f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
  )


def _unpickle(where: str, f, section: str) -> Any:
  """The next pickle of `f`; a damaged or truncated one is one ValueError."""
  try:
    return pickle.load(f)
  # A truncated or overwritten pickle fails with many error types
  # (EOFError, UnpicklingError, an unknown opcode's KeyError, ...).
  except Exception as e:
    raise ValueError(
        f"{where}: its {section} section is damaged or truncated "
        f"({_first_line(e)}); write the file again with train_compile "
        "--compiled_step_file"
    ) from e


# The description's entries and the types they hold.
_DESCRIPTION = {
    "topology": str,
    "fields": Mapping,
    "devices": Mapping,
    "versions": Mapping,
    "programs": tuple,
}


def _check_description(where: str, description: Any) -> Mapping[str, Any]:
  """`description`, checked to be a description of this format."""
  if not isinstance(description, dict) or description.get("format") != FORMAT:
    raise ValueError(
        f"{where}: not a saved step of format {FORMAT} (write it again "
        "with train_compile --compiled_step_file)"
    )
  for key, kind in _DESCRIPTION.items():
    if key not in description:
      problem = f"has no {key!r}"
    elif not isinstance(description[key], kind):
      problem = (
          f"holds a {type(description[key]).__name__} as {key!r}, not a "
          f"{kind.__name__}"
      )
    else:
      continue
    raise ValueError(
        f"{where}: its description {problem}; write the file again with "
        "train_compile --compiled_step_file"
    )
  return description


def _check_programs(where: str, programs: Any, names: tuple) -> Mapping:
  """`programs`, checked to hold the described programs as triples."""
  if not isinstance(programs, dict) or set(programs) != set(names):
    got = sorted(programs) if isinstance(programs, dict) else type(programs)
    raise ValueError(
        f"{where}: its programs section holds {got}, the description names "
        f"{sorted(names)}; write the file again with train_compile "
        "--compiled_step_file"
    )
  for name, entry in programs.items():
    if not isinstance(entry, tuple) or len(entry) != 3:
      raise ValueError(
          f"{where}: program {name} is not a serialized executable; write "
          "the file again with train_compile --compiled_step_file"
      )
  return programs
