"""Trains a decoder-only transformer. The runbook:

  # The embedded default: tiny model, synthetic data, CPU, about a minute.
  tools/bazel run //maxtext:train_main

  # Another config file, with overrides (a misspelt key is an error):
  tools/bazel run //maxtext:train_main -- \\
      --config=maxtext/configs/default.py --config.steps=50 --config.run_name=try1

  # Resume a run: the same command again (same run_name and config; add
  # --config.resume=True to make a missing checkpoint an error).

Relative paths (--config, output directories) resolve against the directory the
command was run from. SIGTERM or SIGINT stops after the current step with a
checkpoint; the exit status is then 1.
"""

import logging as std_logging
import os
import re
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from maxtext import trainer

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                               "default.py")
if "BUILD_WORKING_DIRECTORY" in os.environ:
  # bazel run starts us in the runfiles tree; --config paths are the caller's.
  _caller_dir = os.environ["BUILD_WORKING_DIRECTORY"]
  for _i, _arg in enumerate(sys.argv):
    for _prefix in ("--config=", "-config="):
      if _arg.startswith(_prefix) and not os.path.isabs(_arg[len(_prefix):]):
        _path = _arg[len(_prefix):]
        _file, _, _override = _path.partition(":")
        if os.path.exists(os.path.join(_caller_dir, _file)):
          sys.argv[_i] = _prefix + os.path.join(_caller_dir, _path)

if not any(re.match(r"-{1,2}config(=|$)", _arg) for _arg in sys.argv[1:]):
  # Named on the command line, the default config is parsed with the other flags
  # inside app.run (not at import), so a bad --config.x override is reported by
  # _parse_flags below instead of as a traceback.
  sys.argv[1:1] = ["--config=" + _DEFAULT_CONFIG]

_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG, "Config file (a module with get_config()).",
    lock_config=True)


def _parse_flags(argv):
  """absl's flag parsing; an override of a field the config lacks is a flag error."""
  try:
    return app.parse_flags_with_usage(argv)
  except (AttributeError, KeyError) as e:
    # ml_collections raises AttributeError(KeyError("'stpes'\nDid you mean ...")).
    cause = e
    while isinstance(cause, BaseException) and cause.args:
      cause = cause.args[0]
    print(f"FATAL Flags parsing error: --config override of an unknown field: "
          f"{cause}", file=sys.stderr)
    sys.exit(1)


class _QuietLibraries(std_logging.Filter):
  """Drops INFO chatter of orbax's internals; their warnings and errors still show."""

  def filter(self, record):
    return record.levelno >= std_logging.WARNING or "/orbax/" not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  logging.get_absl_handler().addFilter(_QuietLibraries())
  config_path = flags.FLAGS["config"].config_filename
  try:
    result = trainer.run(_CONFIG.value, config_filename=os.path.basename(config_path))
  except (ValueError, TypeError) as e:
    print(f"train_main: error: {e}", file=sys.stderr)
    return 2
  except (trainer.TrainingError, trainer.HardwareError) as e:
    print(f"train_main: error: {e}", file=sys.stderr)
    return 1
  print(f"train_main: {result.status} after step {result.final_step} "
        f"(eval loss {result.last_eval_loss}); run directory {result.run_dir}")
  if result.status == trainer.INTERRUPTED:
    print(f"train_main: stopped by {result.stop_reason}; resume with the same "
          "run_name.", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
