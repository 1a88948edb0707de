"""The tree of an MLPerf Training submission, and the files written into it.

    <out>/<org>/systems/<system>.json
    <out>/<org>/results/<system>/<benchmark>/result_<i>.txt    i = 0 .. N-1
    <out>/<org>/benchmarks/<benchmark>/implementations/<impl>/  the sources

These are the paths the official package checker and result summarizer walk.
The implementation directory holds this program's own sources (the `maxtext`
package and its configs, the packager, the dependency locks, the README and
the docs it links to),
copied from the workspace when the packager runs under `bazel run`, else from
the tree this module was loaded from (its runfiles).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Mapping, Optional, Sequence

DEFAULT_IMPLEMENTATION = "maxtext-jax"

# What of the workspace an implementation directory holds, from its root.
IMPLEMENTATION_PATHS = (
    "README.md",
    "docs",
    "WORKSPACE",
    "BUILD",
    ".bazelrc",
    "maxtext",
    "tools/mlperf",
    "third_party/py",
)
# The one path without which the copy is not this program.
_ESSENTIAL = "maxtext"
_SKIPPED_DIRS = ("__pycache__",)
_SKIPPED_SUFFIXES = (".pyc",)

# This file is <root>/tools/mlperf/layout.py.
_MODULE_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def org_dir(out_dir: str, org: str) -> str:
  return os.path.join(out_dir, org)


def system_json(out_dir: str, org: str, system: str) -> str:
  return os.path.join(out_dir, org, "systems", f"{system}.json")


def results_dir(out_dir: str, org: str, system: str, benchmark: str) -> str:
  return os.path.join(out_dir, org, "results", system, benchmark)


def result_file(
    out_dir: str, org: str, system: str, benchmark: str, index: int
) -> str:
  return os.path.join(
      results_dir(out_dir, org, system, benchmark), f"result_{index}.txt"
  )


def implementation_dir(
    out_dir: str, org: str, benchmark: str, implementation: str
) -> str:
  return os.path.join(
      out_dir, org, "benchmarks", benchmark, "implementations", implementation
  )


def check_name(field: str, value: str) -> None:
  """A name used as one path component (org, system, benchmark, impl).

  Raises:
    ValueError: empty, "." or "..", or holding a path separator.
  """
  if (
      not isinstance(value, str)
      or not value.strip()
      or value in (".", "..")
      or "/" in value
      or os.sep in value
  ):
    raise ValueError(
        f"{field}={value!r}: must be a non-empty name without "
        f"'/' (it names a directory of the submission)"
    )


def write_system_json(path: str, desc: Mapping[str, str]) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(dict(desc), f, indent=2)
    f.write("\n")


def check_no_results(out_dir: str, org: str, system: str, benchmark: str):
  """Raises unless the results directory is missing or empty.

  Raises:
    FileExistsError: the results directory already holds files (a package is
      written once; a stale result would be counted by the checker).
  """
  directory = results_dir(out_dir, org, system, benchmark)
  if os.path.isdir(directory) and os.listdir(directory):
    raise FileExistsError(
        f"results directory {directory!r} is not empty: "
        f"choose a new --output_dir"
    )


def write_results(
    out_dir: str,
    org: str,
    system: str,
    benchmark: str,
    log_paths: Sequence[str],
) -> list[str]:
  """Copies each log to `result_<i>.txt`, in the order given.

  Raises:
    FileExistsError: the results directory already holds files (a package is
      written once; a stale result would be counted by the checker).
  """
  check_no_results(out_dir, org, system, benchmark)
  directory = results_dir(out_dir, org, system, benchmark)
  os.makedirs(directory, exist_ok=True)
  written = []
  for i, log_path in enumerate(log_paths):
    path = result_file(out_dir, org, system, benchmark, i)
    shutil.copyfile(log_path, path)
    written.append(path)
  return written


def source_root(environ: Mapping[str, str] = os.environ) -> str:
  """Where this program's sources are: the workspace under `bazel run`
  (BUILD_WORKSPACE_DIRECTORY), else the tree this module was loaded from."""
  workspace = environ.get("BUILD_WORKSPACE_DIRECTORY", "")
  if workspace and os.path.isdir(os.path.join(workspace, _ESSENTIAL)):
    return workspace
  return _MODULE_ROOT


def _ignore(directory: str, names: list[str]) -> set[str]:
  del directory  # Unused: the same names are skipped everywhere.
  return {
      n
      for n in names
      if n in _SKIPPED_DIRS
      or n.endswith(_SKIPPED_SUFFIXES)
      or n.startswith("bazel-")
  }


def copy_implementation(
    dest: str,
    root: Optional[str] = None,
    paths: Sequence[str] = IMPLEMENTATION_PATHS,
) -> list[str]:
  """Copies this program's sources into `dest`.

  Args:
    dest: the implementation directory (created; must not exist yet).
    root: the source root (default `source_root()`).
    paths: files and directories under `root` to copy; those missing there
      (e.g. a README a runfiles tree lacks) are skipped.

  Returns:
    The paths of `paths` that were copied.

  Raises:
    FileNotFoundError: `root` has no `maxtext` package.
    FileExistsError: `dest` exists.
  """
  root = root or source_root()
  if not os.path.isdir(os.path.join(root, _ESSENTIAL)):
    raise FileNotFoundError(f"no {_ESSENTIAL}/ sources under {root!r}")
  if os.path.exists(dest):
    raise FileExistsError(
        f"implementation directory {dest!r} exists: choose "
        f"a new --output_dir"
    )
  os.makedirs(dest)
  copied = []
  for relative in paths:
    source = os.path.join(root, relative)
    target = os.path.join(dest, relative)
    if os.path.isdir(source):
      # Runfiles are symlinks: copy what they point to.
      shutil.copytree(source, target, symlinks=False, ignore=_ignore)
    elif os.path.isfile(source):
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.copyfile(source, target)
    else:
      continue
    copied.append(relative)
  return copied
