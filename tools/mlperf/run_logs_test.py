"""Tests of reading a run directory's MLPerf log and config.json."""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized

from tools.mlperf import run_logs

_SUBMISSION = {
    "submission_org": "acme",
    "submission_platform": "box",
    "submission_division": "open",
    "submission_status": "onprem",
    "submission_benchmark": "llama31_8b",
}


def _line(key, value, metadata=None):
  return (
      ":::MLLOG "
      + json.dumps(
          {
              "namespace": "",
              "time_ms": 1,
              "event_type": "POINT_IN_TIME",
              "key": key,
              "value": value,
              "metadata": metadata or {},
          }
      )
      + "\n"
  )


def write_run_dir(
    path,
    *,
    submission=None,
    seed=7,
    mllog_file="",
    log_name="mllog.log",
    config_json=True,
    revision=None,
):
  """A run directory as maxtext.run.trainer writes one (config.json, log and
  metrics.jsonl, empty: the log records no step)."""
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "metrics.jsonl"), "w", encoding="utf-8"):
    pass
  if config_json:
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
      json.dump(
          {
              "config": {"mllog_ruleset": "6.1.0", "mllog_file": mllog_file},
              "provenance": {
                  "jax_version": "9.9",
                  "device_count": 1,
                  **({"git_revision": revision} if revision else {}),
              },
          },
          f,
      )
  log = mllog_file or os.path.join(path, log_name)
  with open(log, "w", encoding="utf-8") as f:
    f.write("unrelated line\n")
    for key, value in (
        submission if submission is not None else _SUBMISSION
    ).items():
      named = revision if key == "submission_platform" else None
      f.write(_line(key, value, named and {"git_revision": named}))
    f.write(_line("seed", seed))
  return path


class ReadRunTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path

  def test_reads_submission_fields_seed_and_provenance(self):
    run = run_logs.read_run(write_run_dir(os.path.join(self.tmp, "r")))
    self.assertEqual(
        (run.org, run.system, run.division, run.status, run.benchmark),
        ("acme", "box", "open", "onprem", "llama31_8b"),
    )
    self.assertEqual(run.ruleset, "6.1.0")
    self.assertEqual(run.seed, 7)
    self.assertEqual(run.provenance["jax_version"], "9.9")
    self.assertEqual(run.log_path, os.path.join(self.tmp, "r", "mllog.log"))

  def test_reads_the_revision_of_config_json_and_of_the_log(self):
    run = run_logs.read_run(
        write_run_dir(os.path.join(self.tmp, "r"), revision="c" * 40)
    )
    self.assertEqual(run.git_revision, "c" * 40)
    self.assertEqual(run.log_revision, "c" * 40)

  def test_a_run_recording_no_revision_is_unknown(self):
    run = run_logs.read_run(write_run_dir(os.path.join(self.tmp, "r")))
    self.assertEqual(run.git_revision, "unknown")
    self.assertIsNone(run.log_revision)

  def test_reads_the_log_the_config_names(self):
    log = os.path.join(self.tmp, "elsewhere.log")
    run = run_logs.read_run(
        write_run_dir(os.path.join(self.tmp, "r"), mllog_file=log)
    )
    self.assertEqual(run.log_path, log)

  def test_log_without_the_runs_metrics_is_refused(self):
    run_dir = write_run_dir(os.path.join(self.tmp, "run"))
    os.remove(os.path.join(run_dir, "metrics.jsonl"))
    with self.assertRaisesRegex(
        run_logs.RunDirError, r"metrics\.jsonl is missing: the MLPerf log"
    ):
      run_logs.read_run(run_dir)

  def test_missing_directory(self):
    with self.assertRaisesRegex(run_logs.RunDirError, "does not exist"):
      run_logs.read_run(os.path.join(self.tmp, "nope"))

  def test_no_config_json(self):
    path = write_run_dir(os.path.join(self.tmp, "r"), config_json=False)
    with self.assertRaisesRegex(run_logs.RunDirError, "no config.json"):
      run_logs.read_run(path)

  def test_no_log(self):
    path = write_run_dir(os.path.join(self.tmp, "r"), log_name="other.log")
    with self.assertRaisesRegex(
        run_logs.RunDirError, "no MLPerf log.*enable_mllog"
    ):
      run_logs.read_run(path)

  def test_resumed_run_is_refused(self):
    path = write_run_dir(os.path.join(self.tmp, "r"))
    write_run_dir(path, log_name="mllog.2.log")
    with self.assertRaisesRegex(
        run_logs.RunDirError, "resumed.*one uninterrupted run"
    ):
      run_logs.read_run(path)

  def test_missing_submission_key(self):
    fields = dict(_SUBMISSION)
    del fields["submission_division"]
    path = write_run_dir(os.path.join(self.tmp, "r"), submission=fields)
    with self.assertRaisesRegex(run_logs.RunDirError, "no submission_division"):
      run_logs.read_run(path)

  def test_bad_json_line(self):
    path = write_run_dir(os.path.join(self.tmp, "r"))
    with open(os.path.join(path, "mllog.log"), "a", encoding="utf-8") as f:
      f.write(":::MLLOG {not json\n")
    with self.assertRaisesRegex(run_logs.RunDirError, "not an MLLOG line"):
      run_logs.read_run(path)


if __name__ == "__main__":
  absltest.main()
