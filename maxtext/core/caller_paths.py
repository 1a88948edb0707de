"""Paths as the user typed them: relative to the directory of the command.

`bazel run` starts a binary in its runfiles tree and names the directory the
command was typed in through the environment variable BUILD_WORKING_DIRECTORY.
A relative path on the command line or in a config is the user's, so it is
read against that directory; without Bazel it is the process's own working
directory. Every binary and library that takes a user's path resolves it here.
"""

from collections.abc import Mapping, Sequence
import os
import re
from typing import Optional

CALLER_DIR_ENV = "BUILD_WORKING_DIRECTORY"

# "--config=...", "-config=...", or "--config"/"-config" followed by the path.
_CONFIG_ARG = re.compile(r"-{1,2}config(=|$)")


def resolve_local_path(
    path: str, environ: Mapping[str, str] = os.environ
) -> str:
  """Absolute form of a local path; relative ones are from the caller's cwd.

  Args:
    path: a local path, possibly relative or starting with '~'.
    environ: the process environment (BUILD_WORKING_DIRECTORY is set by bazel
      run).

  Returns:
    The absolute, normalised path.
  """
  path = os.path.expanduser(path)
  if not os.path.isabs(path):
    path = os.path.join(environ.get(CALLER_DIR_ENV) or os.getcwd(), path)
  return os.path.normpath(path)


def _config_path(path: str, caller_dir: str) -> str:
  """`path` joined to `caller_dir` if its file part exists there, else as is."""
  if os.path.isabs(path):
    return path
  # ml_collections lets a config file take an argument: "file.py:arg".
  file_part = path.partition(":")[0]
  if os.path.exists(os.path.join(caller_dir, file_part)):
    return os.path.join(caller_dir, path)
  # Not the caller's file; it may be relative to the runfiles tree.
  return path


def resolve_config_args(
    argv: Sequence[str],
    environ: Mapping[str, str] = os.environ,
    default_config: Optional[str] = None,
) -> list[str]:
  """Returns the command line with its --config file made explicit.

  A relative --config path that exists in the caller's directory
  (BUILD_WORKING_DIRECTORY) is made absolute against it (a ":arg" suffix for
  the config's get_config is kept); one that does not is left for the
  runfiles tree. When no --config is given and `default_config` is,
  `--config=<default_config>` is inserted after the program name, so the
  default is loaded by the flags parser with the --config.x overrides, and a
  bad override is reported as a flag error. Arguments after "--" are
  positional and left alone.

  Args:
    argv: the command line, program name first (sys.argv).
    environ: the process environment (os.environ).
    default_config: the config file used when argv names none; None adds
      nothing.

  Returns:
    A new list; `argv` is not changed.

  Raises:
    ValueError: `argv` is empty (it must hold the program name).
  """
  args = list(argv)
  if not args:
    raise ValueError("argv must hold at least the program name, got []")
  caller_dir = environ.get(CALLER_DIR_ENV)
  config_given = False
  for i in range(1, len(args)):
    arg = args[i]
    if arg == "--":
      break
    match = _CONFIG_ARG.match(arg)
    if not match:
      continue
    config_given = True
    if not caller_dir:
      continue
    if match.group(1) == "=":
      prefix = arg[: match.end()]
      args[i] = prefix + _config_path(arg[match.end() :], caller_dir)
    elif i + 1 < len(args):
      args[i + 1] = _config_path(args[i + 1], caller_dir)
  if not config_given and default_config is not None:
    args.insert(1, "--config=" + default_config)
  return args
