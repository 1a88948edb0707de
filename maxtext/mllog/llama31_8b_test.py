"""The llama31_8b config's MLPerf header events against the closed rules.

A CPU cannot train Llama 3.1 8B, so this test writes the config's real header
(submission info and hyperparameters, built by `mllog_utils` from the config
and its real learning-rate schedule) and appends run events that are marked
`"synthetic": true` in their metadata. The official compliance checker then
judges the log with the closed-division rules; no failure may concern a
hyperparameter. The rules' numbers live only in the installed checker: the
test never repeats them.
"""

import glob
import json
import os

from absl.testing import absltest
import yaml

from maxtext import config_lib
from maxtext import optimizer
from maxtext.configs import llama31_8b
from maxtext.mllog import logger as mllog_utils
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


def rule_keys(ruleset, division, benchmark):
  """Every key named by the installed checker's rules for the benchmark."""
  root = rules.ruleset_dir(ruleset)
  keys = set()
  for name in (
      "common.yaml",
      f"{division}_common.yaml",
      f"{division}_{benchmark}.yaml",
  ):
    path = os.path.join(root, name)
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as f:
      for rule in yaml.safe_load(f) or []:
        if isinstance(rule, dict) and "KEY" in rule:
          keys.add(rule["KEY"]["NAME"])
  return keys


def hyperparameters(config, schedule_steps_delta=0):
  """The config's header values, from its real schedule."""
  summary = optimizer.schedule_summary(config)
  return mllog_utils.hyperparameters_from_config(
      config,
      warmup_steps=summary["warmup_steps"],
      schedule_steps=summary["schedule_steps"] + schedule_steps_delta,
      end_learning_rate=summary["end_learning_rate"],
      decay_schedule=summary["decay_schedule"],
      train_samples=config_lib.train_samples(config),
      eval_samples=config_lib.eval_samples(config),
      init_checkpoint_step=0,
      micro_batch_size=(
          config_lib.micro_batch_size(config) // config.data_parallelism
      ),
      config_filename="llama31_8b.py",
  )


def write_log(config, path, hparams):
  """Writes header events from the config, then run events; returns the path."""
  logger = mllog_utils.create_mllogger(config, path, process_index=0)
  if not logger.enabled:
    raise AssertionError(f"llama31_8b must enable the MLPerf log ({path})")
  with logger:
    logger.cache_clear()
    logger.init_start()
    logger.submission_info()
    logger.hyperparameters(hparams)
    logger.init_stop()
    # Synthetic run: one block, one eval at the config's own target.
    samples = config.eval_interval * config.global_batch_size
    logger.event("run_start", None, _SYNTHETIC, mllog_utils.INTERVAL_START)
    logger.event(
        "block_start",
        None,
        {"samples_count": 0, **_SYNTHETIC},
        mllog_utils.INTERVAL_START,
    )
    logger.event(
        "block_stop",
        None,
        {"samples_count": samples, **_SYNTHETIC},
        mllog_utils.INTERVAL_END,
    )
    logger.event(
        "eval_start",
        None,
        {"samples_count": samples, **_SYNTHETIC},
        mllog_utils.INTERVAL_START,
    )
    logger.event(
        "eval_accuracy",
        float(config.target_eval_loss),
        {"samples_count": samples, **_SYNTHETIC},
    )
    logger.event(
        "eval_stop",
        None,
        {"samples_count": samples, **_SYNTHETIC},
        mllog_utils.INTERVAL_END,
    )
    logger.event(
        "run_stop",
        None,
        {"status": mllog_utils.SUCCESS, "samples_count": samples, **_SYNTHETIC},
        mllog_utils.INTERVAL_END,
    )
    return logger.path


def message_keys(message):
  """The log keys the first line of one checker message names."""
  return compliance_checker.CheckResult(
      returncode=1, passed=False, messages=(message,), output=""
  ).failed_keys()


class Llama318bMllogTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.config = llama31_8b.get_config()
    config_lib.validate(self.config)
    self.out = self.create_tempdir().full_path
    self.header_keys = (
        rule_keys(
            self.config.mllog_ruleset,
            "closed",
            self.config.submission_benchmark,
        )
        - _RUN_KEYS
    ) | set(mllog_utils.REQUIRED_HYPERPARAMETERS)

  def test_config_is_a_closed_llama31_8b_submission(self):
    self.assertEqual(self.config.submission_division, "closed")
    self.assertEqual(self.config.submission_benchmark, "llama31_8b")

  def test_header_satisfies_the_closed_rules(self):
    path = write_log(
        self.config,
        os.path.join(self.out, "mllog.log"),
        hyperparameters(self.config),
    )
    with open(path, encoding="utf-8") as f:
      lines = [json.loads(l.split(" ", 1)[1]) for l in f]
    # The run events, and only they, are marked synthetic.
    synthetic = {e["key"] for e in lines if e["metadata"].get("synthetic")}
    self.assertTrue(synthetic)
    self.assertFalse(synthetic & self.header_keys)
    result = compliance_checker.run_checker(
        path, ruleset=self.config.mllog_ruleset
    )
    hparam_failures = [
        m for m in result.messages if message_keys(m) & self.header_keys
    ]
    self.assertEqual(hparam_failures, [], result.output)
    self.assertTrue(result.passed, f"{result.messages}\n{result.output}")

  def test_checker_names_a_wrong_hyperparameter(self):
    # The same header with a schedule one step longer than the config's:
    # the closed rule must reject the logged decay steps, naming the key.
    path = write_log(
        self.config,
        os.path.join(self.out, "wrong.log"),
        hyperparameters(self.config, schedule_steps_delta=1),
    )
    result = compliance_checker.run_checker(
        path, ruleset=self.config.mllog_ruleset
    )
    self.assertFalse(result.passed)
    self.assertIn("opt_learning_rate_decay_steps", result.failed_keys())

  def test_header_logs_every_key_the_rules_name(self):
    root = rules.ruleset_dir(self.config.mllog_ruleset)
    self.assertTrue(glob.glob(os.path.join(root, "closed_llama31_8b.yaml")))
    rule_header_keys = (
        rule_keys(
            self.config.mllog_ruleset,
            "closed",
            self.config.submission_benchmark,
        )
        - _RUN_KEYS
    )
    self.assertTrue(rule_header_keys)
    logged = set(hyperparameters(self.config)) | {
        "submission_org",
        "submission_platform",
        "submission_division",
        "submission_status",
        "submission_benchmark",
    }
    self.assertEqual(rule_header_keys - logged, set())


if __name__ == "__main__":
  absltest.main()
