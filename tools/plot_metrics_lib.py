"""Plots train and eval loss from a run's metrics.jsonl into a PNG file.

The library behind `//tools:plot_metrics`. It draws with matplotlib's Agg
renderer on a private `Figure` (no pyplot global state, no display needed).
"""

import dataclasses
import math
import os

from matplotlib import figure as mpl_figure

from maxtext.metrics import writers as metric_logger

DEFAULT_OUTPUT_NAME = "metrics.png"


@dataclasses.dataclass(frozen=True)
class LossCurves:
  """Finite (step, value) points of one metric, per record kind."""
  train_steps: tuple[int, ...]
  train_values: tuple[float, ...]
  eval_steps: tuple[int, ...]
  eval_values: tuple[float, ...]


def load_loss_curves(metrics_path: str | os.PathLike[str],
                     metric: str = "loss") -> LossCurves:
  """Reads `metric` of train and eval records from a metrics.jsonl file.

  Records without the metric, and non-finite values, are left out. When a
  step appears more than once for a kind (a file appended to without
  truncation), the last record wins.

  Args:
    metrics_path: a `metrics.jsonl` file written by `MetricLogger`.
    metric: the metric name to read.

  Returns:
    The curves, sorted by step.

  Raises:
    FileNotFoundError: the file is missing.
    ValueError: the file is malformed, or holds no finite `metric` value;
      the message names the path.
  """
  path = os.fspath(metrics_path)
  points = {"train": {}, "eval": {}}
  for record in metric_logger.read_jsonl(path):
    value = record.get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    if math.isfinite(value):
      points[record["kind"]][record["step"]] = float(value)
  if not points["train"] and not points["eval"]:
    raise ValueError(
        f"{path}: no train or eval record has a finite {metric!r} value")
  train = sorted(points["train"].items())
  evals = sorted(points["eval"].items())
  return LossCurves(
      train_steps=tuple(s for s, _ in train),
      train_values=tuple(v for _, v in train),
      eval_steps=tuple(s for s, _ in evals),
      eval_values=tuple(v for _, v in evals))


def plot_metrics(metrics_path: str | os.PathLike[str],
                 output_path: str | os.PathLike[str] | None = None,
                 *,
                 metric: str = "loss",
                 target: float | None = None,
                 title: str | None = None,
                 width_px: int = 1000,
                 height_px: int = 600) -> str:
  """Writes a PNG of the train and eval `metric` versus step.

  Args:
    metrics_path: a `metrics.jsonl` file written by `MetricLogger`.
    output_path: the PNG to write; default `metrics.png` beside the input.
      Its directory is created if missing.
    metric: the metric to plot.
    target: if given, drawn as a dashed horizontal line (e.g. the target
      eval loss).
    title: the plot title; default the input path.
    width_px: image width in pixels (> 0).
    height_px: image height in pixels (> 0).

  Returns:
    The path of the written PNG.

  Raises:
    FileNotFoundError, ValueError: see `load_loss_curves`; ValueError also
      for a non-positive size.
  """
  for name, value in (("width_px", width_px), ("height_px", height_px)):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise ValueError(f"{name} must be a positive int, got {value!r}")
  metrics_path = os.fspath(metrics_path)
  curves = load_loss_curves(metrics_path, metric)
  if output_path is None:
    output_path = os.path.join(os.path.dirname(os.path.abspath(metrics_path)),
                               DEFAULT_OUTPUT_NAME)
  output_path = os.fspath(output_path)

  dpi = 100
  fig = mpl_figure.Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
  ax = fig.subplots()
  if curves.train_steps:
    ax.plot(curves.train_steps, curves.train_values, label=f"train {metric}",
            linewidth=1.0)
  if curves.eval_steps:
    ax.plot(curves.eval_steps, curves.eval_values, label=f"eval {metric}",
            marker="o", linewidth=1.5)
  if target is not None:
    ax.axhline(target, color="gray", linestyle="--", linewidth=1.0,
               label=f"target {target:g}")
  ax.set_xlabel("step")
  ax.set_ylabel(metric)
  ax.set_title(title if title is not None else metrics_path, fontsize=9)
  ax.grid(True, alpha=0.3)
  ax.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
  fig.savefig(output_path, format="png", dpi=dpi)
  return output_path
