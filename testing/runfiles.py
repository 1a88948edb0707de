"""Finds the files a test target lists as `data` in its Bazel runfiles tree.

Under `bazel test` (and `bazel run`) a target's data files sit in a runfiles
tree: `$TEST_SRCDIR` for a test, `$RUNFILES_DIR` for a binary, each holding one
directory per workspace (`$TEST_WORKSPACE`, here `maxtext_engine`) laid out as
the source tree. Run directly with `python -m`, a test has no runfiles tree;
`train_main_command` then falls back to `python -m maxtext.train_main`.
"""

import os
import sys
from typing import Mapping, Optional

# Names the main workspace's directory may have in a runfiles tree: the
# WORKSPACE name, and "_main" where Bazel's module system names it.
_WORKSPACE_NAMES = ("maxtext_engine", "_main")


def find(relative_path: str,
         environ: Mapping[str, str] = os.environ) -> Optional[str]:
  """The runfile at `relative_path` (from the workspace root), or None.

  Args:
    relative_path: a path such as "maxtext/train_main", '/'-separated.
    environ: the environment holding Bazel's runfiles variables.

  Returns:
    The path of that file in this process's runfiles tree, or None
    when there is no runfiles tree or the file is not in it.
  """
  parts = relative_path.split("/")
  workspaces = (environ.get("TEST_WORKSPACE", ""),) + _WORKSPACE_NAMES
  for root in (environ.get("RUNFILES_DIR"), environ.get("TEST_SRCDIR")):
    if root:
      for workspace in workspaces:
        path = os.path.join(root, workspace, *parts)
        if os.path.isfile(path):
          return path
  return None


def train_main_command(
    environ: Mapping[str, str] = os.environ) -> list[str]:
  """The command that starts train_main: the Bazel binary if present, else -m.

  The binary is `//maxtext:train_main`, found when the test lists it in `data`;
  otherwise the command is this interpreter with `-m maxtext.train_main`, which
  needs the repository root on the child's import path.

  Args:
    environ: the environment holding Bazel's runfiles variables.
  """
  binary = find("maxtext/train_main", environ)
  if binary and os.access(binary, os.X_OK):
    return [binary]
  return [sys.executable, "-m", "maxtext.train_main"]
