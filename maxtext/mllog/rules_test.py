"""Tests for rules: the submission rules agree with the checker's own files."""

import os
import re

from absl.testing import absltest
from absl.testing import parameterized
import mlperf_logging
from mlperf_logging.rcp_checker import rcp_checker
import yaml

from testing import bad_submissions
from maxtext.mllog import mlperf_config
from maxtext.mllog import rules


def _submission(**overrides):
  """Valid submission fields, with `overrides` replacing some."""
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


def _mlperf(values):
  """`values` (fields by name) as the log's settings."""
  return mlperf_config.MlperfConfig.from_config(values)


def _validate(values):
  rules.validate_submission(_mlperf(values))


def _mismatches(values):
  return rules.reference_mismatches(_mlperf(values))


def _check_reference(values):
  rules.check_reference_hyperparameters(_mlperf(values))


def _check_list(path, name):
  """The values the YAML rule for key `name` in `path` accepts."""
  with open(path, encoding="utf-8") as f:
    records = yaml.safe_load(f)
  check = next(
      r["KEY"]["CHECK"] for r in records if r.get("KEY", {}).get("NAME") == name
  )
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
      self.assertEqual(
          set(rules.DIVISIONS), _check_list(path, "submission_division"), path
      )

  def test_benchmarks_match_the_checker(self):
    for ruleset in rules.rulesets():
      for division in rules.DIVISIONS:
        path = os.path.join(
            rules.ruleset_dir(ruleset), f"{division}_common.yaml"
        )
        self.assertEqual(
            set(rules.benchmarks(ruleset)),
            _check_list(path, "submission_benchmark"),
            path,
        )

  def test_every_benchmark_has_rule_files(self):
    for ruleset in rules.rulesets():
      for division in rules.DIVISIONS:
        for benchmark in rules.benchmarks(ruleset):
          self.assertTrue(
              os.path.isfile(
                  os.path.join(
                      rules.ruleset_dir(ruleset), f"{division}_{benchmark}.yaml"
                  )
              )
          )

  def test_benchmarks_of_an_unknown_ruleset_raise(self):
    with self.assertRaisesRegex(ValueError, "'1.0.0'"):
      rules.benchmarks("1.0.0")

  def test_every_allowed_combination_validates(self):
    for ruleset in rules.rulesets():
      for division in rules.DIVISIONS:
        for status in rules.STATUSES:
          for benchmark in rules.benchmarks(ruleset):
            _validate(
                _submission(
                    mllog_ruleset=ruleset,
                    submission_division=division,
                    submission_status=status,
                    submission_benchmark=benchmark,
                )
            )

  @parameterized.named_parameters(*bad_submissions.CASES)
  def test_bad_value_raises_naming_field_and_value(self, field, value):
    with self.assertRaisesRegex(
        ValueError, f"config.{field}={re.escape(repr(value))}"
    ):
      _validate(_submission(**{field: value}))

  def test_benchmark_of_another_ruleset_is_refused(self):
    only_600 = set(rules.benchmarks("6.0.0")) - set(rules.benchmarks("6.1.0"))
    self.assertNotEmpty(only_600)
    with self.assertRaisesRegex(ValueError, "submission_benchmark"):
      _validate(
          _submission(
              mllog_ruleset="6.1.0", submission_benchmark=sorted(only_600)[0]
          )
      )

  def test_org_of_wrong_type_raises_type_error(self):
    with self.assertRaisesRegex(TypeError, "config.submission_org=3"):
      _validate(_submission(submission_org=3))


def _run_config(**overrides):
  """The fields the RCP pre-flight reads: closed llama31_8b at batch 32."""
  values = _submission(
      submission_division="closed",
      global_batch_size=32,
      learning_rate=8e-4,
      warmup_steps=128,
  )
  values.update(overrides)
  return values


def _at_point(point, **overrides):
  """A closed config with `point`'s batch, learning rate and warm-up."""
  stated = point.hyperparameters
  values = _run_config(
      global_batch_size=point.batch_size,
      learning_rate=stated["opt_base_learning_rate"],
      warmup_steps=round(
          stated["opt_learning_rate_warmup_samples"] / point.batch_size
      ),
  )
  values.update(overrides)
  return values


_LLAMA_POINTS = rules.reference_points("6.1.0", "llama31_8b")


class ReferencePointsTest(parameterized.TestCase):

  def test_data_is_the_installed_packages_not_a_copy(self):
    path = rules.rcp_file("6.1.0", "llama31_8b")
    package = os.path.dirname(os.path.abspath(mlperf_logging.__file__))
    self.assertTrue(os.path.abspath(path).startswith(package + os.sep), path)
    self.assertTrue(os.path.isfile(path), path)

  def test_every_benchmark_has_reference_points(self):
    for ruleset in rules.rulesets():
      for benchmark in rules.benchmarks(ruleset):
        with self.subTest(ruleset=ruleset, benchmark=benchmark):
          self.assertNotEmpty(rules.reference_points(ruleset, benchmark))

  def test_points_are_those_the_rcp_checker_reads(self):
    for ruleset in rules.rulesets():
      checker = rcp_checker.RCP_Checker(
          "training", ruleset, "llama31_8b", verbose=False
      )
      official = {
          name: (record["BS"], record["Hyperparams"])
          for name, record in checker.rcp_data.items()
      }
      ours = {
          p.name: (p.batch_size, dict(p.hyperparameters))
          for p in rules.reference_points(ruleset, "llama31_8b")
      }
      self.assertEqual(official, ours)
      self.assertEqual(
          [p.batch_size for p in rules.reference_points(ruleset, "llama31_8b")],
          sorted(bs for bs, _ in official.values()),
      )

  @parameterized.named_parameters(
      (f"bs{p.batch_size}", p) for p in _LLAMA_POINTS
  )
  def test_closed_config_at_a_reference_point_passes(self, point):
    config = _at_point(point, gradient_accumulation_steps=1)
    self.assertEqual(_mismatches(config), [])
    _check_reference(config)

  def test_reference_batch_32_is_what_llama31_8b_states(self):
    point = next(p for p in _LLAMA_POINTS if p.batch_size == 32)
    self.assertEqual(point.hyperparameters["opt_base_learning_rate"], 8e-4)
    self.assertEqual(
        point.hyperparameters["opt_learning_rate_warmup_samples"], 128 * 32
    )

  def test_batch_between_reference_points_passes(self):
    low, high = _LLAMA_POINTS[0].batch_size, _LLAMA_POINTS[1].batch_size
    self.assertGreater(high - low, 1)
    _check_reference(_run_config(global_batch_size=low + 1, learning_rate=1.0))

  @parameterized.named_parameters(("below", -1), ("above", +1))
  def test_batch_outside_the_range_is_refused_in_closed(self, side):
    low, high = _LLAMA_POINTS[0].batch_size, _LLAMA_POINTS[-1].batch_size
    batch = low - 1 if side < 0 else high + 1
    pattern = (
        f"config.global_batch_size={batch} is outside .* "
        f"\\[{low}, {high}\\].*"
        f"{re.escape(rules.rcp_file('6.1.0', 'llama31_8b'))}"
    )
    with self.assertRaisesRegex(ValueError, pattern):
      _check_reference(_run_config(global_batch_size=batch))

  def test_batch_outside_the_range_is_a_warning_in_open(self):
    config = _run_config(submission_division="open", global_batch_size=8)
    with self.assertLogs(level="WARNING") as logs:
      _check_reference(config)
    self.assertLen(logs.records, 1)
    self.assertIn("config.global_batch_size=8", logs.output[0])
    self.assertIn("rcps_llama31_8b.json", logs.output[0])

  def test_learning_rate_off_the_reference_is_refused_in_closed(self):
    with self.assertRaisesRegex(
        ValueError,
        r"config.learning_rate=0.001 differs from the reference "
        r"opt_base_learning_rate=0.0008 at global_batch_size=32 "
        r"\(llama31_8b_ref_32 in .*rcps_llama31_8b.json\)",
    ):
      _check_reference(_run_config(learning_rate=1e-3))

  def test_learning_rate_off_the_reference_is_a_warning_in_open(self):
    with self.assertLogs(level="WARNING") as logs:
      _check_reference(
          _run_config(submission_division="open", learning_rate=1e-3)
      )
    self.assertLen(logs.records, 1)
    self.assertIn("config.learning_rate=0.001", logs.output[0])

  def test_warmup_off_the_reference_is_refused_in_closed(self):
    with self.assertRaisesRegex(
        ValueError,
        r"config.warmup_steps=100 is 3200 warm-up samples .*"
        r"opt_learning_rate_warmup_samples is 4096 \(warmup_steps=128\)",
    ):
      _check_reference(_run_config(warmup_steps=100))

  def test_warmup_not_a_multiple_of_the_batch_takes_either_whole_step(self):
    point = next(
        p
        for p in _LLAMA_POINTS
        if p.hyperparameters["opt_learning_rate_warmup_samples"] % p.batch_size
    )
    samples = point.hyperparameters["opt_learning_rate_warmup_samples"]
    below = samples // point.batch_size
    for steps, ok in (
        (below - 1, False),
        (below, True),
        (below + 1, True),
        (below + 2, False),
    ):
      with self.subTest(warmup_steps=steps):
        problems = _mismatches(_at_point(point) | {"warmup_steps": steps})
        self.assertEqual(not problems, ok, problems)

  def test_all_mismatches_are_named_at_once(self):
    with self.assertRaises(ValueError) as raised:
      _check_reference(_run_config(learning_rate=1e-3, warmup_steps=1))
    self.assertIn("config.learning_rate", str(raised.exception))
    self.assertIn("config.warmup_steps", str(raised.exception))

  def test_benchmark_without_rcp_data_is_named(self):
    with self.assertRaisesRegex(
        ValueError, "no reference convergence points for no_such_benchmark"
    ):
      _check_reference(_run_config(submission_benchmark="no_such_benchmark"))


if __name__ == "__main__":
  absltest.main()
