"""Tests for run directory paths and config.json."""

import datetime
import json
import os

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.configs import base
from maxtext.storage import run_dir


def _config(**overrides) -> run_dir.RunDirConfig:
  return run_dir.RunDirConfig(
      **dict(dict(base_output_directory="runs"), **overrides)
  )


class RunDirConfigTest(absltest.TestCase):

  def test_from_config_takes_the_configs_fields(self):
    config = base.get_config()
    config.update(dict(base_output_directory="/o", dataset_type="megatron"))
    settings = run_dir.RunDirConfig.from_config(config)
    self.assertEqual(
        (settings.base_output_directory, settings.dataset_type),
        ("/o", "megatron"),
    )


class RunPathsTest(absltest.TestCase):

  def test_local_layout(self):
    paths = run_dir.make_run_paths(
        _config(), "r1", {"BUILD_WORKING_DIRECTORY": "/w"}
    )
    self.assertEqual(paths.run_dir, "/w/runs/r1")
    self.assertIsNone(paths.remote_url)
    self.assertEqual(paths.checkpoint_dir, "/w/runs/r1/checkpoints")
    self.assertEqual(paths.metrics_jsonl, "/w/runs/r1/metrics.jsonl")
    self.assertEqual(paths.config_json, "/w/runs/r1/config.json")
    self.assertEqual(paths.tensorboard_dir, "/w/runs/r1/tensorboard")

  def test_gs_output_is_staged_locally_and_mirrored(self):
    config = _config(
        base_output_directory="gs://bucket/prefix/",
        local_staging_directory="/stage",
    )
    paths = run_dir.make_run_paths(config, "r2", {})
    self.assertEqual(paths.run_dir, "/stage/r2")
    self.assertEqual(paths.remote_url, "gs://bucket/prefix/r2")
    self.assertEqual(paths.checkpoint_dir, "/stage/r2/checkpoints")

  def test_separate_checkpoint_directory(self):
    paths = run_dir.make_run_paths(
        _config(checkpoint_directory="gs://b/ckpt"), "r", {}
    )
    self.assertEqual(paths.checkpoint_dir, "gs://b/ckpt")


class DefaultRunNameTest(parameterized.TestCase):

  def test_utc_microseconds_and_given_suffix(self):
    when = datetime.datetime(
        2026, 11, 30, 5, 17, 3, 123456, tzinfo=datetime.timezone.utc
    )
    self.assertEqual(
        run_dir.default_run_name(when, suffix="a1b2"),
        "run-20261130-051703-123456-a1b2",
    )

  def test_other_time_zones_are_converted_to_utc(self):
    tz = datetime.timezone(datetime.timedelta(hours=2))
    when = datetime.datetime(2026, 12, 1, 1, 0, 0, 5, tzinfo=tz)
    self.assertEqual(
        run_dir.default_run_name(when, suffix="z9"),
        "run-20261130-230000-000005-z9",
    )

  def test_same_time_gives_different_names(self):
    # The trainer's single-process path passes neither argument; two runs in
    # the same second (here: the same microsecond) must still differ.
    when = datetime.datetime(
        2026, 11, 30, 5, 17, 3, tzinfo=datetime.timezone.utc
    )
    names = {run_dir.default_run_name(when) for _ in range(50)}
    self.assertGreater(len(names), 40)
    names.update(run_dir.default_run_name() for _ in range(50))
    self.assertGreater(len(names), 90)

  def test_name_is_a_plain_directory_name(self):
    name = run_dir.default_run_name()
    self.assertRegex(name, r"^run-\d{8}-\d{6}-\d{6}-[0-9a-f]{4}$")
    self.assertEqual(os.path.basename(name), name)

  @parameterized.named_parameters(
      ("empty", "", ValueError),
      ("slash", "a/b", ValueError),
      ("upper_case", "AB", ValueError),
      ("too_long", "a" * 17, ValueError),
      ("not_a_str", 12, TypeError),
  )
  def test_bad_suffix_is_refused(self, suffix, error):
    with self.assertRaisesRegex(error, "suffix"):
      run_dir.default_run_name(suffix=suffix)

  def test_bad_time_is_refused(self):
    with self.assertRaisesRegex(TypeError, "now"):
      run_dir.default_run_name(now=1234.5)


class ConfigJsonTest(absltest.TestCase):

  def test_writes_config_and_provenance(self):
    path = os.path.join(self.create_tempdir().full_path, "config.json")
    run_dir.write_config_json(
        path, {"base_output_directory": "runs"}, run_dir.provenance()
    )
    with open(path, encoding="utf-8") as f:
      document = json.load(f)
    self.assertEqual(document["config"]["base_output_directory"], "runs")
    provenance = document["provenance"]
    self.assertRegex(
        provenance["requirements_lock"],
        r"^requirements(_tpu|_gpu)?_lock\.txt:sha256:[0-9a-f]{64}$",
    )
    self.assertEqual(provenance["jax_backend"], "cpu")
    self.assertGreaterEqual(provenance["device_count"], 1)
    self.assertIn("git_revision", provenance)
    self.assertFalse(os.path.exists(path + ".tmp"))

  def test_unwritable_value_writes_nothing(self):
    path = os.path.join(self.create_tempdir().full_path, "config.json")
    with self.assertRaisesRegex(TypeError, "object"):
      run_dir.write_config_json(path, {"seed": object()}, {})
    self.assertEqual(os.listdir(os.path.dirname(path)), [])


class InputPathsTest(absltest.TestCase):

  def test_relative_inputs_resolve_against_the_callers_directory(self):
    settings = _config(
        train_data_path="data/train.npy",
        tokenizer_path="tok",
        load_parameters_path="gs://bucket/ckpt",
        compiled_step_file="step.pickle",
    )
    self.assertEqual(
        run_dir.resolved_input_paths(
            settings, {"BUILD_WORKING_DIRECTORY": "/caller"}
        ),
        {
            "train_data_path": "/caller/data/train.npy",
            "tokenizer_path": "/caller/tok",
            "compiled_step_file": "/caller/step.pickle",
        },
    )

  def test_absolute_inputs_resolve_to_nothing(self):
    settings = _config(
        train_data_path="/d/t.npy", compiled_step_file="/s.pickle"
    )
    self.assertEqual(run_dir.resolved_input_paths(settings, {}), {})


if __name__ == "__main__":
  absltest.main()
