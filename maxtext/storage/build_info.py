"""Which source this program was built from: stamped at build time, else git.

Release binaries (the `.pyz` files, and `train_main` built with `--stamp`)
carry `maxtext/build_info.json`, written by Bazel from the workspace status
(tools/workspace_status.sh, tools/zipapp/build_info.bzl). It names the commit
and whether the tree was modified when the binary was built, wherever the
binary later runs. Without it (unstamped `bazel run`/`bazel test`, or the
sources run directly) the revision comes from git at run time: in the
workspace under `bazel run`, else in the checkout holding this module. Git is
asked only about a checkout whose root is the source root itself, so a copy
of these sources inside some other repository reads "unknown", not that
repository's revision.

`current()` says which of the two it used:
  source "stamped"  the build_info.json of the build (its revision may itself
                    be "unknown" when the build had no git checkout)
  source "git"      git at run time
  source "unknown"  neither
"""

import dataclasses
import functools
import json
import os
import re
import subprocess
from typing import Any, Mapping, Optional

SOURCE_STAMPED = "stamped"
SOURCE_GIT = "git"
SOURCE_UNKNOWN = "unknown"
UNKNOWN = "unknown"
# Where a stamped binary carries the file, from the source root.
STAMP_PATH = os.path.join("maxtext", "build_info.json")

# "<40 hex>", "<40 hex>+dirty" (tracked files modified) or "unknown".
_REVISION = re.compile(r"^(?:[0-9a-f]{40}(?:\+dirty)?|unknown)$")
_GIT_TIMEOUT_S = 10


def _root(module_path: str) -> str:
  # This file is <root>/maxtext/storage/build_info.py.
  return os.path.dirname(os.path.dirname(os.path.dirname(module_path)))


# The source root as loaded (a runfiles tree or unpacked .pyz keeps the stamp
# here), and as stored (runfiles are links into the workspace's checkout).
_LOADED_ROOT = _root(os.path.abspath(__file__))
_SOURCE_ROOT = _root(os.path.realpath(__file__))


@dataclasses.dataclass(frozen=True)
class BuildInfo:
  """The revision of this program's source, and where it was learnt.

  Attributes:
    git_revision: "<40 hex>", "<40 hex>+dirty" or "unknown".
    source: SOURCE_STAMPED, SOURCE_GIT or SOURCE_UNKNOWN.
    build_time_utc: ISO 8601 time of the stamped build, else None.
  """

  git_revision: str
  source: str
  build_time_utc: Optional[str] = None

  def provenance(self) -> dict[str, Any]:
    """The fields config.json's provenance records."""
    return {
        "git_revision": self.git_revision,
        "git_revision_source": self.source,
        "build_time_utc": self.build_time_utc,
    }


def read_stamp(path: str) -> Optional[BuildInfo]:
  """The stamped build info at `path`, or None when there is no such file.

  Args:
    path: a build_info.json written by tools/zipapp/write_build_info.py.

  Returns:
    A BuildInfo with source SOURCE_STAMPED, or None if `path` does not exist.

  Raises:
    ValueError: the file exists but is not a build_info document (a broken
      release build: guessing a revision would defeat the stamp).
  """
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except FileNotFoundError:
    return None
  try:
    document = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"build info {path!r} is not JSON: {e}") from e
  if not isinstance(document, dict):
    raise ValueError(f"build info {path!r} is not a JSON object: {document!r}")
  revision = document.get("git_revision")
  if not isinstance(revision, str) or not _REVISION.match(revision):
    raise ValueError(
        f"build info {path!r}: git_revision={revision!r} is not "
        f"40 hex digits (optionally '+dirty') or 'unknown'"
    )
  build_time = document.get("build_time_utc")
  if build_time is not None and not isinstance(build_time, str):
    raise ValueError(
        f"build info {path!r}: build_time_utc={build_time!r} is "
        f"not a string or null"
    )
  return BuildInfo(
      git_revision=revision, source=SOURCE_STAMPED, build_time_utc=build_time
  )


def _git(directory: str, *args: str) -> str:
  return subprocess.run(
      ["git", *args],
      cwd=directory,
      capture_output=True,
      text=True,
      timeout=_GIT_TIMEOUT_S,
      check=True,
  ).stdout


def git_revision(directory: str) -> Optional[str]:
  """The revision of the git checkout whose root is `directory`, or None.

  Args:
    directory: the source root to ask about.

  Returns:
    "<40 hex>" or "<40 hex>+dirty" (tracked files modified); None when git is
    missing or fails, or `directory` is not the root of its checkout (a copy
    of the sources inside another repository is not that repository's
    revision).
  """
  try:
    toplevel = _git(directory, "rev-parse", "--show-toplevel").strip()
    if not toplevel or os.path.realpath(toplevel) != os.path.realpath(
        directory
    ):
      return None
    commit = _git(directory, "rev-parse", "--verify", "HEAD").strip()
    changes = _git(directory, "status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.SubprocessError):
    return None
  revision = commit + ("+dirty" if changes.strip() else "")
  return revision if _REVISION.match(revision) else None


def current(
    environ: Mapping[str, str] = os.environ,
    loaded_root: str = _LOADED_ROOT,
    source_root: str = _SOURCE_ROOT,
) -> BuildInfo:
  """This program's build info: the stamp if it has one, else git's answer.

  Args:
    environ: the process environment (BUILD_WORKSPACE_DIRECTORY is set by
      `bazel run`).
    loaded_root: the source root as loaded, where a stamped binary keeps
      STAMP_PATH.
    source_root: the checkout the sources are stored in, for git.

  Returns:
    The BuildInfo; source SOURCE_UNKNOWN with revision "unknown" when there
    is neither a stamp nor a usable git checkout.

  Raises:
    ValueError: a stamp file that cannot be read as one (see `read_stamp`).
  """
  stamped = read_stamp(os.path.join(loaded_root, STAMP_PATH))
  if stamped is not None:
    return stamped
  for directory in (environ.get("BUILD_WORKSPACE_DIRECTORY"), source_root):
    if directory:
      revision = git_revision(directory)
      if revision is not None:
        return BuildInfo(git_revision=revision, source=SOURCE_GIT)
  return BuildInfo(git_revision=UNKNOWN, source=SOURCE_UNKNOWN)


@functools.cache
def loaded() -> BuildInfo:
  """The build info of the code this process runs: `current()` asked once.

  A process loads its code once, so the first answer stays true while the
  checkout it came from is committed to or edited; every later ask (each
  run's record and MLPerf log, the packager's comparison) gets that answer,
  never a newer revision the process is not running.
  """
  return current()
