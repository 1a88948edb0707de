"""Tests for maxtext/mllog/mlperf_preflight.py: the MLPerf rules on a config.

Each config is validated first (`config_lib.validate`), as the trainer does
before its pre-flight.
"""

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from maxtext.config import config_lib
from maxtext.configs import base
from maxtext.configs import deepseekv3_671b
from maxtext.configs import llama31_8b
from maxtext.mllog import hyperparameters
from maxtext.mllog import mlperf_preflight
from maxtext.mllog import rules
from maxtext.mllog import mlperf_config


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


def _with(config, **overrides):
  """A plain copy of `config` with fields replaced, bypassing type locking."""
  values = config.to_dict()
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def _check(config):
  config_lib.validate(config)
  mlperf_preflight.check(_mlperf(config))


class SubmissionTest(parameterized.TestCase):
  """The submission fields: checked with the log on or off."""

  def setUp(self):
    super().setUp()
    self.config = base.get_config()

  @parameterized.named_parameters(
      (
          "division",
          {"submission_division": "semi"},
          "submission_division='semi'",
      ),
      (
          "status",
          {"submission_status": "unknown"},
          "submission_status='unknown'",
      ),
      (
          "benchmark",
          {"submission_benchmark": "no_such_benchmark"},
          "submission_benchmark='no_such_benchmark'",
      ),
      ("ruleset", {"mllog_ruleset": "1.0.0"}, "mllog_ruleset='1.0.0'"),
      ("empty_org", {"submission_org": ""}, "submission_org"),
  )
  def test_bad_value_raises_value_error_naming_it(self, overrides, pattern):
    self.assertFalse(self.config.enable_mllog)
    with self.assertRaisesRegex(ValueError, pattern):
      _check(_with(self.config, **overrides))

  def test_every_allowed_submission_validates(self):
    for ruleset in rules.rulesets():
      for division in rules.DIVISIONS:
        for benchmark in rules.benchmarks(ruleset):
          with self.subTest(
              ruleset=ruleset, division=division, benchmark=benchmark
          ):
            # A benchmark whose closed rules require moe_aux_loss_coeff is
            # a mixture-of-experts model: the closed run needs experts
            # (test_closed_moe_benchmark_refuses_a_dense_model).
            experts = division == "closed" and (
                hyperparameters.rules_require_key(
                    rules.ruleset_dir(ruleset),
                    "closed",
                    benchmark,
                    hyperparameters.MOE_AUX_LOSS_COEFF,
                )
            )
            moe = (
                dict(num_experts=4, num_experts_per_token=2, moe_mlp_dim=64)
                if experts
                else {}
            )
            _check(
                _with(
                    self.config,
                    mllog_ruleset=ruleset,
                    submission_division=division,
                    submission_benchmark=benchmark,
                    **moe,
                )
            )

  def test_closed_moe_benchmark_refuses_a_dense_model(self):
    with self.assertRaisesRegex(
        ValueError,
        r"config\.num_experts=0: a closed deepseekv3_671b run needs a model "
        r"with experts",
    ):
      _check(
          _with(
              self.config,
              submission_division="closed",
              submission_benchmark="deepseekv3_671b",
          )
      )


class ReferenceAndHeaderTest(parameterized.TestCase):
  """With the log on: the reference convergence points, the header proof."""

  def setUp(self):
    super().setUp()
    self.llama = llama31_8b.get_config()

  def test_llama31_8b_passes_the_official_checker(self):
    """Its log's header and first evaluation, under every ruleset we write."""
    config = llama31_8b.get_config()
    for ruleset in rules.rulesets():
      with self.subTest(ruleset=ruleset):
        with self.assertNoLogs(level="WARNING"):
          # Closed: a failure of the official checker would raise here.
          _check(_with(config, mllog_ruleset=ruleset))

  def test_closed_llama31_8b_at_its_reference_batch_validates(self):
    self.assertEqual(self.llama.global_batch_size, 32)
    _check(self.llama)

  def test_closed_batch_outside_the_reference_range_is_refused(self):
    with self.assertRaisesRegex(
        ValueError,
        r"config.global_batch_size=8 is outside .*\[16, 128\].*"
        r"rcps_llama31_8b.json",
    ):
      _check(_with(self.llama, global_batch_size=8))

  def test_open_batch_outside_the_reference_range_is_a_warning(self):
    with self.assertLogs(level="WARNING") as logs:
      _check(_with(self.llama, global_batch_size=8, submission_division="open"))
    self.assertTrue(
        any("config.global_batch_size=8" in line for line in logs.output),
        logs.output,
    )

  def test_closed_learning_rate_off_the_reference_is_refused(self):
    with self.assertRaisesRegex(
        ValueError, "config.learning_rate=0.0004 differs from the reference"
    ):
      _check(_with(self.llama, learning_rate=4e-4))

  def test_gradient_accumulation_is_not_compared(self):
    _check(_with(self.llama, gradient_accumulation_steps=4))

  def test_no_preflight_without_the_mllog(self):
    _check(
        _with(
            self.llama,
            enable_mllog=False,
            global_batch_size=8,
            learning_rate=1e-3,
        )
    )

  def test_closed_deepseek_first_eval_one_step_late_is_refused(self):
    deepseek = deepseekv3_671b.get_config()
    late = deepseek.first_eval_samples + deepseek.global_batch_size
    with self.assertRaisesRegex(
        ValueError,
        r"closed-division pre-flight: the MLPerf log this config writes "
        r"fails the official compliance checker \(mlperf_logging "
        r"training_6.1.0 closed deepseekv3_671b rules\): eval_accuracy: the "
        rf"first evaluation, after 44 steps \(config.first_eval_samples="
        rf"{late}, .*\), at samples_count={late} fails `",
    ):
      _check(_with(deepseek, first_eval_samples=late))

  def test_closed_deepseek_learning_rate_off_the_formula_is_refused(self):
    # 17408 lies between reference batch sizes, where the RCP data states
    # no learning rate: only the closed rule's formula refuses it.
    shipped = deepseekv3_671b.get_config("17408")
    _check(shipped)
    config = _with(shipped, learning_rate=2.4e-5)
    self.assertEqual(rules.reference_mismatches(_mlperf(config)), [])
    with self.assertRaisesRegex(
        ValueError,
        r"closed-division pre-flight: .*: opt_base_learning_rate=2.4e-05 "
        r"\(config.learning_rate\) fails `abs\(v\['value'\] - ",
    ):
      _check(config)

  def test_open_division_header_failures_are_warnings(self):
    deepseek = deepseekv3_671b.get_config()
    late = deepseek.first_eval_samples + deepseek.global_batch_size
    open_late = _with(
        deepseek, submission_division="open", first_eval_samples=late
    )
    # The open rules fix no first evaluation: nothing to warn about.
    _check(open_late)
    # They do fix the sequence length: a warning naming it, no error.
    with self.assertLogs(level="WARNING") as logs:
      _check(_with(open_late, max_sequence_length=8192))
    self.assertTrue(
        any(
            "MLPerf open division: the log fails the checker "
            "(mlperf_logging training_6.1.0 open deepseekv3_671b rules): "
            "max_sequence_length=8192 (config.max_sequence_length) fails"
            in line
            for line in logs.output
        ),
        logs.output,
    )
    with self.assertRaisesRegex(ValueError, "max_sequence_length=8192"):
      _check(_with(deepseek, max_sequence_length=8192, first_eval_samples=late))

  def test_closed_llama31_8b_as_shipped_is_accepted(self):
    with self.assertNoLogs(level="WARNING"):
      _check(self.llama)


if __name__ == "__main__":
  absltest.main()
