"""Tests for //tools:plot_metrics: the library and the binary's main.

Most tests plot small files written with `maxtext.metrics.jsonl`; one plots
the metrics.jsonl of a real tiny training run (`trainer.run`, in-process), so
the plot follows the keys the trainer really writes.
"""

import math
import os
import tempfile

from absl import app
from absl.testing import absltest
from absl.testing import flagsaver
from absl.testing import parameterized
from matplotlib import image as mpl_image
import numpy as np

from maxtext import workloads

from maxtext.metrics import jsonl
from testing import tiny_configs
from tools import plot_metrics
from tools import plot_metrics_lib


def write_metrics(path: str, records) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for step, kind, scalars in records:
      f.write(jsonl.encode_record(step, kind, scalars) + "\n")


SAMPLE = [
    (0, "train", {"loss": 3.0, "learning_rate": 0.0}),
    (1, "train", {"loss": 2.0}),
    (1, "eval", {"eval_loss": 2.5, "eval_time": 0.1}),
    (2, "train", {"loss": float("nan"), "step_skipped": 1}),
    (3, "train", {"loss": 1.0}),
    (3, "eval", {"eval_loss": 1.5, "eval_time": 0.1}),
]


def _lines_by_label(fig, axes: int = 0):
  return {line.get_label(): line for line in fig.get_axes()[axes].get_lines()}


class RealRunPlotTest(absltest.TestCase):
  """Plots the metrics.jsonl of one real tiny training run."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # absltest's create_tempdir is per test; the run is shared by the class.
    cls.root = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    # 4 steps, evals after step indices 1 and 3; no MLPerf log or
    # checkpoints, which the plot does not read.
    config = tiny_configs.tiny_config(
        cls.root,
        run_name="plot",
        steps=4,
        eval_interval=2,
        enable_mllog=False,
        checkpoint_period=0,
    )
    cls.result = workloads.run(config)
    cls.metrics = os.path.join(cls.result.run_dir, jsonl.METRICS_FILENAME)

  def test_curves_of_a_real_run_have_train_and_eval_points(self):
    curves = plot_metrics_lib.load_loss_curves(self.metrics)
    self.assertEqual(curves.train_steps, (0, 1, 2, 3))
    self.assertEqual(curves.eval_steps, (1, 3))
    self.assertTrue(all(math.isfinite(v) for v in curves.train_values))
    self.assertAlmostEqual(
        curves.eval_values[-1], self.result.last_eval_loss, places=5
    )

  def test_figure_of_a_real_run_draws_both_curves(self):
    curves = plot_metrics_lib.load_loss_curves(self.metrics)
    fig = plot_metrics_lib.make_figure(curves, target=1.0)
    lines = _lines_by_label(fig)
    self.assertCountEqual(lines, ["train loss", "eval loss", "target 1"])
    self.assertEqual(list(lines["train loss"].get_xdata()), [0, 1, 2, 3])
    self.assertEqual(list(lines["eval loss"].get_xdata()), [1, 3])
    self.assertEqual(tuple(lines["eval loss"].get_ydata()), curves.eval_values)

  def test_binary_main_plots_a_real_run_directory(self):
    output = os.path.join(self.create_tempdir().full_path, "run.png")
    with flagsaver.flagsaver(metrics=self.result.run_dir, output=output):
      plot_metrics.main(["plot_metrics"])
    self.assertEqual(mpl_image.imread(output).shape[:2], (600, 1000))


class PlotMetricsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path
    self.metrics = os.path.join(self.dir, "metrics.jsonl")

  def test_load_loss_curves_skips_non_finite_and_other_metrics(self):
    write_metrics(self.metrics, SAMPLE)
    curves = plot_metrics_lib.load_loss_curves(self.metrics)
    self.assertEqual(curves.train_steps, (0, 1, 3))
    self.assertEqual(curves.train_values, (3.0, 2.0, 1.0))
    self.assertEqual(curves.eval_steps, (1, 3))
    self.assertEqual(curves.eval_values, (2.5, 1.5))

  def test_writes_decodable_png_of_requested_size(self):
    write_metrics(self.metrics, SAMPLE)
    output = os.path.join(self.dir, "plots", "loss.png")
    written = plot_metrics_lib.plot_metrics(
        self.metrics, output, target=1.2, width_px=640, height_px=400
    )
    self.assertEqual(written, output)
    pixels = mpl_image.imread(output)
    self.assertEqual(pixels.shape[:2], (400, 640))
    # Something was drawn: the image is not a single colour.
    self.assertGreater(float(np.std(pixels[..., :3])), 0.0)

  def test_default_output_beside_metrics(self):
    write_metrics(self.metrics, SAMPLE[:2])
    written = plot_metrics_lib.plot_metrics(self.metrics)
    self.assertEqual(written, os.path.join(self.dir, "metrics.png"))
    self.assertGreater(mpl_image.imread(written).size, 0)

  def test_eval_curve_reads_the_eval_prefixed_key(self):
    # An eval record's bare "loss" is not the schema's eval loss.
    write_metrics(
        self.metrics,
        [
            (0, "train", {"loss": 2.0}),
            (0, "eval", {"eval_loss": 1.5}),
            (1, "eval", {"loss": 9.0}),
        ],
    )
    curves = plot_metrics_lib.load_loss_curves(self.metrics)
    self.assertEqual((curves.eval_steps, curves.eval_values), ((0,), (1.5,)))

  def test_other_metric_reads_eval_prefixed_key(self):
    write_metrics(self.metrics, SAMPLE)
    curves = plot_metrics_lib.load_loss_curves(self.metrics, "time")
    self.assertEqual((curves.train_steps, curves.eval_steps), ((), (1, 3)))

  def test_figure_lines(self):
    write_metrics(self.metrics, SAMPLE)
    fig = plot_metrics_lib.make_figure(
        plot_metrics_lib.load_loss_curves(self.metrics), title="t"
    )
    lines = _lines_by_label(fig)
    self.assertCountEqual(lines, ["train loss", "eval loss"])
    self.assertEqual(list(lines["train loss"].get_ydata()), [3.0, 2.0, 1.0])

  def test_figure_without_eval_points_has_no_eval_line(self):
    write_metrics(self.metrics, SAMPLE[:2])
    fig = plot_metrics_lib.make_figure(
        plot_metrics_lib.load_loss_curves(self.metrics)
    )
    self.assertEqual(list(_lines_by_label(fig)), ["train loss"])

  @parameterized.named_parameters(
      ("empty", "", ValueError, "no train record"),
      (
          "no_loss",
          '{"step": 0, "kind": "train", "lr": 1.0}\n',
          ValueError,
          "no train record",
      ),
      (
          "eval_bare_loss",
          '{"step": 0, "kind": "eval", "loss": 1.0}\n',
          ValueError,
          "no eval record a finite 'eval_loss'",
      ),
      (
          "bad_json",
          'garbage\n{"step": 0, "kind": "train", "loss": 1}\n',
          ValueError,
          "metrics.jsonl:1",
      ),
  )
  def test_bad_file_names_the_path(self, content, error, regex):
    with open(self.metrics, "w", encoding="utf-8") as f:
      f.write(content)
    with self.assertRaisesRegex(error, regex) as ctx:
      plot_metrics_lib.plot_metrics(self.metrics)
    self.assertIn(self.metrics, str(ctx.exception))
    self.assertFalse(os.path.exists(os.path.join(self.dir, "metrics.png")))

  def test_missing_file_names_the_path(self):
    with self.assertRaisesRegex(FileNotFoundError, "metrics.jsonl"):
      plot_metrics_lib.plot_metrics(self.metrics)

  @parameterized.named_parameters(
      ("zero", dict(width_px=0), ValueError, "width_px"),
      ("bool", dict(height_px=True), TypeError, "height_px"),
      ("float", dict(width_px=640.0), TypeError, "width_px"),
      ("nan_target", dict(target=float("nan")), ValueError, "target"),
  )
  def test_bad_arguments(self, kwargs, error, regex):
    write_metrics(self.metrics, SAMPLE)
    with self.assertRaisesRegex(error, regex):
      plot_metrics_lib.plot_metrics(self.metrics, **kwargs)
    self.assertFalse(os.path.exists(os.path.join(self.dir, "metrics.png")))

  def test_binary_main_accepts_run_directory(self):
    write_metrics(self.metrics, SAMPLE)
    output = os.path.join(self.dir, "out.png")
    with flagsaver.flagsaver(metrics=self.dir, output=output):
      plot_metrics.main(["plot_metrics"])
    self.assertEqual(mpl_image.imread(output).shape[:2], (600, 1000))

  def test_binary_main_rejects_extra_arguments(self):
    with flagsaver.flagsaver(metrics=self.metrics):
      with self.assertRaisesRegex(app.UsageError, "extra"):
        plot_metrics.main(["plot_metrics", "extra"])

  def test_binary_main_requires_metrics_flag(self):
    with self.assertRaisesRegex(app.UsageError, "--metrics is required"):
      plot_metrics.main(["plot_metrics"])


def _write_run(root: str, name: str, reward_0: float) -> str:
  """A GRPO-like run directory: train rewards/mean, eval pass@1."""
  run_dir = os.path.join(root, name)
  os.makedirs(run_dir)
  write_metrics(
      os.path.join(run_dir, jsonl.METRICS_FILENAME),
      [
          (0, "train", {"rewards/mean": reward_0, "loss": 0.0}),
          (1, "train", {"rewards/mean": reward_0 + 0.25}),
          (1, "eval", {"eval_pass@1": reward_0 / 2, "eval_pass@8": 0.9}),
      ],
  )
  return run_dir


class PlotRunsTest(parameterized.TestCase):
  """Several runs overlaid, several metrics one panel each."""

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.runs = [
        _write_run(self.root, "seed_a", 0.5),
        _write_run(self.root, "seed_b", 0.25),
    ]

  def test_figure_has_one_axes_per_metric_and_a_line_per_run(self):
    runs = [
        (
            plot_metrics_lib.run_label(run),
            {
                m: plot_metrics_lib.load_loss_curves(
                    os.path.join(run, jsonl.METRICS_FILENAME), m
                )
                for m in ("rewards/mean", "pass@1")
            },
        )
        for run in self.runs
    ]
    fig = plot_metrics_lib.make_runs_figure(runs, ["rewards/mean", "pass@1"])
    self.assertLen(fig.get_axes(), 2)
    top, bottom = _lines_by_label(fig, 0), _lines_by_label(fig, 1)
    self.assertCountEqual(
        top, ["seed_a: train rewards/mean", "seed_b: train rewards/mean"]
    )
    self.assertCountEqual(
        bottom, ["seed_a: eval pass@1", "seed_b: eval pass@1"]
    )
    self.assertEqual(
        list(top["seed_b: train rewards/mean"].get_ydata()), [0.25, 0.5]
    )
    self.assertEqual(list(bottom["seed_a: eval pass@1"].get_xdata()), [1])
    self.assertEqual(list(bottom["seed_a: eval pass@1"].get_ydata()), [0.25])

  def test_plot_runs_writes_png_beside_first_run(self):
    written = plot_metrics_lib.plot_runs(
        self.runs, metrics=["rewards/mean", "pass@1"], height_px=500
    )
    self.assertEqual(written, os.path.join(self.runs[0], "metrics.png"))
    pixels = mpl_image.imread(written)
    self.assertEqual(pixels.shape[:2], (500, 1000))
    self.assertGreater(float(np.std(pixels[..., :3])), 0.0)

  def test_a_run_without_the_metric_names_its_path(self):
    other = os.path.join(self.root, "pretrain")
    os.makedirs(other)
    write_metrics(
        os.path.join(other, jsonl.METRICS_FILENAME),
        [(0, "train", {"loss": 1.0})],
    )
    with self.assertRaisesRegex(ValueError, "pretrain.*pass@1"):
      plot_metrics_lib.plot_runs(self.runs + [other], metrics=["pass@1"])

  @parameterized.named_parameters(
      ("no_runs", dict(metrics_paths=[]), "metrics_paths"),
      ("no_metrics", dict(metrics=[]), "metrics"),
  )
  def test_nothing_to_plot_is_refused(self, kwargs, regex):
    kwargs.setdefault("metrics_paths", self.runs)
    with self.assertRaisesRegex(ValueError, regex):
      plot_metrics_lib.plot_runs(**kwargs)

  def test_binary_main_takes_comma_separated_runs_and_metrics(self):
    output = os.path.join(self.root, "runs.png")
    with flagsaver.flagsaver(
        metrics=",".join(self.runs),
        metric="rewards/mean,pass@1",
        output=output,
    ):
      plot_metrics.main(["plot_metrics"])
    self.assertEqual(mpl_image.imread(output).shape[:2], (600, 1000))

  def test_binary_main_user_error_is_one_line(self):
    with flagsaver.flagsaver(
        metrics=",".join(self.runs), metric="no_such_metric"
    ):
      with self.assertRaises(SystemExit) as ctx:
        plot_metrics.main(["plot_metrics"])
    self.assertEqual(ctx.exception.code, 2)

  def test_binary_main_missing_run_is_one_line(self):
    missing = os.path.join(self.create_tempdir().full_path, "no_run")
    with flagsaver.flagsaver(metrics=f"{self.runs[0]},{missing}"):
      with self.assertRaises(SystemExit) as ctx:
        plot_metrics.main(["plot_metrics"])
    self.assertEqual(ctx.exception.code, 2)


if __name__ == "__main__":
  absltest.main()
