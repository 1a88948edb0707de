"""Runs an absl program's `main` inside a test's own process.

A case about what a program's code decides (which input it refuses, with
which line) need not pay for a fresh interpreter and its imports: the
program's flags are parsed from the same arguments, `main` runs with stdout
and stderr captured, and the exit status is what its SystemExit carries or
what it returns (None: 0), as `absl.app.run` exits with it. Cases about the
process itself (a kill, a traceback at exit, what a killed run left) start
the real binary instead.
"""

import contextlib
import io
import sys
import types
from typing import Callable, Sequence
from unittest import mock

from absl import flags


def run(
    module: types.ModuleType,
    main: Callable[[list[str]], None],
    args: Sequence[str],
) -> tuple[int, str, str]:
  """Runs `main` with `args` parsed into the flags `module` defines.

  Args:
    module: the program's module (imported, not run as __main__).
    main: its absl main, taking the arguments absl leaves (name first).
    args: the command line after the program's name.

  Returns:
    (exit status, stdout, stderr). An exception other than SystemExit
    propagates with its traceback.
  """
  # Flags an earlier call set fall back to their defaults first. A config
  # flag (ml_collections) defines a flag per --config.<field> override as
  # it parses; an earlier call's are removed, or parsing would define them
  # twice.
  for flag in flags.FLAGS.get_key_flags_for_module(module):
    flag.unparse()
    for name in list(flags.FLAGS):
      if name.startswith(flag.name + "."):
        delattr(flags.FLAGS, name)
  command_line = [module.__name__, *args]
  stdout, stderr = io.StringIO(), io.StringIO()
  # ml_collections' config flags read their --config.<field> overrides from
  # sys.argv, not from the list parsed: it holds the same command line.
  with (
      mock.patch.object(sys, "argv", command_line),
      contextlib.redirect_stdout(stdout),
      contextlib.redirect_stderr(stderr),
  ):
    argv = flags.FLAGS(command_line)
    try:
      status = main(argv) or 0
    except SystemExit as e:
      status = e.code
  return status, stdout.getvalue(), stderr.getvalue()
