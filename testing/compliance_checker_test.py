"""Tests for the compliance-checker runner on hand-written logs."""

import json

from absl.testing import absltest

from testing import compliance_checker


def _line(key, value=None, metadata=None, event_type="POINT_IN_TIME"):
  record = {
      "namespace": "",
      "time_ms": 1000,
      "event_type": event_type,
      "key": key,
      "value": value,
      "metadata": metadata or {},
  }
  return ":::MLLOG " + json.dumps(record) + "\n"


class ComplianceCheckerTest(absltest.TestCase):

  def test_incomplete_log_fails_with_named_keys(self):
    log = self.create_tempfile(
        content="".join(
            [
                _line("submission_division", "open"),
                _line("submission_benchmark", "llama31_8b"),
                _line("cache_clear", True),
            ]
        )
    )
    result = compliance_checker.run_checker(log.full_path, ruleset="6.1.0")
    self.assertFalse(result.passed)
    self.assertEqual(result.returncode, 1)
    self.assertContainsSubset(
        {"run_stop", "init_stop", "submission_org"}, result.failed_keys()
    )
    self.assertIn("FAILED", result.output)

  def test_missing_file_raises(self):
    with self.assertRaisesRegex(FileNotFoundError, "nope.log"):
      compliance_checker.run_checker("/nonexistent/nope.log")


if __name__ == "__main__":
  absltest.main()
