"""Tests for run directory paths and config.json."""

import datetime
import json
import os

from absl.testing import absltest
import ml_collections

from maxtext.storage import run_dir


def _config(**overrides):
  config = ml_collections.ConfigDict(dict(
      base_output_directory="runs", local_staging_directory="",
      checkpoint_directory=""))
  config.update(overrides)
  return config


class ResolvePathTest(absltest.TestCase):

  def test_relative_path_resolves_against_the_bazel_run_caller(self):
    env = {"BUILD_WORKING_DIRECTORY": "/home/user/project"}
    self.assertEqual(run_dir.resolve_local_path("out/runs", env),
                     "/home/user/project/out/runs")

  def test_relative_path_without_bazel_uses_cwd(self):
    self.assertEqual(run_dir.resolve_local_path("x", {}), os.path.join(os.getcwd(), "x"))

  def test_absolute_and_home_paths(self):
    env = {"BUILD_WORKING_DIRECTORY": "/elsewhere"}
    self.assertEqual(run_dir.resolve_local_path("/abs/p", env), "/abs/p")
    self.assertEqual(run_dir.resolve_local_path("~/p", env),
                     os.path.join(os.path.expanduser("~"), "p"))


class RunPathsTest(absltest.TestCase):

  def test_local_layout(self):
    paths = run_dir.make_run_paths(_config(), "r1", {"BUILD_WORKING_DIRECTORY": "/w"})
    self.assertEqual(paths.run_dir, "/w/runs/r1")
    self.assertIsNone(paths.remote_url)
    self.assertEqual(paths.checkpoint_dir, "/w/runs/r1/checkpoints")
    self.assertEqual(paths.metrics_jsonl, "/w/runs/r1/metrics.jsonl")
    self.assertEqual(paths.config_json, "/w/runs/r1/config.json")
    self.assertEqual(paths.tensorboard_dir, "/w/runs/r1/tensorboard")

  def test_gs_output_is_staged_locally_and_mirrored(self):
    config = _config(base_output_directory="gs://bucket/prefix/",
                     local_staging_directory="/stage")
    paths = run_dir.make_run_paths(config, "r2", {})
    self.assertEqual(paths.run_dir, "/stage/r2")
    self.assertEqual(paths.remote_url, "gs://bucket/prefix/r2")
    self.assertEqual(paths.checkpoint_dir, "/stage/r2/checkpoints")

  def test_separate_checkpoint_directory(self):
    paths = run_dir.make_run_paths(_config(checkpoint_directory="gs://b/ckpt"), "r", {})
    self.assertEqual(paths.checkpoint_dir, "gs://b/ckpt")

  def test_default_run_name_is_a_utc_timestamp(self):
    when = datetime.datetime(2026, 11, 30, 5, 17, 3, tzinfo=datetime.timezone.utc)
    self.assertEqual(run_dir.default_run_name(when), "run-20261130-051703")


class ConfigJsonTest(absltest.TestCase):

  def test_writes_config_and_provenance(self):
    path = os.path.join(self.create_tempdir().full_path, "config.json")
    run_dir.write_config_json(path, _config(), run_dir.provenance())
    with open(path) as f:
      document = json.load(f)
    self.assertEqual(document["config"]["base_output_directory"], "runs")
    provenance = document["provenance"]
    self.assertRegex(provenance["requirements_lock"], r"^requirements(_tpu|_gpu)?_lock\.txt:sha256:[0-9a-f]{64}$")
    self.assertEqual(provenance["jax_backend"], "cpu")
    self.assertGreaterEqual(provenance["device_count"], 1)
    self.assertIn("git_revision", provenance)
    self.assertFalse(os.path.exists(path + ".tmp"))


if __name__ == "__main__":
  absltest.main()
