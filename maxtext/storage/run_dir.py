"""Where a run writes: the run directory, its files, and config.json with provenance.

A run writes into `<base_output_directory>/<run_name>/`. For a local
`base_output_directory` that directory is written directly. For `gs://bucket/prefix`
the run directory is written under `local_staging_directory` and mirrored to
`gs://bucket/prefix/<run_name>/` by `maxtext.storage.gcs_mirror`.

Relative local paths resolve against the directory the user ran the command from:
`bazel run` changes the working directory to the runfiles tree and says where the
caller was in BUILD_WORKING_DIRECTORY.
"""

import dataclasses
import datetime
import hashlib
import json
import os
import subprocess
import tempfile
from typing import Any, Mapping, Optional

import jax

from maxtext import config_lib
from maxtext.storage import gcs_mirror

# The workspace root: this file is maxtext/storage/run_dir.py.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LOCK_DIR = os.path.join(_ROOT, "third_party", "py")
# The build ships the lock of its platform (//third_party/py:requirements_lock).
_LOCK_FILES = ("requirements_lock.txt", "requirements_tpu_lock.txt",
               "requirements_gpu_lock.txt")


def resolve_local_path(path: str, environ: Mapping[str, str] = os.environ) -> str:
  """Absolute form of a local path; relative paths are taken from the caller's cwd.

  Args:
    path: a local path, possibly relative or starting with '~'.
    environ: the process environment (BUILD_WORKING_DIRECTORY is set by bazel run).

  Returns:
    The absolute, normalised path.
  """
  path = os.path.expanduser(path)
  if not os.path.isabs(path):
    path = os.path.join(environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd(), path)
  return os.path.normpath(path)


def default_run_name(now: Optional[datetime.datetime] = None) -> str:
  """A timestamp run name, e.g. 'run-20261130-051703' (UTC)."""
  now = now or datetime.datetime.now(datetime.timezone.utc)
  return now.strftime("run-%Y%m%d-%H%M%S")


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


def make_run_paths(config, run_name: str,
                   environ: Mapping[str, str] = os.environ) -> RunPaths:
  """Resolves the run's paths from the config (no directory is created).

  Args:
    config: the validated run config.
    run_name: the run's name (config.run_name, or a generated one).
    environ: the process environment, for relative paths under bazel run.

  Returns:
    The run's RunPaths.
  """
  base = config.base_output_directory
  if gcs_mirror.is_gs_url(base):
    staging = config.local_staging_directory or os.path.join(
        tempfile.gettempdir(), "maxtext_staging")
    run_dir = os.path.join(resolve_local_path(staging, environ), run_name)
    remote_url = base.rstrip("/") + "/" + run_name
  else:
    run_dir = os.path.join(resolve_local_path(base, environ), run_name)
    remote_url = None
  if config.checkpoint_directory:
    checkpoint_dir = config.checkpoint_directory
    if not gcs_mirror.is_gs_url(checkpoint_dir):
      checkpoint_dir = resolve_local_path(checkpoint_dir, environ)
  else:
    checkpoint_dir = os.path.join(run_dir, "checkpoints")
  return RunPaths(run_name=run_name, run_dir=run_dir, remote_url=remote_url,
                  checkpoint_dir=checkpoint_dir)


def _git_revision(environ: Mapping[str, str]) -> str:
  """The workspace's git revision ('+dirty' if modified), or 'unknown'."""
  for directory in (environ.get("BUILD_WORKSPACE_DIRECTORY"),
                    os.path.dirname(os.path.realpath(__file__))):
    if not directory:
      continue
    try:
      revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory,
                                capture_output=True, text=True, timeout=10, check=True)
      dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                             cwd=directory, capture_output=True, text=True, timeout=10,
                             check=True)
    except (OSError, subprocess.SubprocessError):
      continue
    return revision.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
  return "unknown"


def _lock_hash() -> str:
  """'<lock file>:sha256:<hex>' of the dependency lock this program runs with."""
  for name in _LOCK_FILES:
    try:
      with open(os.path.join(_LOCK_DIR, name), "rb") as f:
        return f"{name}:sha256:{hashlib.sha256(f.read()).hexdigest()}"
    except OSError:
      continue
  return "unknown"


def provenance(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
  """What produced this run: code revision, dependency lock, JAX and its devices."""
  devices = jax.devices()
  return {
      "git_revision": _git_revision(environ),
      "requirements_lock": _lock_hash(),
      "jax_version": jax.__version__,
      "jax_backend": jax.default_backend(),
      "process_count": jax.process_count(),
      "device_count": len(devices),
      "devices": sorted({d.device_kind for d in devices}),
      "start_time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
  }


def write_config_json(path: str, config, extra: Mapping[str, Any]) -> None:
  """Writes the resolved config and provenance, atomically (write then rename)."""
  document = {"config": config_lib.to_json_dict(config), "provenance": dict(extra)}
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(document, f, indent=2, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)
