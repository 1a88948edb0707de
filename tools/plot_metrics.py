"""Turns runs' metrics.jsonl into a PNG of train and eval curves.

Run:

  tools/bazel run //tools:plot_metrics -- \
      --metrics=/path/to/run_dir/metrics.jsonl [--output=/tmp/loss.png]

`--metrics` may also name the run directory, or several, comma-separated,
drawn over each other (each line labelled with its run directory's name);
`--metric` may name several metrics, comma-separated, one panel each:

  tools/bazel run //tools:plot_metrics -- --metrics=/runs/a,/runs/b \
      --metric=rewards/mean,pass@1 --output=/tmp/runs.png

The PNG defaults to `metrics.png` beside the first metrics file. Relative
paths resolve against the directory `bazel run` was started from.
"""

from absl import app
from absl import flags
from absl import logging

from maxtext.core import caller_paths
from maxtext.metrics import jsonl
from tools import command_line
from tools import plot_metrics_lib

_METRICS = flags.DEFINE_string(
    "metrics",
    None,
    "Required: metrics.jsonl file, or the run directory holding it; "
    "several, comma-separated, are drawn over each other.",
)
_OUTPUT = flags.DEFINE_string(
    "output", None, "PNG to write; default metrics.png beside the metrics file."
)
_METRIC = flags.DEFINE_string(
    "metric",
    jsonl.LOSS_KEY,
    "Metric to plot: train records' <metric> and eval records' "
    "eval_<metric> (loss: train loss and eval_loss); several, "
    "comma-separated, are drawn one panel each.",
)
_TARGET = flags.DEFINE_float(
    "target", None, "Draw a dashed line at this value (e.g. target eval loss)."
)


def _split(value: str) -> list[str]:
  """A comma-separated flag value's non-empty items."""
  return [item.strip() for item in value.split(",") if item.strip()]


def main(argv: list[str]) -> None:
  command_line.check(argv, _METRICS)
  paths = [caller_paths.resolve_local_path(p) for p in _split(_METRICS.value)]
  output = (
      caller_paths.resolve_local_path(_OUTPUT.value) if _OUTPUT.value else None
  )
  # A missing metrics file is the user's mistake too: one line naming it.
  with command_line.user_errors(
      "plot_metrics", (ValueError, FileNotFoundError)
  ):
    written = plot_metrics_lib.plot_runs(
        paths, output, metrics=_split(_METRIC.value), target=_TARGET.value
    )
  logging.info("Wrote %s", written)
  print(written)


if __name__ == "__main__":
  app.run(main)
