"""Tests of the refusals that need no training: run facts and counts.

The packaging itself, and the compliance refusal on real logs, are tested end
to end in package_test.
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
from mlperf_logging import benchmark_meta

from tools.mlperf import run_logs
from tools.mlperf import submission

_COUNT = benchmark_meta.get_result_file_counts("training")["llama31_8b"]


def fake_run(i, **fields):
  """A RunLog as read_run returns it, for run `i`."""
  values = dict(
      run_dir=f"/runs/run_{i}",
      log_path=f"/runs/run_{i}/mllog.log",
      org="acme",
      system="box",
      division="open",
      status="onprem",
      benchmark="llama31_8b",
      ruleset="6.1.0",
      seed=i,
      config={},
      provenance={},
  )
  values.update(fields)
  return run_logs.RunLog(**values)


def runs(count=_COUNT):
  return [fake_run(i) for i in range(count)]


class RequiredRunsTest(parameterized.TestCase):

  def test_counts_come_from_benchmark_meta(self):
    self.assertEqual(submission.required_runs("llama31_8b"), _COUNT)
    self.assertEqual(
        submission.required_runs("llama31_405b"),
        benchmark_meta.get_result_file_counts("training")["llama31_405b"],
    )

  def test_unknown_benchmark(self):
    with self.assertRaisesRegex(
        submission.PackageError, "'gpt9' is not an MLPerf training"
    ):
      submission.required_runs("gpt9")

  @parameterized.named_parameters(("too_few", -1), ("too_many", 1))
  def test_wrong_count(self, delta):
    with self.assertRaisesRegex(
        submission.PackageError,
        f"wrong number of runs for llama31_8b: got {_COUNT + delta}, the "
        f"benchmark needs exactly {_COUNT}",
    ):
      submission.check_run_count("llama31_8b", _COUNT + delta)


class CheckConsistentTest(parameterized.TestCase):

  def test_consistent_runs_pass(self):
    submission.check_consistent(runs())

  def test_no_runs(self):
    with self.assertRaisesRegex(submission.PackageError, "no runs"):
      submission.check_consistent([])

  def test_run_given_twice(self):
    given = runs()
    given[-1] = given[0]
    with self.assertRaisesRegex(submission.PackageError, "given twice"):
      submission.check_consistent(given)

  def test_mixed_divisions(self):
    given = runs()
    given[3] = dataclasses.replace(given[3], division="closed")
    with self.assertRaisesRegex(
        submission.PackageError,
        r"mixed divisions \['closed', 'open'\].*/runs/run_3",
    ):
      submission.check_consistent(given)

  @parameterized.named_parameters(
      ("org", "org", "submission_org"),
      ("system", "system", "submission_platform"),
      ("benchmark", "benchmark", "submission_benchmark"),
      ("status", "status", "submission_status"),
      ("ruleset", "ruleset", "mllog_ruleset"),
  )
  def test_differing_field(self, field, key):
    given = runs()
    given[1] = dataclasses.replace(given[1], **{field: "other"})
    with self.assertRaisesRegex(submission.PackageError, f"differ in {key}"):
      submission.check_consistent(given)

  def test_wrong_count(self):
    with self.assertRaisesRegex(
        submission.PackageError, "wrong number of runs"
    ):
      submission.check_consistent(runs(_COUNT - 1))

  def test_unknown_ruleset(self):
    given = [dataclasses.replace(r, ruleset="1.0.0") for r in runs()]
    with self.assertRaisesRegex(
        submission.PackageError, "mllog_ruleset='1.0.0'"
    ):
      submission.check_consistent(given)

  def test_org_with_a_slash(self):
    given = [dataclasses.replace(r, org="a/b") for r in runs()]
    with self.assertRaisesRegex(ValueError, "org='a/b'"):
      submission.check_consistent(given)


if __name__ == "__main__":
  absltest.main()
