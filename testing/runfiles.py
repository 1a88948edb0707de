"""Finds the files a test target lists as `data` in its Bazel runfiles tree.

Under `bazel test` (and `bazel run`) a target's data files sit in a runfiles
tree: `$TEST_SRCDIR` for a test, `$RUNFILES_DIR` for a binary, each holding one
directory per workspace (`$TEST_WORKSPACE`, here `maxtext_engine`) laid out as
the source tree. Run directly with `python -m`, a test has no runfiles tree;
`binary_command` then falls back to `python -m` and the binary's module.
"""

import os
import subprocess
import sys
from typing import Mapping, Optional, Sequence

# Names the main workspace's directory may have in a runfiles tree: the
# WORKSPACE name, and "_main" where Bazel's module system names it.
_WORKSPACE_NAMES = ("maxtext_engine", "_main")


def find(
    relative_path: str, environ: Mapping[str, str] = os.environ
) -> Optional[str]:
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


def binary_command(
    target_path: str, environ: Mapping[str, str] = os.environ
) -> list[str]:
  """The command that starts a py_binary: the Bazel binary if present, else -m.

  The binary (e.g. "maxtext/train_main" for `//maxtext:train_main`) is found
  when the test lists it in `data`; otherwise the command is this interpreter
  with `-m` and the module of the same path ("maxtext.train_main"), which
  needs the repository root on the child's import path.

  Args:
    target_path: the binary's path from the workspace root, '/'-separated.
    environ: the environment holding Bazel's runfiles variables.
  """
  binary = find(target_path, environ)
  if binary and os.access(binary, os.X_OK):
    return [binary]
  return [sys.executable, "-m", target_path.replace("/", ".")]


def train_main_command(environ: Mapping[str, str] = os.environ) -> list[str]:
  """The command that starts `//maxtext:train_main` (see `binary_command`)."""
  return binary_command("maxtext/train_main", environ)


# The repository root, for `python -m` runs outside Bazel.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binary_environ(
    command: Sequence[str], extra: Optional[Mapping[str, str]] = None
) -> dict[str, str]:
  """The environment to start `command` (from `binary_command`) with.

  This process's environment with JAX_PLATFORMS defaulting to "cpu", the
  repository root on PYTHONPATH when `command` is a `python -m` run, and
  `extra` on top.
  """
  env = dict(os.environ)
  env.setdefault("JAX_PLATFORMS", "cpu")
  if command[0] == sys.executable:
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_REPO_ROOT, env.get("PYTHONPATH", "")) if p
    )
  env.update(extra or {})
  return env


def cached_environ(command: Sequence[str], **extra: str) -> dict[str, str]:
  """`binary_environ` with every compilation kept in the persistent cache.

  JAX caches only programs that took a second or more to compile by default;
  a test's tiny programs compile faster, so the runs of one test would each
  compile them again.
  """
  return binary_environ(
      command, {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", **extra}
  )


def run_binary(
    target_path: str,
    args: Sequence[str],
    *,
    timeout_s: float,
    cwd: Optional[str] = None,
    cache_compilations: bool = False,
) -> subprocess.CompletedProcess:
  """Runs a py_binary (see `binary_command`) to the end; output captured.

  Args:
    target_path: the binary's path from the workspace root, '/'-separated.
    args: its command-line arguments.
    timeout_s: how long it may run (subprocess.TimeoutExpired after that).
    cwd: its working directory (default: this process's).
    cache_compilations: keep every compilation in the persistent cache
      (`cached_environ`), for a test that runs the binary more than once.

  Returns:
    The CompletedProcess, with text stdout and stderr; the caller checks the
    return code. The child's environment is `binary_environ`'s (or
    `cached_environ`'s).
  """
  command = binary_command(target_path)
  environ = cached_environ if cache_compilations else binary_environ
  return subprocess.run(
      command + list(args),
      cwd=cwd,
      env=environ(command),
      capture_output=True,
      text=True,
      timeout=timeout_s,
      check=False,
  )


def run_python(
    script: str,
    args: Sequence[str] = (),
    *,
    timeout_s: float,
    extra_env: Optional[Mapping[str, str]] = None,
) -> subprocess.CompletedProcess:
  """Runs `python -c script args...` in a fresh interpreter; output captured.

  A fresh process is how a test sees what happens when a program starts
  (the devices JAX makes, the signal mask it inherits). The child imports
  what this process imports (this process's sys.path is its PYTHONPATH),
  with JAX_PLATFORMS defaulting to "cpu" and `extra_env` on top.

  Returns:
    The CompletedProcess, with text stdout and stderr; the caller checks the
    return code.
  """
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
  env.setdefault("JAX_PLATFORMS", "cpu")
  env.update(extra_env or {})
  return subprocess.run(
      [sys.executable, "-c", script, *args],
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout_s,
      check=False,
  )
