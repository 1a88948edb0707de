"""The deepseekv3_671b config's MLPerf header events against the closed rules.

No machine here trains DeepSeek-V3, so the test writes the config's real
header (submission info and the hyperparameters the run's MLPerf listener
builds from the config and its real schedule) and appends run events marked
`"synthetic": true`, with the evaluations where the config's eval schedule
(`maxtext.eval_schedule`, the trainer's own) puts them. The official
compliance checker then judges the log with the closed deepseekv3_671b rules
of every ruleset we write (6.1.0 also fixes the first evaluation's sample
count). The rules' numbers are read from the installed checker only.
"""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized
import yaml

from maxtext import config_lib
from maxtext import eval_schedule
from maxtext.configs import deepseekv3_671b
from maxtext.mllog import listener
from maxtext.mllog import logger as mllog_logger
from maxtext.mllog import rules
from testing import compliance_checker

# Keys of the run phase; every other key a rule names is a header key.
_RUN_KEYS = frozenset(
    {
        "cache_clear",
        "init_start",
        "init_stop",
        "run_start",
        "run_stop",
        "block_start",
        "block_stop",
        "epoch_start",
        "epoch_stop",
        "eval_start",
        "eval_stop",
        "eval_accuracy",
        "tracked_stats",
    }
)
_SYNTHETIC = {"synthetic": True}
_RULESETS = ("6.1.0", "6.0.0")
_BENCHMARK = "deepseekv3_671b"


def _rules(ruleset):
  """The checker's closed deepseekv3_671b rules, keyed by log key."""
  path = os.path.join(rules.ruleset_dir(ruleset), f"closed_{_BENCHMARK}.yaml")
  with open(path, encoding="utf-8") as f:
    return {r["KEY"]["NAME"]: r["KEY"] for r in yaml.safe_load(f)}


def _config(ruleset, batch=""):
  config = deepseekv3_671b.get_config(batch)
  config.mllog_ruleset = ruleset
  config_lib.validate(config)
  return config


def _header(config):
  return listener.hyperparameters(
      config,
      data_parallelism=config.data_parallelism,
      start_step=0,
      config_filename="deepseekv3_671b.py",
  )


def _write_log(config, path, hparams, *, first_eval_shift=0):
  """Header from the config, then synthetic run events; returns the path.

  Two evaluations as the config's schedule places them (the first misses,
  the second reaches the target); `first_eval_shift` steps move the first.
  """
  batch = config.global_batch_size
  first = eval_schedule.first_eval_step(config) + first_eval_shift
  second = first + config.eval_interval
  logger = mllog_logger.create_mllogger(config, path, process_index=0)
  if not logger.enabled:
    raise AssertionError(f"deepseekv3_671b must enable the MLPerf log ({path})")

  def synthetic(key, value, samples, event_type=mllog_logger.POINT_IN_TIME):
    logger.event(
        key, value, {"samples_count": samples, **_SYNTHETIC}, event_type
    )

  with logger:
    logger.cache_clear()
    logger.init_start()
    logger.submission_info()
    logger.hyperparameters(hparams)
    logger.init_stop()
    logger.event("run_start", None, _SYNTHETIC, mllog_logger.INTERVAL_START)
    start = 0
    for step, loss in (
        (first, config.target_eval_loss + 0.1),
        (second, config.target_eval_loss),
    ):
      samples = step * batch
      synthetic("block_start", None, start, mllog_logger.INTERVAL_START)
      synthetic("block_stop", None, samples, mllog_logger.INTERVAL_END)
      synthetic("eval_start", None, samples, mllog_logger.INTERVAL_START)
      synthetic("eval_accuracy", float(loss), samples)
      synthetic("eval_stop", None, samples, mllog_logger.INTERVAL_END)
      start = samples
    logger.event(
        "run_stop",
        None,
        {
            "status": mllog_logger.SUCCESS,
            "samples_count": start,
            **_SYNTHETIC,
        },
        mllog_logger.INTERVAL_END,
    )
    return logger.path


def _events(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line.split(" ", 1)[1]) for line in f]


class DeepseekV3MllogTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.out = self.create_tempdir().full_path

  def test_config_is_a_closed_submission_of_both_rulesets(self):
    config = deepseekv3_671b.get_config()
    self.assertEqual(config.submission_division, "closed")
    self.assertEqual(config.submission_benchmark, _BENCHMARK)
    for ruleset in _RULESETS:
      self.assertIn(ruleset, rules.rulesets())
      self.assertIn(_BENCHMARK, rules.benchmarks(ruleset))
      config_lib.validate(_config(ruleset))
      # At a reference batch size the config is the reference point's.
      self.assertEqual(rules.reference_mismatches(_config(ruleset)), [])

  @parameterized.named_parameters(
      (f"{r.replace('.', '_')}_batch_{b}", r, b)
      for r in _RULESETS
      for b in ("15360", "16384", "17408", "18432")
  )
  def test_header_satisfies_the_closed_rules(self, ruleset, batch):
    config = _config(ruleset, batch)
    hparams = _header(config)
    self.assertEqual(hparams["moe_aux_loss_coeff"], 0.01)
    self.assertEqual(
        hparams["moe_aux_loss_coeff"], config.load_balance_loss_weight
    )
    path = _write_log(config, os.path.join(self.out, "mllog.log"), hparams)
    events = _events(path)
    header_keys = (set(_rules(ruleset)) - _RUN_KEYS) | set(
        mllog_logger.REQUIRED_HYPERPARAMETERS
    )
    synthetic = {e["key"] for e in events if e["metadata"].get("synthetic")}
    self.assertTrue(synthetic)
    self.assertFalse(synthetic & header_keys)
    # Every key the benchmark's rules name is in the header.
    logged = {e["key"] for e in events}
    self.assertEqual(set(_rules(ruleset)) - _RUN_KEYS - logged, set())
    result = compliance_checker.run_checker(path, ruleset=ruleset)
    self.assertTrue(result.passed, f"{result.messages}\n{result.output}")

  def test_first_eval_off_the_rule_fails_6_1_0(self):
    # The same run with its first evaluation one step late: the 6.1.0 rule
    # names eval_accuracy; 6.0.0 has no rule on it.
    config = _config("6.1.0")
    path = _write_log(
        config,
        os.path.join(self.out, "late.log"),
        _header(config),
        first_eval_shift=1,
    )
    result = compliance_checker.run_checker(path, ruleset="6.1.0")
    self.assertFalse(result.passed)
    self.assertIn("eval_accuracy", result.failed_keys())
    self.assertTrue(
        compliance_checker.run_checker(path, ruleset="6.0.0").passed
    )

  @parameterized.named_parameters(
      ("aux_loss_coeff", "load_balance_loss_weight", 0.001, "moe_aux_loss"),
      ("learning_rate", "learning_rate", 2.5e-5, "opt_base_learning_rate"),
      ("warmup", "warmup_steps", 5, "opt_learning_rate_warmup_steps"),
      ("sequence", "max_sequence_length", 8192, "max_sequence_length"),
  )
  def test_checker_names_a_wrong_hyperparameter(self, field, value, key):
    config = _config("6.0.0")
    config[field] = value
    path = _write_log(
        config, os.path.join(self.out, "bad.log"), _header(config)
    )
    result = compliance_checker.run_checker(path, ruleset="6.0.0")
    self.assertFalse(result.passed)
    self.assertTrue(
        any(k.startswith(key) for k in result.failed_keys()),
        result.failed_keys(),
    )

  def test_batch_below_the_rules_is_refused(self):
    with self.assertRaisesRegex(ValueError, "15359 is below"):
      deepseekv3_671b.get_config("15359")
    with self.assertRaisesRegex(ValueError, "must be an integer, got 'x'"):
      deepseekv3_671b.get_config("x")


if __name__ == "__main__":
  absltest.main()
