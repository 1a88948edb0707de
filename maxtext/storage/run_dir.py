"""Where a run writes: the run directory, its files, config.json, provenance.

A run writes into `<base_output_directory>/<run_name>/`. For a local
`base_output_directory` that directory is written directly. For
`gs://bucket/prefix` the run directory is written under
`local_staging_directory` and mirrored to `gs://bucket/prefix/<run_name>/` by
`maxtext.storage.gcs_mirror`.

Relative local paths resolve against the directory the user ran the command
from: `bazel run` changes the working directory to the runfiles tree and says
where the caller was in BUILD_WORKING_DIRECTORY.

The run directory's settings are `RunDirConfig`: the config's fields of its
names (`maxtext/core/component_config.py`), where the run writes and the
input paths that resolve against the caller's directory.
"""

import dataclasses
import datetime
import hashlib
import json
import os
import secrets
import string
import tempfile
from typing import Any, Mapping, Optional

import jax

from maxtext.core import caller_paths
from maxtext.core import component_config
from maxtext.storage import build_info
from maxtext.storage import gcs_mirror

# The workspace root: this file is maxtext/storage/run_dir.py.
_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
_LOCK_DIR = os.path.join(_ROOT, "third_party", "py")
# The build ships the lock of its platform (//third_party/py:requirements_lock).
_LOCK_FILES = (
    "requirements_lock.txt",
    "requirements_tpu_lock.txt",
    "requirements_gpu_lock.txt",
)


# Config fields naming files the run reads. Output locations are resolved
# where the run directory is laid out (`make_run_paths`).
INPUT_PATH_FIELDS = (
    "train_data_path",
    "eval_data_path",
    "tokenizer_path",
    "load_parameters_path",
    "compiled_step_file",
)


@dataclasses.dataclass(frozen=True)
class RunDirConfig(component_config.ComponentConfig):
  """Where a run writes and the paths it reads (`maxtext/configs/base.py`
  documents each field; `config_lib.validate` checks them).

  Attributes:
    base_output_directory: local path or gs:// URL holding run directories.
    local_staging_directory: local copy of a gs:// run directory; "" = a
      directory under the system temp dir.
    checkpoint_directory: the checkpoints' own place; "" = the run
      directory's checkpoints/.
    train_data_path, eval_data_path, tokenizer_path, load_parameters_path,
      compiled_step_file: the files the run reads (`INPUT_PATH_FIELDS`).
    dataset_type: "megatron" makes train_data_path a weighted prefix list.
  """

  base_output_directory: str = "maxtext_runs"
  local_staging_directory: str = ""
  checkpoint_directory: str = ""
  train_data_path: str = ""
  eval_data_path: str = ""
  tokenizer_path: str = ""
  load_parameters_path: str = ""
  compiled_step_file: str = ""
  dataset_type: str = "synthetic"

  @property
  def input_paths(self) -> dict[str, str]:
    """The input path fields (`INPUT_PATH_FIELDS`) and their values."""
    return {field: getattr(self, field) for field in INPUT_PATH_FIELDS}


def resolved_input_paths(
    settings: RunDirConfig, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
  """The input paths that resolve to another path: field -> absolute path.

  Relative paths are the caller's: under `bazel run` the process starts in
  the runfiles tree, and BUILD_WORKING_DIRECTORY names where the command was
  typed (see `caller_paths`). gs:// paths and empty fields stay as they
  are, and are left out, like paths already absolute.
  """
  updates = {}
  for field, value in settings.input_paths.items():
    if (
        field == "train_data_path"
        and settings.dataset_type == "megatron"
        and len(value.split()) > 1
    ):
      # Megatron's data-path list, "W1 PREFIX1 W2 PREFIX2 ...": the
      # prefixes are resolved, the weights kept.
      words = value.split()
      words[1::2] = [
          caller_paths.resolve_local_path(w, environ) for w in words[1::2]
      ]
      resolved = " ".join(words)
    elif value and not gcs_mirror.is_gs_url(value):
      resolved = caller_paths.resolve_local_path(value, environ)
    else:
      continue
    if resolved != value:
      updates[field] = resolved
  return updates


_SUFFIX_CHARS = frozenset(string.ascii_lowercase + string.digits)
_SUFFIX_MAX_LEN = 16


def new_run_name_suffix() -> str:
  """A short random suffix for `default_run_name`, e.g. 'a1b2' (4 hex digits).

  Multi-process runs draw it on process 0 and broadcast it, so that every
  process builds the same run name.
  """
  return secrets.token_hex(2)


def default_run_name(
    now: Optional[datetime.datetime] = None, suffix: Optional[str] = None
) -> str:
  """A run name that two runs started at once do not share.

  The name is the UTC time to the microsecond plus a short random suffix,
  e.g. 'run-20261130-231500-123456-a1b2': runs started in the same second
  differ by the microseconds, and runs started in the same microsecond (or
  on hosts whose clocks agree) by the suffix. It is a plain directory name.

  Args:
    now: the start time; naive datetimes are taken as UTC. Defaults to now.
    suffix: the random part, 1 to 16 characters of [a-z0-9]; defaults to
      `new_run_name_suffix()`. Multi-process runs pass the value process 0
      drew, like `now`, so every process names the same directory.

  Returns:
    The run name.

  Raises:
    TypeError: `now` is not a datetime or `suffix` is not a str.
    ValueError: `suffix` is empty, too long or has other characters.
  """
  if now is None:
    now = datetime.datetime.now(datetime.timezone.utc)
  if not isinstance(now, datetime.datetime):
    raise TypeError(f"now must be a datetime.datetime, got {now!r}")
  if now.tzinfo is not None:
    now = now.astimezone(datetime.timezone.utc)
  if suffix is None:
    suffix = new_run_name_suffix()
  if not isinstance(suffix, str):
    raise TypeError(f"suffix must be a str, got {suffix!r}")
  if (
      not suffix
      or len(suffix) > _SUFFIX_MAX_LEN
      or not set(suffix) <= _SUFFIX_CHARS
  ):
    raise ValueError(
        f"suffix must be 1 to {_SUFFIX_MAX_LEN} characters of "
        f"[a-z0-9], got {suffix!r}"
    )
  return now.strftime("run-%Y%m%d-%H%M%S-%f-") + suffix


@dataclasses.dataclass(frozen=True)
class RunPaths:
  """Every path of one run.

  Attributes:
    run_name: the run directory's name.
    run_dir: the local run directory (the staging copy for a gs:// destination).
    remote_url: gs://bucket/prefix/<run_name> when mirrored, else None.
    checkpoint_dir: orbax checkpoint directory (local path or gs:// URL).
  """

  run_name: str
  run_dir: str
  remote_url: Optional[str]
  checkpoint_dir: str

  @property
  def config_json(self) -> str:
    return os.path.join(self.run_dir, "config.json")

  @property
  def metrics_jsonl(self) -> str:
    return os.path.join(self.run_dir, "metrics.jsonl")

  @property
  def tensorboard_dir(self) -> str:
    return os.path.join(self.run_dir, "tensorboard")


def make_run_paths(
    settings: RunDirConfig,
    run_name: str,
    environ: Mapping[str, str] = os.environ,
) -> RunPaths:
  """Resolves the run's paths from its settings (no directory is created).

  Args:
    settings: the run directory's settings (of a validated config).
    run_name: the run's name (config.run_name, or a generated one).
    environ: the process environment, for relative paths under bazel run.

  Returns:
    The run's RunPaths.
  """
  base = settings.base_output_directory
  if gcs_mirror.is_gs_url(base):
    staging = settings.local_staging_directory or os.path.join(
        tempfile.gettempdir(), "maxtext_staging"
    )
    run_dir = os.path.join(
        caller_paths.resolve_local_path(staging, environ), run_name
    )
    remote_url = base.rstrip("/") + "/" + run_name
  else:
    run_dir = os.path.join(
        caller_paths.resolve_local_path(base, environ), run_name
    )
    remote_url = None
  if settings.checkpoint_directory:
    checkpoint_dir = settings.checkpoint_directory
    if not gcs_mirror.is_gs_url(checkpoint_dir):
      checkpoint_dir = caller_paths.resolve_local_path(checkpoint_dir, environ)
  else:
    checkpoint_dir = os.path.join(run_dir, "checkpoints")
  return RunPaths(
      run_name=run_name,
      run_dir=run_dir,
      remote_url=remote_url,
      checkpoint_dir=checkpoint_dir,
  )


def _lock_hash() -> str:
  """'<lock file>:sha256:<hex>' of the dependency lock this program uses."""
  for name in _LOCK_FILES:
    try:
      with open(os.path.join(_LOCK_DIR, name), "rb") as f:
        return f"{name}:sha256:{hashlib.sha256(f.read()).hexdigest()}"
    except OSError:
      continue
  return "unknown"


def provenance() -> dict[str, Any]:
  """What produced this run: code revision, dependency lock, JAX, devices.

  The revision is the one stamped into the binary at build time when it has
  one, else git's when the process first asked (`build_info.loaded`);
  `git_revision_source` says which, `build_time_utc` when the stamp was
  made.
  """
  devices = jax.devices()
  return {
      **build_info.loaded().provenance(),
      "requirements_lock": _lock_hash(),
      "jax_version": jax.__version__,
      "jax_backend": jax.default_backend(),
      "process_count": jax.process_count(),
      "device_count": len(devices),
      "devices": sorted({d.device_kind for d in devices}),
      "start_time_utc": datetime.datetime.now(
          datetime.timezone.utc
      ).isoformat(),
  }


def write_config_json(
    path: str, record: Mapping[str, Any], extra: Mapping[str, Any]
) -> None:
  """Writes the resolved config and provenance, atomically (write then rename).

  `maxtext.storage.run_record.record_attempt` calls this for a run's first
  attempt only and keeps every attempt in config_history.jsonl.

  Args:
    path: the config.json file to write.
    record: the config's values by field name (`config_lib.to_json_dict`).
    extra: the provenance.

  Raises:
    TypeError: a value cannot be written as JSON (nothing is written).
  """
  document = {
      "config": dict(record),
      "provenance": dict(extra),
  }
  text = json.dumps(document, indent=2, sort_keys=True)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text + "\n")
  os.replace(tmp, path)
