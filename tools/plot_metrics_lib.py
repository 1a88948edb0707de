"""Plots train and eval metrics of one or more runs' metrics.jsonl into a PNG.

The library behind `//tools:plot_metrics`. It reads records through
`maxtext.metrics.jsonl` (the one record schema; no JAX or TensorBoard), so a
metric is read under its schema key per record kind: the train curve of
"loss" from train records' "loss", the eval curve from eval records'
"eval_loss". It draws with matplotlib's Agg renderer on a private `Figure`
(no pyplot global state, no display needed).
"""

from collections.abc import Mapping, Sequence
import dataclasses
import math
import os

from matplotlib import figure as mpl_figure

from maxtext.core import checks
from maxtext.metrics import jsonl

DEFAULT_OUTPUT_NAME = "metrics.png"
_DPI = 100


@dataclasses.dataclass(frozen=True)
class LossCurves:
  """Finite (step, value) points of one metric, per record kind."""

  train_steps: tuple[int, ...]
  train_values: tuple[float, ...]
  eval_steps: tuple[int, ...]
  eval_values: tuple[float, ...]


def load_loss_curves(
    metrics_path: str | os.PathLike[str], metric: str = jsonl.LOSS_KEY
) -> LossCurves:
  """Reads `metric` of train and eval records from a metrics.jsonl file.

  Train records hold the metric under its name, eval records under
  `jsonl.metric_key("eval", metric)` ("loss" -> "eval_loss"). Records
  without the metric, and non-finite values, are left out. When a step
  appears more than once for a kind (a file appended to without truncation),
  the last record wins.

  Args:
    metrics_path: a `metrics.jsonl` file.
    metric: the metric's base name, e.g. "loss".

  Returns:
    The curves, sorted by step.

  Raises:
    FileNotFoundError: the file is missing.
    ValueError: the file is malformed, or holds no finite `metric` value;
      the message names the path. Also for an empty `metric`.
  """
  keys = {kind: jsonl.metric_key(kind, metric) for kind in jsonl.KINDS}
  path = os.fspath(metrics_path)
  points = {kind: {} for kind in jsonl.KINDS}
  for record in jsonl.read_jsonl(path):
    kind = record[jsonl.KIND_KEY]
    value = record.get(keys[kind])
    if checks.is_number(value) and math.isfinite(value):
      points[kind][record[jsonl.STEP_KEY]] = float(value)
  if not any(points.values()):
    raise ValueError(
        f"{path}: no train record has a finite {keys[jsonl.TRAIN]!r} value "
        f"and no eval record a finite {keys[jsonl.EVAL]!r} value"
    )
  train = sorted(points[jsonl.TRAIN].items())
  evals = sorted(points[jsonl.EVAL].items())
  return LossCurves(
      train_steps=tuple(s for s, _ in train),
      train_values=tuple(v for _, v in train),
      eval_steps=tuple(s for s, _ in evals),
      eval_values=tuple(v for _, v in evals),
  )


def _draw(ax, curves: LossCurves, metric: str, prefix: str) -> None:
  """One run's train and eval lines of `metric` on `ax`, labels prefixed."""
  if curves.train_steps:
    ax.plot(
        curves.train_steps,
        curves.train_values,
        label=f"{prefix}train {metric}",
        linewidth=1.0,
    )
  if curves.eval_steps:
    ax.plot(
        curves.eval_steps,
        curves.eval_values,
        label=f"{prefix}eval {metric}",
        marker="o",
        linewidth=1.5,
    )


def make_figure(
    curves: LossCurves,
    *,
    metric: str = jsonl.LOSS_KEY,
    target: float | None = None,
    title: str = "",
    width_px: int = 1000,
    height_px: int = 600,
) -> mpl_figure.Figure:
  """Draws the curves on a new figure: one line per kind that has points.

  Args:
    curves: the points to draw.
    metric: the metric's base name, for the labels.
    target: if given, drawn as a dashed horizontal line (e.g. the target
      eval loss).
    title: the plot title.
    width_px: image width in pixels (>= 1).
    height_px: image height in pixels (>= 1).

  Returns:
    The figure; its axes' lines are labelled "train <metric>", "eval
    <metric>" and "target <value>".

  Raises:
    TypeError, ValueError: a size is not an int >= 1, or `target` is not a
      finite number.
  """
  return make_runs_figure(
      [("", {metric: curves})],
      [metric],
      target=target,
      title=title,
      width_px=width_px,
      height_px=height_px,
  )


def make_runs_figure(
    runs: Sequence[tuple[str, Mapping[str, LossCurves]]],
    metrics: Sequence[str],
    *,
    target: float | None = None,
    title: str = "",
    width_px: int = 1000,
    height_px: int = 600,
) -> mpl_figure.Figure:
  """Draws several runs' curves: one axes per metric, stacked, shared steps.

  Args:
    runs: (label, metric -> curves) per run; a non-empty label prefixes the
      run's line labels ("<label>: train <metric>"), an empty one leaves
      them as `make_figure`'s.
    metrics: the metrics to draw, one axes each, top to bottom (>= 1).
    target: if given, drawn as a dashed horizontal line on every axes.
    title: the title of the top axes.
    width_px: image width in pixels (>= 1).
    height_px: image height in pixels (>= 1).

  Returns:
    The figure; `fig.axes[i]` draws `metrics[i]`.

  Raises:
    TypeError, ValueError: a size is not an int >= 1, `target` is not a
      finite number, or `metrics` is empty.
  """
  width_px = checks.check_int("width_px", width_px, 1)
  height_px = checks.check_int("height_px", height_px, 1)
  if target is not None:
    target = checks.check_number("target", target)
  if not metrics:
    raise ValueError("metrics: name at least one metric to plot")
  fig = mpl_figure.Figure(figsize=(width_px / _DPI, height_px / _DPI), dpi=_DPI)
  axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
  for ax, metric in zip(axes, metrics):
    for label, curves in runs:
      _draw(ax, curves[metric], metric, f"{label}: " if label else "")
    if target is not None:
      ax.axhline(
          target,
          color="gray",
          linestyle="--",
          linewidth=1.0,
          label=f"target {target:g}",
      )
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8 if len(runs) > 1 else None)
  axes[0].set_title(title, fontsize=9)
  axes[-1].set_xlabel("step")
  fig.tight_layout()
  return fig


def _metrics_file(path: str | os.PathLike[str]) -> str:
  """`path`, or the metrics.jsonl inside it when it is a directory."""
  path = os.fspath(path)
  if os.path.isdir(path):
    return os.path.join(path, jsonl.METRICS_FILENAME)
  return path


def run_label(metrics_path: str | os.PathLike[str]) -> str:
  """A run's name in a legend: its run directory's basename."""
  return os.path.basename(
      os.path.dirname(os.path.abspath(_metrics_file(metrics_path)))
  )


def plot_metrics(
    metrics_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str] | None = None,
    *,
    metric: str = jsonl.LOSS_KEY,
    target: float | None = None,
    title: str | None = None,
    width_px: int = 1000,
    height_px: int = 600,
) -> str:
  """Writes a PNG of the train and eval `metric` versus step.

  Args:
    metrics_path: a `metrics.jsonl` file.
    output_path: the PNG to write; default `metrics.png` beside the input.
      Its directory is created if missing.
    metric: the metric's base name (the eval curve reads "eval_<metric>").
    target: if given, drawn as a dashed horizontal line (e.g. the target
      eval loss).
    title: the plot title; default the input path.
    width_px: image width in pixels (>= 1).
    height_px: image height in pixels (>= 1).

  Returns:
    The path of the written PNG.

  Raises:
    FileNotFoundError, ValueError: see `load_loss_curves`.
    TypeError, ValueError: see `make_figure`; checked before the file is
      read.
  """
  return plot_runs(
      [metrics_path],
      output_path,
      metrics=[metric],
      target=target,
      title=title,
      width_px=width_px,
      height_px=height_px,
  )


def plot_runs(
    metrics_paths: Sequence[str | os.PathLike[str]],
    output_path: str | os.PathLike[str] | None = None,
    *,
    metrics: Sequence[str] = (jsonl.LOSS_KEY,),
    target: float | None = None,
    title: str | None = None,
    width_px: int = 1000,
    height_px: int = 600,
) -> str:
  """Writes a PNG of several runs' `metrics` versus step, overlaid.

  One axes per metric; each run's train and eval curves of it. With one run
  the labels are `make_figure`'s; with several each is prefixed with the
  run's label (`run_label`: its directory's name). A run needs a finite
  value of every metric (in a train or an eval record).

  Args:
    metrics_paths: `metrics.jsonl` files or the run directories holding
      them (>= 1).
    output_path: the PNG to write; default `metrics.png` beside the first
      input. Its directory is created if missing.
    metrics: the metrics' base names, one axes each (>= 1).
    target: if given, drawn as a dashed horizontal line on every axes.
    title: the plot title; default the input path(s).
    width_px: image width in pixels (>= 1).
    height_px: image height in pixels (>= 1).

  Returns:
    The path of the written PNG.

  Raises:
    FileNotFoundError, ValueError: see `load_loss_curves`; also for no
      input or no metric.
    TypeError, ValueError: see `make_runs_figure`; checked before any file
      is read.
  """
  checks.check_int("width_px", width_px, 1)
  checks.check_int("height_px", height_px, 1)
  if target is not None:
    checks.check_number("target", target)
  paths = [_metrics_file(p) for p in metrics_paths]
  if not paths:
    raise ValueError("metrics_paths: name at least one metrics.jsonl")
  if not metrics:
    raise ValueError("metrics: name at least one metric to plot")
  fig = make_runs_figure(
      _load_runs(paths, metrics),
      list(metrics),
      target=target,
      title=title if title is not None else ", ".join(paths),
      width_px=width_px,
      height_px=height_px,
  )
  if output_path is None:
    output_path = os.path.join(
        os.path.dirname(os.path.abspath(paths[0])), DEFAULT_OUTPUT_NAME
    )
  return _save_png(fig, os.fspath(output_path))


def _load_runs(
    paths: Sequence[str], metrics: Sequence[str]
) -> list[tuple[str, dict[str, LossCurves]]]:
  """(label, curves by metric) of each metrics.jsonl of `paths`, for
  `make_runs_figure`; the label is "" for a single run.

  Raises:
    FileNotFoundError, ValueError: see `load_loss_curves`.
  """
  several = len(paths) > 1
  return [
      (
          run_label(path) if several else "",
          {metric: load_loss_curves(path, metric) for metric in metrics},
      )
      for path in paths
  ]


def _save_png(fig, output_path: str) -> str:
  """Writes `fig` as a PNG to `output_path` (its directory made if
  missing); returns the path."""
  os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
  fig.savefig(output_path, format="png", dpi=_DPI)
  return output_path
