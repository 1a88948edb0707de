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

from maxtext import trainer
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


def _lines_by_label(fig):
  return {line.get_label(): line for line in fig.axes[0].get_lines()}


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
    cls.result = trainer.run(config)
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


if __name__ == "__main__":
  absltest.main()
