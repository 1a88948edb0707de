"""Turns a run's metrics.jsonl into a PNG of train loss and eval loss.

Run:

  tools/bazel run //tools:plot_metrics -- \
      --metrics=/path/to/run_dir/metrics.jsonl [--output=/tmp/loss.png]

`--metrics` may also name the run directory. The PNG defaults to
`metrics.png` beside the metrics file. Relative paths resolve against the
directory `bazel run` was started from.
"""

import os

from absl import app
from absl import flags
from absl import logging

from maxtext import caller_paths
from maxtext.metrics import jsonl
from tools import command_line
from tools import plot_metrics_lib

_METRICS = flags.DEFINE_string(
    "metrics",
    None,
    "Required: metrics.jsonl file, or the run directory holding it.",
)
_OUTPUT = flags.DEFINE_string(
    "output", None, "PNG to write; default metrics.png beside the metrics file."
)
_METRIC = flags.DEFINE_string(
    "metric",
    jsonl.LOSS_KEY,
    "Metric to plot: train records' <metric> and eval records' "
    "eval_<metric> (loss: train loss and eval_loss).",
)
_TARGET = flags.DEFINE_float(
    "target", None, "Draw a dashed line at this value (e.g. target eval loss)."
)


def main(argv: list[str]) -> None:
  command_line.check(argv, _METRICS)
  metrics = caller_paths.resolve_local_path(_METRICS.value)
  if os.path.isdir(metrics):
    metrics = os.path.join(metrics, jsonl.METRICS_FILENAME)
  output = (
      caller_paths.resolve_local_path(_OUTPUT.value) if _OUTPUT.value else None
  )
  written = plot_metrics_lib.plot_metrics(
      metrics, output, metric=_METRIC.value, target=_TARGET.value
  )
  logging.info("Wrote %s", written)
  print(written)


if __name__ == "__main__":
  app.run(main)
