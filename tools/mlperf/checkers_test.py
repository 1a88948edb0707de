"""The official tools' verdicts, read from their own output, on a real run."""

import os
import shutil
import tempfile

from absl.testing import absltest

from testing import mlperf_runs
from tools.mlperf import checkers
from tools.mlperf import layout
from tools.mlperf import run_logs
from tools.mlperf import system_desc


class CheckersTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    # make_runs returns `count` dirs; pylint sees only the empty list it fills.
    # pylint: disable-next=unbalanced-tuple-unpacking
    (run_dir,) = mlperf_runs.make_runs(os.path.join(cls.tmp, "runs"), 1)
    cls.run_dir = run_dir
    cls.log = os.path.join(run_dir, "mllog.log")
    # A package of one result: the checker wants llama31_8b's full count.
    cls.out = os.path.join(cls.tmp, "out")
    layout.write_results(cls.out, "acme", "box", "llama31_8b", [cls.log])
    layout.write_system_json(
        layout.system_json(cls.out, "acme", "box"),
        system_desc.describe(
            org="acme",
            system="box",
            division="open",
            log_status="onprem",
            provenance={
                "jax_backend": "cpu",
                "device_count": 1,
                "process_count": 1,
            },
            host={},
        ),
    )

  def setUp(self):
    super().setUp()
    self.work = self.create_tempdir().full_path

  def test_compliance_passes_a_real_log(self):
    result = checkers.compliance(self.log, "6.1.0", self.work)
    self.assertTrue(result.ok, result.output)
    self.assertEqual(result.returncode, 0)

  def test_the_log_names_the_revision_config_json_records(self):
    # The log above passes the checker with the revision in it; here is the
    # revision itself.
    run = run_logs.read_run(self.run_dir)
    self.assertRegex(run.git_revision, r"^([0-9a-f]{40}(\+dirty)?|unknown)$")
    self.assertEqual(run.log_revision, run.git_revision)
    self.assertIn("git_revision_source", run.provenance)

  def test_compliance_fails_a_log_without_run_stop(self):
    broken = os.path.join(self.work, "broken.log")
    shutil.copyfile(self.log, broken)
    mlperf_runs.edit_log(broken, drop_key="run_stop")
    result = checkers.compliance(broken, "6.1.0", self.work)
    self.assertFalse(result.ok, result.output)
    self.assertIn("run_stop", result.problems())

  def test_package_checker_judged_by_its_line_not_its_status(self):
    result = checkers.package_checker(
        layout.org_dir(self.out, "acme"), "6.1.0", self.work
    )
    self.assertFalse(result.ok, result.output)
    # The checker exits 0 although it found errors.
    self.assertEqual(result.returncode, 0)
    self.assertIn("found 1, expected 10", result.output)
    self.assertIn("Incorrect number of files", result.problems())

  def test_rcp_checker_fails_a_batch_size_without_reference(self):
    result = checkers.rcp_checker(
        layout.results_dir(self.out, "acme", "box", "llama31_8b"),
        "6.1.0",
        self.work,
    )
    self.assertFalse(result.ok, result.output)
    self.assertNotEqual(result.returncode, 0)

  def test_summarizer_gives_no_score_for_a_single_run(self):
    # The olympic average drops the best and the worst of the runs.
    summary = checkers.summarize(
        layout.org_dir(self.out, "acme"), "6.1.0", "llama31_8b", self.work
    )
    self.assertTrue(summary.tool.ok, summary.tool.output)
    self.assertIsNone(summary.score_minutes)
    self.assertLen(summary.rows, 1)
    self.assertEqual(summary.rows[0]["submitter"], "acme")


if __name__ == "__main__":
  absltest.main()
