"""The deepseekv3_671b config's MLPerf header events against the closed rules.

No machine here trains DeepSeek-V3, so `maxtext.mllog.header_proof` writes
the config's real header (submission info and the hyperparameters the run's
MLPerf listener builds from the config and its real schedule) and appends run
events marked `"synthetic": true`, with the evaluations where the config's
eval schedule (`maxtext.config.eval_schedule`, the trainer's own) puts them. The
official compliance checker then judges the log with the closed
deepseekv3_671b rules of every ruleset we write (6.1.0 also fixes the first
evaluation's sample count). The rules' numbers are read from the installed
checker only.
"""

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from maxtext.config import config_lib
from maxtext.configs import deepseekv3_671b
from maxtext.mllog import header_proof
from maxtext.mllog import mlperf_preflight
from maxtext.mllog import rules
from maxtext.mllog import mlperf_config


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


_RULESETS = ("6.1.0", "6.0.0")
_BENCHMARK = "deepseekv3_671b"


def _config(ruleset, batch="", **overrides):
  values = deepseekv3_671b.get_config(batch).to_dict()
  values.update(mllog_ruleset=ruleset, **overrides)
  return ml_collections.ConfigDict(values)


def _header(config):
  """The header a fresh run of `config` logs."""
  return header_proof.fresh_run_header(_mlperf(config), "deepseekv3_671b.py")


def _prove(config):
  return header_proof.prove(_mlperf(config), _header(config))


class DeepseekV3MllogTest(parameterized.TestCase):

  def test_config_is_a_closed_submission_of_both_rulesets(self):
    config = deepseekv3_671b.get_config()
    self.assertEqual(config.submission_division, "closed")
    self.assertEqual(config.submission_benchmark, _BENCHMARK)
    for ruleset in _RULESETS:
      self.assertIn(ruleset, rules.rulesets())
      self.assertIn(_BENCHMARK, rules.benchmarks(ruleset))
      config_lib.validate(_config(ruleset))
      mlperf_preflight.check(_mlperf(_config(ruleset)))
      # At a reference batch size the config is the reference point's.
      self.assertEqual(
          rules.reference_mismatches(_mlperf(_config(ruleset))), []
      )

  @parameterized.named_parameters(
      (f"{r.replace('.', '_')}_batch_{b}", r, b)
      for r in _RULESETS
      for b in ("15360", "16384", "17408", "18432")
  )
  def test_header_satisfies_the_closed_rules(self, ruleset, batch):
    config = _config(ruleset, batch)
    config_lib.validate(config)
    mlperf_preflight.check(_mlperf(config))
    hparams = _header(config)
    self.assertEqual(hparams["moe_aux_loss_coeff"], 0.01)
    self.assertEqual(
        hparams["moe_aux_loss_coeff"], config.load_balance_loss_weight
    )
    # Every key the benchmark's rules name is in the header.
    rule_header_keys = (
        header_proof.rule_keys(ruleset, "closed", _BENCHMARK)
        - header_proof.RUN_KEYS
    )
    self.assertIn("moe_aux_loss_coeff", rule_header_keys)
    self.assertEqual(
        {k for k in rule_header_keys if not k.startswith("submission_")}
        - set(hparams),
        set(),
    )
    verdict = _prove(config)
    self.assertTrue(verdict.passed, verdict)

  def test_first_eval_off_the_rule_fails_6_1_0(self):
    # The same run with its first evaluation one step late: the 6.1.0 rule
    # names eval_accuracy; 6.0.0 has no rule on it.
    late = {}
    for ruleset in _RULESETS:
      config = _config(ruleset)
      config.first_eval_samples += config.global_batch_size
      late[ruleset] = _prove(config)
    self.assertEqual([f.key for f in late["6.1.0"].failures], ["eval_accuracy"])
    self.assertEqual(late["6.1.0"].run_failures(), ())
    self.assertTrue(late["6.0.0"].passed, late["6.0.0"])

  @parameterized.named_parameters(
      ("aux_loss_coeff", "load_balance_loss_weight", 0.001, "moe_aux_loss"),
      ("learning_rate", "learning_rate", 2.5e-5, "opt_base_learning_rate"),
      ("warmup", "warmup_steps", 5, "opt_learning_rate_warmup_steps"),
      ("sequence", "max_sequence_length", 8192, "max_sequence_length"),
  )
  def test_checker_names_a_wrong_hyperparameter(self, field, value, key):
    for ruleset in _RULESETS:
      with self.subTest(ruleset=ruleset):
        verdict = _prove(_config(ruleset, **{field: value}))
        self.assertFalse(verdict.passed)
        keys = {f.key for f in verdict.config_failures()}
        self.assertTrue(any(k.startswith(key) for k in keys), keys)

  def test_learning_rate_off_the_formula_between_reference_points(self):
    # 17408 is no reference batch size: the RCP pre-flight cannot judge the
    # learning rate there, the rule's formula can.
    config = _config("6.1.0", "17408", learning_rate=2.4e-5)
    self.assertNotIn(
        17408,
        [p.batch_size for p in rules.reference_points("6.1.0", _BENCHMARK)],
    )
    self.assertEqual(rules.reference_mismatches(_mlperf(config)), [])
    self.assertEqual(
        [f.key for f in _prove(config).failures], ["opt_base_learning_rate"]
    )

  def test_batch_below_the_rules_is_refused(self):
    with self.assertRaisesRegex(ValueError, "15359 is below"):
      deepseekv3_671b.get_config("15359")
    with self.assertRaisesRegex(ValueError, "must be an integer, got 'x'"):
      deepseekv3_671b.get_config("x")


if __name__ == "__main__":
  absltest.main()
