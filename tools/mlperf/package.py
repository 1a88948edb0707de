"""Packages MLPerf Training runs as a submission and checks it. The runbook:

  # Package runs already made (each a run directory with a compliant log):
  tools/bazel run //tools/mlperf:package -- --output_dir=OUT \\
      RUN_DIR [RUN_DIR ...]

  # Or train the runs here, one after another (each with a fresh random seed,
  # its log checked right after it), in OUT/runs/run_<i>, then package them:
  tools/bazel run //tools/mlperf:package -- --output_dir=OUT --runs=10 \\
      --config=maxtext/configs/llama31_8b.py [--config.<field>=...]

It writes OUT/<org>/{systems,results,benchmarks}/, runs the official package
checker, the RCP checker (closed division) and the result summarizer, and ends
with the line

  mlperf_package: checker=<ok|failed> runs=<N> score=<minutes or n/a>

Exit status: 0 when the package checker found no errors, 1 when it found
some, 2 when the runs were refused (mixed divisions, the wrong number of runs
for the benchmark, runs recorded under different git revisions, in the closed
division a run whose revision is not the packager's clean one, a log failing
the compliance checker) or the arguments are wrong. Relative paths resolve
against the directory the command was run from.

The implementation directory's build_info.json names the packager's git
revision; in the open division a run that does not record it (or records an
unknown or modified tree) is a WARNING line, not a refusal.
"""

import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from maxtext.core import caller_paths
from tools.mlperf import layout
from tools.mlperf import run_logs
from tools.mlperf import submission

_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir",
    None,
    "Directory the submission is written under.",
    required=True,
)
_RUNS = flags.DEFINE_integer(
    "runs",
    0,
    "Train this many runs of --config first (instead of packaging "
    "the run directories given as arguments).",
    lower_bound=0,
)
_IMPLEMENTATION = flags.DEFINE_string(
    "implementation",
    layout.DEFAULT_IMPLEMENTATION,
    "Name of the benchmarks/<benchmark>/implementations/ directory.",
)
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file of the runs (with --runs).", lock_config=True
)


def _parse_flags(argv):
  return app.parse_flags_with_usage(
      caller_paths.resolve_config_args(argv, os.environ)
  )


def main(argv):
  run_dirs = [caller_paths.resolve_local_path(d, os.environ) for d in argv[1:]]
  out_dir = caller_paths.resolve_local_path(_OUTPUT_DIR.value, os.environ)
  config = _CONFIG.value
  if _RUNS.value and run_dirs:
    raise app.UsageError("give either run directories or --runs, not both")
  if not _RUNS.value and not run_dirs:
    raise app.UsageError(
        "give run directories to package, or --runs=N and "
        "--config=FILE to train them"
    )
  if _RUNS.value and config is None:
    raise app.UsageError("--runs needs --config=FILE")
  try:
    if _RUNS.value:
      # An existing package is refused before any run is trained.
      layout.check_no_results(
          out_dir,
          config.submission_org,
          config.submission_platform,
          config.submission_benchmark,
      )
      # Only --runs trains: the packaging path needs no model code.
      # pylint: disable-next=import-outside-toplevel
      from tools.mlperf import training

      config_path = flags.FLAGS["config"].config_filename
      runs = training.train_runs(
          config,
          _RUNS.value,
          out_dir,
          config_filename=os.path.basename(config_path.partition(":")[0]),
      )
    else:
      runs = [run_logs.read_run(d) for d in run_dirs]
    result = submission.build_package(
        out_dir,
        runs,
        implementation=_IMPLEMENTATION.value,
        compliance_checked=bool(_RUNS.value),
    )
  except (ValueError, FileExistsError) as e:
    # PackageError and RunDirError are ValueErrors: refusals, each explained.
    print(f"mlperf_package: refused: {e}", file=sys.stderr)
    return 2
  except (RuntimeError, OSError) as e:
    # A run of --runs could not go on (trainer errors are RuntimeErrors).
    print(f"mlperf_package: a run failed: {e}", file=sys.stderr)
    return 1
  print(result.last_line())
  return 0 if result.checker.ok else 1


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
