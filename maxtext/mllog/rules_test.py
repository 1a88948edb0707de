"""Tests for rules: the submission rules agree with the checker's own files."""

import os
import re

from absl.testing import absltest
from absl.testing import parameterized
import yaml

from maxtext.mllog import rules


def _submission(**overrides):
  values = dict(
      mllog_ruleset="6.1.0",
      submission_org="Example Org",
      submission_platform="cpu-1x",
      submission_division="open",
      submission_status="research",
      submission_benchmark="llama31_8b",
  )
  values.update(overrides)
  return values


def _check_list(path, name):
  """The values the YAML rule for key `name` in `path` accepts."""
  with open(path) as f:
    records = yaml.safe_load(f)
  check = next(r["KEY"]["CHECK"] for r in records
               if r.get("KEY", {}).get("NAME") == name)
  listed = re.search(r"in \[(.*)\]", check).group(1)
  return set(re.findall(r"'([^']+)'", listed))


class RulesTest(parameterized.TestCase):

  def test_rulesets_are_supported_and_installed(self):
    self.assertNotEmpty(rules.rulesets())
    self.assertContainsSubset(rules.rulesets(), rules.SUPPORTED_RULESETS)
    for ruleset in rules.rulesets():
      self.assertTrue(os.path.isdir(rules.ruleset_dir(ruleset)), ruleset)

  def test_divisions_match_the_checker(self):
    for ruleset in rules.rulesets():
      path = os.path.join(rules.ruleset_dir(ruleset), "common.yaml")
      self.assertEqual(set(rules.DIVISIONS),
                       _check_list(path, "submission_division"), path)

  def test_benchmarks_match_the_checker(self):
    for ruleset in rules.rulesets():
      for division in rules.DIVISIONS:
        path = os.path.join(rules.ruleset_dir(ruleset),
                            f"{division}_common.yaml")
        self.assertEqual(set(rules.benchmarks(ruleset)),
                         _check_list(path, "submission_benchmark"), path)

  def test_every_benchmark_has_rule_files(self):
    for ruleset in rules.rulesets():
      for division in rules.DIVISIONS:
        for benchmark in rules.benchmarks(ruleset):
          self.assertTrue(os.path.isfile(os.path.join(
              rules.ruleset_dir(ruleset), f"{division}_{benchmark}.yaml")))

  def test_benchmarks_of_an_unknown_ruleset_raise(self):
    with self.assertRaisesRegex(ValueError, "'1.0.0'"):
      rules.benchmarks("1.0.0")

  def test_every_allowed_combination_validates(self):
    for ruleset in rules.rulesets():
      for division in rules.DIVISIONS:
        for status in rules.STATUSES:
          for benchmark in rules.benchmarks(ruleset):
            rules.validate_submission(_submission(
                mllog_ruleset=ruleset, submission_division=division,
                submission_status=status, submission_benchmark=benchmark))

  @parameterized.named_parameters(
      ("ruleset", "mllog_ruleset", "5.9.0"),
      ("division", "submission_division", "Open"),
      ("status", "submission_status", "onpremise"),
      ("benchmark", "submission_benchmark", "llama3_8b"),
      ("empty_org", "submission_org", ""),
      ("blank_platform", "submission_platform", "  "),
  )
  def test_bad_value_raises_naming_field_and_value(self, field, value):
    with self.assertRaisesRegex(ValueError,
                                f"config.{field}={re.escape(repr(value))}"):
      rules.validate_submission(_submission(**{field: value}))

  def test_benchmark_of_another_ruleset_is_refused(self):
    only_600 = set(rules.benchmarks("6.0.0")) - set(rules.benchmarks("6.1.0"))
    self.assertNotEmpty(only_600)
    with self.assertRaisesRegex(ValueError, "submission_benchmark"):
      rules.validate_submission(_submission(
          mllog_ruleset="6.1.0", submission_benchmark=sorted(only_600)[0]))

  def test_org_of_wrong_type_raises_type_error(self):
    with self.assertRaisesRegex(TypeError, "config.submission_org=3"):
      rules.validate_submission(_submission(submission_org=3))


if __name__ == "__main__":
  absltest.main()
