"""Tests for //tools:plot_metrics: the library and the binary's main."""

import os

from absl import app
from absl.testing import absltest
from absl.testing import flagsaver
from absl.testing import parameterized
from matplotlib import image as mpl_image
import numpy as np

from maxtext.metrics import writers as metric_logger
from tools import plot_metrics
from tools import plot_metrics_lib


def write_metrics(path: str, records) -> None:
  with open(path, "w") as f:
    for step, kind, scalars in records:
      f.write(metric_logger.encode_record(step, kind, scalars) + "\n")


SAMPLE = [
    (0, "train", {"loss": 3.0, "learning_rate": 0.0}),
    (1, "train", {"loss": 2.0}),
    (1, "eval", {"loss": 2.5}),
    (2, "train", {"loss": float("nan"), "step_skipped": 1}),
    (3, "train", {"loss": 1.0}),
    (3, "eval", {"loss": 1.5}),
]


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
        self.metrics, output, target=1.2, width_px=640, height_px=400)
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

  def test_reads_a_real_metric_logger_file(self):
    with metric_logger.MetricLogger(self.dir, is_primary=True, log_period=10,
                                    total_steps=4, tokens_per_step=16,
                                    time_fn=iter(range(100)).__next__) as log:
      for step in range(4):
        log.write_train(step, {"loss": 4.0 - step})
      log.write_eval(3, {"loss": 1.25})
    curves = plot_metrics_lib.load_loss_curves(self.metrics)
    self.assertEqual(curves.train_values, (4.0, 3.0, 2.0, 1.0))
    self.assertEqual(curves.eval_values, (1.25,))

  @parameterized.named_parameters(
      ("empty", "", ValueError, "no train or eval record"),
      ("no_loss", '{"step": 0, "kind": "train", "lr": 1.0}\n', ValueError,
       "no train or eval record"),
      ("bad_json", 'garbage\n{"step": 0, "kind": "train", "loss": 1}\n',
       ValueError, "metrics.jsonl:1"),
  )
  def test_bad_file_names_the_path(self, content, error, regex):
    with open(self.metrics, "w") as f:
      f.write(content)
    with self.assertRaisesRegex(error, regex) as ctx:
      plot_metrics_lib.plot_metrics(self.metrics)
    self.assertIn(self.metrics, str(ctx.exception))
    self.assertFalse(os.path.exists(os.path.join(self.dir, "metrics.png")))

  def test_missing_file_names_the_path(self):
    with self.assertRaisesRegex(FileNotFoundError, "metrics.jsonl"):
      plot_metrics_lib.plot_metrics(self.metrics)

  def test_bad_size(self):
    write_metrics(self.metrics, SAMPLE)
    with self.assertRaisesRegex(ValueError, "width_px"):
      plot_metrics_lib.plot_metrics(self.metrics, width_px=0)

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
