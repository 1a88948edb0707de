"""Tests of the header proof: its log, its checker, its verdicts.

The in-process checker is compared with the official command line
(`testing.compliance_checker`, a fresh interpreter) on passing and failing
logs, and the header the pre-flight proves with the one the trainer's MLPerf
listener logs.
"""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from maxtext.config import config_lib
from maxtext.config import optimizer
from maxtext.configs import deepseekv3_671b
from maxtext.configs import default
from maxtext.configs import llama31_8b
from maxtext.mllog import header_proof
from maxtext.mllog import mlperf_config
from maxtext.mllog import rules
from testing import compliance_checker


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


def _with(config, **overrides):
  """A plain copy of `config` with fields replaced."""
  values = config.to_dict()
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def _header(config):
  """The header a fresh run of `config` logs."""
  return header_proof.fresh_run_header(_mlperf(config), "config.py")


def _events(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line.split(" ", 1)[1]) for line in f]


def _deepseek_late():
  """deepseekv3_671b with its first evaluation one step after the rule's."""
  config = deepseekv3_671b.get_config()
  config.first_eval_samples += config.global_batch_size
  return config


class HeaderTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("deepseek", deepseekv3_671b.get_config),
      ("deepseek_17408", lambda: deepseekv3_671b.get_config("17408")),
      ("llama31_8b", llama31_8b.get_config),
      ("default", default.get_config),
      (
          "int_rates_no_end",
          lambda: _with(
              default.get_config(),
              learning_rate=1,
              lr_end_fraction=0,
              lr_schedule_steps=0,
          ),
      ),
      (
          "data_parallel",
          lambda: _with(default.get_config(), data_parallelism=2),
      ),
      (
          "constant",
          lambda: _with(default.get_config(), lr_schedule="constant"),
      ),
  )
  def test_header_states_the_optimizers_schedule(self, make_config):
    # The schedule the optimizer trains with must be the one the header
    # states: the peak after the warm-up, the end rate at the schedule's end.
    config = make_config()
    header = _header(config)
    settings = optimizer.OptimizerConfig.from_config(config)
    facts = optimizer.schedule_facts(settings)
    schedule = optimizer.make_schedule(settings)
    warmup = header["opt_learning_rate_warmup_steps"]
    end = warmup + header["opt_learning_rate_decay_steps"]
    self.assertEqual(warmup, config.warmup_steps)
    self.assertEqual(end, settings.schedule_steps)
    for step, key in (
        (warmup, "opt_base_learning_rate"),
        (end, "opt_end_learning_rate"),
    ):
      # The schedule runs in float32.
      self.assertAlmostEqual(
          float(schedule(step)), header[key], delta=1e-6 * abs(header[key])
      )
    for key, expected in (
        ("opt_base_learning_rate", facts.learning_rate),
        ("opt_end_learning_rate", facts.end_learning_rate),
        ("opt_learning_rate_decay_schedule", facts.decay_schedule),
        ("opt_adamw_beta_1", config.adam_b1),
        ("opt_adamw_beta_2", config.adam_b2),
        ("opt_adamw_epsilon", config.adam_eps),
        ("opt_adamw_weight_decay", config.weight_decay),
        ("opt_gradient_clip_norm", config.grad_clip_norm),
    ):
      with self.subTest(key=key):
        self.assertEqual(header[key], expected)


class EvalPointsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("interval", dict(eval_interval=5, steps=100), (5, 10)),
      (
          "first_samples",
          dict(eval_interval=5, steps=100, first_eval_samples=3 * 16),
          (3, 8),
      ),
      ("second_is_the_budget", dict(eval_interval=5, steps=7), (5, 7)),
      ("first_is_the_budget", dict(eval_interval=10, steps=10), (10,)),
      ("past_the_budget", dict(eval_interval=50, steps=10), (10,)),
  )
  def test_points_are_the_schedules(self, overrides, points):
    config = _with(
        default.get_config(), global_batch_size=16, warmup_steps=1, **overrides
    )
    config_lib.validate(config)
    self.assertEqual(header_proof.eval_points(_mlperf(config)), points)

  def test_deepseek_first_point_is_the_rules(self):
    config = deepseekv3_671b.get_config()
    first = header_proof.eval_points(_mlperf(config))[0]
    self.assertEqual(
        first * config.global_batch_size, config.first_eval_samples
    )


class WriteLogTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.out = self.create_tempdir().full_path

  def test_only_run_events_are_synthetic(self):
    config = deepseekv3_671b.get_config()
    path = header_proof.write_log(
        _mlperf(config), os.path.join(self.out, "mllog.log"), _header(config)
    )
    events = _events(path)
    synthetic = {e["key"] for e in events if e["metadata"].get("synthetic")}
    self.assertEqual(
        synthetic,
        {
            "run_start",
            "block_start",
            "block_stop",
            "eval_start",
            "eval_accuracy",
            "eval_stop",
            "run_stop",
        },
    )
    self.assertLessEqual(synthetic, header_proof.RUN_KEYS)
    # The header: every hyperparameter, once, with the trainer's value.
    header = _header(config)
    logged = {e["key"]: e["value"] for e in events}
    self.assertEqual({k: logged[k] for k in header}, header)
    # Two evaluations where the schedule puts them; the last at the target.
    accuracy = [e for e in events if e["key"] == "eval_accuracy"]
    self.assertEqual(
        [e["metadata"]["samples_count"] for e in accuracy],
        [
            p * config.global_batch_size
            for p in header_proof.eval_points(_mlperf(config))
        ],
    )
    self.assertEqual(accuracy[-1]["value"], config.target_eval_loss)
    self.assertGreater(accuracy[0]["value"], config.target_eval_loss)

  def test_log_without_the_mllog_is_refused(self):
    config = _with(deepseekv3_671b.get_config(), enable_mllog=False)
    with self.assertRaisesRegex(ValueError, "config.enable_mllog=False"):
      header_proof.write_log(
          _mlperf(config), os.path.join(self.out, "x.log"), _header(config)
      )


class CheckerTest(parameterized.TestCase):
  """The in-process checker says what the official command line says."""

  def setUp(self):
    super().setUp()
    self.out = self.create_tempdir().full_path

  @parameterized.named_parameters(
      ("deepseek_6_1_0", deepseekv3_671b.get_config, "6.1.0"),
      ("deepseek_late_6_1_0", _deepseek_late, "6.1.0"),
      ("deepseek_late_6_0_0", _deepseek_late, "6.0.0"),
      (
          "deepseek_lr_17408",
          lambda: _with(
              deepseekv3_671b.get_config("17408"), learning_rate=2.4e-5
          ),
          "6.1.0",
      ),
      (
          "llama_decay",
          lambda: _with(llama31_8b.get_config(), lr_schedule_steps=1_300_000),
          "6.1.0",
      ),
      ("default_open", default.get_config, "6.1.0"),
  )
  def test_verdict_matches_the_command_line(self, make_config, ruleset):
    config = _with(make_config(), mllog_ruleset=ruleset)
    path = header_proof.write_log(
        _mlperf(config), os.path.join(self.out, "mllog.log"), _header(config)
    )
    ours = header_proof.check_log(path, ruleset)
    official = compliance_checker.run_checker(path, ruleset=ruleset)
    self.assertEqual(ours.passed, official.passed, official.output)
    self.assertEqual(ours.failed_keys(), official.failed_keys())
    self.assertEqual(ours, header_proof.prove(_mlperf(config), _header(config)))

  def test_a_line_that_does_not_parse_is_a_failure(self):
    config = llama31_8b.get_config()
    path = header_proof.write_log(
        _mlperf(config), os.path.join(self.out, "mllog.log"), _header(config)
    )
    with open(path, "a", encoding="utf-8") as f:
      f.write(":::MLLOG {not json\n")
    verdict = header_proof.check_log(path, "6.1.0")
    self.assertFalse(verdict.passed)
    self.assertIn("", {f.key for f in verdict.failures})
    self.assertEqual(verdict.config_failures(), ())

  def test_a_broken_run_sequence_is_no_config_failure(self):
    config = llama31_8b.get_config()
    path = header_proof.write_log(
        _mlperf(config), os.path.join(self.out, "mllog.log"), _header(config)
    )
    with open(path, encoding="utf-8") as f:
      lines = [l for l in f if '"key": "run_stop"' not in l]
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(lines)
    verdict = header_proof.check_log(path, "6.1.0")
    self.assertIn("run_stop", verdict.failed_keys())
    self.assertEqual(verdict.config_failures(), ())
    self.assertEqual(
        {f.key for f in verdict.run_failures()}, {"run_stop"}, verdict
    )

  def test_missing_log_is_refused(self):
    with self.assertRaisesRegex(FileNotFoundError, "nowhere.log"):
      header_proof.check_log(os.path.join(self.out, "nowhere.log"), "6.1.0")


class ProveTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (f"{b}_{r.replace('.', '_')}", b, r)
      for b in ("llama31_8b", "deepseekv3_671b")
      for r in rules.rulesets()
  )
  def test_shipped_configs_pass(self, benchmark, ruleset):
    module = {"llama31_8b": llama31_8b, "deepseekv3_671b": deepseekv3_671b}
    config = _with(module[benchmark].get_config(), mllog_ruleset=ruleset)
    verdict = header_proof.prove(_mlperf(config), _header(config))
    self.assertTrue(verdict.passed, verdict)

  def test_a_proof_logs_nothing(self):
    # A pre-flight at every run start: neither the checker's progress lines
    # nor the logger's path of the throw-away log may reach the run's log.
    config = _with(default.get_config(), steps=12345)  # Not in the cache.
    with self.assertNoLogs(level="INFO"):
      verdict = header_proof.prove(_mlperf(config), _header(config))
    self.assertTrue(verdict.passed, verdict)

  def test_first_evaluation_late_is_named(self):
    config = _deepseek_late()
    verdict = header_proof.prove(_mlperf(config), _header(config))
    failures = verdict.config_failures()
    self.assertEqual([f.key for f in failures], ["eval_accuracy"])
    self.assertEqual(verdict.run_failures(), ())
    self.assertRegex(
        header_proof.describe(failures[0], _mlperf(config)),
        r"^eval_accuracy: the first evaluation, after 44 steps "
        r"\(config.first_eval_samples=720896, eval_interval=1, "
        r"global_batch_size=16384\), at samples_count=720896 fails "
        r"`int\(v\['metadata'\]\['samples_count'\]\) == ",
    )

  def test_formula_off_is_named_with_its_value_and_source(self):
    config = _with(deepseekv3_671b.get_config("17408"), learning_rate=2.4e-5)
    (failure,) = header_proof.prove(_mlperf(config), _header(config)).failures
    self.assertEqual(failure.key, "opt_base_learning_rate")
    self.assertRegex(
        header_proof.describe(failure, _mlperf(config), "config.learning_rate"),
        r"^opt_base_learning_rate=2\.4e-05 \(config\.learning_rate\) fails "
        r"`abs\(v\['value'\] - ",
    )

  @parameterized.named_parameters(("above", 3.7), ("none", 0.0))
  def test_target_the_rule_does_not_accept_is_named(self, target):
    config = _with(deepseekv3_671b.get_config(), target_eval_loss=target)
    (failure,) = header_proof.prove(_mlperf(config), _header(config)).failures
    self.assertEqual(failure.key, "eval_accuracy")
    self.assertTrue(failure.concerns_config)
    self.assertRegex(
        header_proof.describe(failure, _mlperf(config)),
        rf"^eval_accuracy: the run stops at config\.target_eval_loss="
        rf"{target!r}, and no evaluation passes `",
    )

  def test_rule_keys_are_the_checkers(self):
    keys = header_proof.rule_keys("6.1.0", "closed", "deepseekv3_671b")
    self.assertContainsSubset(
        {"submission_org", "init_stop", "eval_accuracy", "moe_aux_loss_coeff"},
        keys,
    )
    self.assertNotIn(
        "moe_aux_loss_coeff",
        header_proof.rule_keys("6.1.0", "closed", "llama31_8b"),
    )


if __name__ == "__main__":
  absltest.main()
