"""The llama31_8b config's MLPerf header events against the closed rules.

A CPU cannot train Llama 3.1 8B, so `maxtext.mllog.header_proof` writes the
config's real header (submission info and the hyperparameters the run's
MLPerf listener builds from the config and its real learning-rate schedule)
and appends run events marked `"synthetic": true`, with the evaluations where
the config's eval schedule puts them. The official compliance checker then
judges the log with the closed-division rules of every ruleset we write. The
rules' numbers live only in the installed checker: the test never repeats
them.
"""

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from maxtext.config import config_lib
from maxtext.configs import llama31_8b
from maxtext.mllog import header_proof
from maxtext.mllog import mlperf_preflight
from maxtext.mllog import rules
from maxtext.mllog import mlperf_config


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


_BENCHMARK = "llama31_8b"
_SUBMISSION_KEYS = frozenset(
    {
        "submission_org",
        "submission_platform",
        "submission_division",
        "submission_status",
        "submission_benchmark",
    }
)


def _config(ruleset="6.1.0", **overrides):
  values = llama31_8b.get_config().to_dict()
  values.update(mllog_ruleset=ruleset, **overrides)
  return ml_collections.ConfigDict(values)


def _header(config):
  """The header a fresh run of `config` logs."""
  return header_proof.fresh_run_header(_mlperf(config), "llama31_8b.py")


class Llama318bMllogTest(parameterized.TestCase):

  def test_config_is_a_closed_llama31_8b_submission(self):
    config = llama31_8b.get_config()
    config_lib.validate(config)
    mlperf_preflight.check(_mlperf(config))
    self.assertEqual(config.submission_division, "closed")
    self.assertEqual(config.submission_benchmark, _BENCHMARK)
    self.assertTrue(config.enable_mllog)

  @parameterized.named_parameters(
      (r.replace(".", "_"), r) for r in rules.rulesets()
  )
  def test_header_satisfies_the_closed_rules(self, ruleset):
    config = _config(ruleset)
    config_lib.validate(config)
    mlperf_preflight.check(_mlperf(config))
    verdict = header_proof.prove(_mlperf(config), _header(config))
    self.assertEqual(verdict.config_failures(), ())
    self.assertTrue(verdict.passed, verdict)

  def test_checker_names_a_wrong_hyperparameter(self):
    # A schedule one step longer than the rules': the closed rule rejects
    # the logged decay steps, naming the key.
    config = _config(lr_schedule_steps=llama31_8b.get_config().steps + 1)
    verdict = header_proof.prove(_mlperf(config), _header(config))
    self.assertEqual(
        [f.key for f in verdict.config_failures()],
        ["opt_learning_rate_decay_steps"],
    )

  @parameterized.named_parameters(
      (r.replace(".", "_"), r) for r in rules.rulesets()
  )
  def test_header_logs_every_key_the_rules_name(self, ruleset):
    rule_header_keys = (
        header_proof.rule_keys(ruleset, "closed", _BENCHMARK)
        - header_proof.RUN_KEYS
    )
    self.assertContainsSubset(
        {"opt_learning_rate_decay_steps"}, rule_header_keys
    )
    logged = set(_header(_config(ruleset))) | _SUBMISSION_KEYS
    self.assertEqual(rule_header_keys - logged, set())


if __name__ == "__main__":
  absltest.main()
