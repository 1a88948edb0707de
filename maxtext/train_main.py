"""Trains a decoder-only transformer, any workload. The runbook:

  # The embedded default: tiny model, synthetic data, CPU, about a minute.
  tools/bazel run //maxtext:train_main

  # Another config file, with overrides (a misspelt key is an error):
  tools/bazel run //maxtext:train_main -- \\
      --config=maxtext/configs/default.py --config.steps=50 \\
      --config.run_name=try1

  # Resume a run: the same command again (same run_name and config; add
  # --config.resume=True to make a missing checkpoint an error).

Relative paths (--config, output directories) resolve against the directory the
command was run from. SIGTERM or SIGINT stops after the current step with a
checkpoint; the exit status is then 1.

The config's `workload` field picks the kind of training (pretraining, GRPO;
maxtext/workloads.py); every workload runs in the one training loop.
`grpo_main` is this binary with grpo_tiny.py as its default config.
"""

import functools
import logging as std_logging
import os
import sys
import traceback
from typing import Optional

from absl import app
from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

from maxtext.core import caller_paths
from maxtext.config import config_lib
from maxtext import workloads
from maxtext.run import trainer
from maxtext.grpo.rewards import rewards
from maxtext.storage import checkpointing
from maxtext.storage import run_lock

DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "configs", "default.py"
)
# No default here: a default config file would be loaded, and its --config.x
# overrides parsed, when this module is imported, so a bad override would be a
# traceback at import. `_parse_flags` names the default on the command
# line instead, and the file is then loaded by the flags parser at run time.
_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file (a module with get_config()); default "
    "maxtext/configs/default.py.",
    lock_config=True,
)


# The binary's name in its messages ("train_main: error: ..."); `run_binary`
# sets it for the binaries built on this one.
_BINARY = {"name": "train_main"}


def _parse_flags(argv, default_config: str = DEFAULT_CONFIG):
  """absl's flag parsing after `caller_paths.resolve_config_args`.

  An override of a field the config lacks is a flag error.

  Args:
    argv: the command line, program name first.
    default_config: the config file when the command line names none.

  Returns:
    The program name and the positional arguments.
  """
  argv = caller_paths.resolve_config_args(argv, os.environ, default_config)
  # ml_collections reads the --config.x overrides from sys.argv itself; they
  # are the same there as in `argv`, which only differs in the --config file.
  try:
    return app.parse_flags_with_usage(argv)
  except (AttributeError, KeyError) as e:
    # The file itself may be what fails (no get_config, or one that returns
    # no ConfigDict); otherwise ml_collections raises
    # AttributeError(KeyError("'stpes'\nDid you mean ...")) for an override.
    config_path = _config_arg(argv)
    problem = config_path and _config_file_problem(config_path)
    if problem:
      sys.exit(_error(problem, status=2))
    cause = e
    while isinstance(cause, BaseException) and cause.args:
      cause = cause.args[0]
    print(
        f"FATAL Flags parsing error: --config override of an unknown field: "
        f"{cause}",
        file=sys.stderr,
    )
    sys.exit(1)
  # The config file is user code: it may raise anything.
  except Exception as e:  # pylint: disable=broad-except
    # Anything else comes from loading the user's config file (a syntax
    # error, an exception in get_config): that file's problem, said in one
    # line with its location.
    sys.exit(_error(f"--config file cannot be loaded: {_located(e)}", status=2))


def _located(error: BaseException) -> str:
  """`Type: message (file, line N)` for an error raised by a config file."""
  if isinstance(error, SyntaxError):
    return f"SyntaxError: {error.msg} ({error.filename}, line {error.lineno})"
  where = ""
  frames = traceback.extract_tb(error.__traceback__)
  if frames:
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})"
  message = str(error).strip().splitlines()
  return f"{type(error).__name__}: {message[-1] if message else ''}{where}"


class _QuietLibraries(std_logging.Filter):
  """Drops INFO chatter of orbax's internals; warnings and errors still show."""

  def filter(self, record):
    return (
        record.levelno >= std_logging.WARNING
        or "/orbax/" not in record.pathname
    )


def _config_file_problem(config_path: str) -> Optional[str]:
  """One line saying why `--config=config_path` gives no ConfigDict, or None.

  Loads the file again on its own (`config_lib.load_config_file`), so the
  answer names the file's own problem (no `get_config`, a `get_config` that
  returns something else, an exception in it) whatever ml_collections made
  of it: it keeps a load error in a stand-in object, and an override of a
  file without `get_config` fails as an unknown field.
  """
  file_path, _, argument = config_path.partition(":")
  if not os.path.isfile(file_path):
    problem = (
        "is a directory, not a config file"
        if os.path.isdir(file_path)
        else "does not exist"
    )
    return f"--config={config_path}: {problem}"
  try:
    config_lib.load_config_file(file_path, argument)
  except ValueError as e:  # The message names the file.
    return f"--config: {e}"
  # Whatever the user's config file raised is the file's problem.
  except Exception as e:  # pylint: disable=broad-except
    return f"--config={config_path} cannot be loaded: {_located(e)}"
  return None


def _config_arg(argv) -> Optional[str]:
  """The value of the last --config=FILE (or --config FILE) in `argv`."""
  found = None
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      found = arg[len("--config=") :]
    elif arg == "--config" and i + 1 < len(argv):
      found = argv[i + 1]
  return found


def _error(error, status: int) -> int:
  """Prints a failure the user can act on, without a traceback; returns
  `status`. The message is one line, except where it lists several causes
  (e.g. every checkpoint that failed to restore)."""
  print(f"{_BINARY['name']}: error: {str(error).strip()}", file=sys.stderr)
  return status


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  logging.get_absl_handler().addFilter(_QuietLibraries())
  config_path = flags.FLAGS["config"].config_filename
  config = _CONFIG.value
  if not isinstance(config, ml_collections.ConfigDict):
    problem = _config_file_problem(config_path) or (
        f"--config={config_path} did not give a ConfigDict"
    )
    return _error(problem, status=2)
  try:
    result = workloads.run(
        config, config_filename=os.path.basename(config_path)
    )
  except (trainer.ConfigError, run_lock.RunLockError) as e:
    # The config, a path or the run directory: fixable before a new start.
    # Any other ValueError is a bug and keeps its traceback.
    return _error(e, status=2)
  except (
      trainer.TrainingError,
      trainer.HardwareError,
      trainer.ListenerError,
      checkpointing.CheckpointError,
      run_lock.RunLockLost,
      rewards.RewardError,
      OSError,
  ) as e:
    # The run could not go on; its last checkpoint holds what it trained.
    return _error(e, status=1)
  print(f"{_BINARY['name']}: {_summary(result)}")
  if result.status == trainer.RunOutcome.INTERRUPTED:
    print(
        f"{_BINARY['name']}: stopped by {result.stop_reason}; resume with "
        "the same run_name.",
        file=sys.stderr,
    )
    return 1
  return 0


def _summary(result: trainer.RunResult) -> str:
  """The run's end in one line: how, after which step, its evals, where."""
  if result.start_eval is not None:
    evals = f"eval at the start {result.start_eval}, at the end "
    evals += f"{result.last_eval}"
  else:
    evals = f"eval loss {result.last_eval_loss}"
  return (
      f"{result.status.value} after step {result.final_step} ({evals}); "
      f"run directory {result.run_dir}"
  )


def run_binary(program: str, default_config: str) -> None:
  """Runs this binary as `program`, with `default_config` when no --config
  is given (how grpo_main is built on it)."""
  _BINARY["name"] = program
  app.run(
      main,
      flags_parser=functools.partial(
          _parse_flags, default_config=default_config
      ),
  )


if __name__ == "__main__":
  run_binary("train_main", DEFAULT_CONFIG)
