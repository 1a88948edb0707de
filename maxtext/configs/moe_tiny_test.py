"""moe_tiny.py trains to its target; MoE configs in checks and MLPerf logs."""

import json
import os

from absl.testing import absltest
import jax

from maxtext import workloads
from maxtext.config import config_lib
from maxtext.mllog import mlperf_config
from maxtext.model import transformer
from maxtext.run import trainer
from maxtext.configs import default
from maxtext.configs import moe_tiny
from maxtext.mllog import hyperparameters
from maxtext.mllog import rules
from testing import compliance_checker
from testing import tiny_configs


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


def _hyperparameters(config):
  return hyperparameters.hyperparameters_from_config(
      _mlperf(config),
      warmup_steps=1,
      schedule_steps=2,
      train_samples=16,
      eval_samples=16,
      init_checkpoint_step=0,
      micro_batch_size=8,
      config_filename="x.py",
  )


class MoeTinyTest(absltest.TestCase):

  def test_trains_to_target_with_moe_metrics_and_a_passing_log(self):
    config = moe_tiny.get_config()
    config.base_output_directory = self.create_tempdir().full_path
    config.run_name = "moe"
    config.jax_compilation_cache_dir = tiny_configs.compilation_cache_dir()
    config.checkpoint_period = 0
    result = workloads.run(config)
    self.assertEqual(result.status, trainer.RunOutcome.SUCCESS)
    self.assertLessEqual(result.last_eval_loss, config.target_eval_loss)
    with open(
        os.path.join(result.run_dir, "metrics.jsonl"), encoding="utf-8"
    ) as f:
      train = [r for r in map(json.loads, f) if r["kind"] == "train"]
    for name in transformer.MOE_METRICS:
      self.assertIn(f"moe/{name}", train[-1])
    self.assertEqual(train[-1]["moe/dropped_tokens"], 0.0)
    self.assertGreater(train[0]["moe/aux_loss"], 0.9)
    log = os.path.join(result.run_dir, "mllog.log")
    with open(log, encoding="utf-8") as f:
      coeff = [
          json.loads(line.split(" ", 1)[1])
          for line in f
          if '"moe_aux_loss_coeff"' in line
      ]
    self.assertEqual([c["value"] for c in coeff], [0.01])
    # The official checker accepts the extra key in an open llama31_8b log.
    checked = compliance_checker.run_checker(log)
    self.assertTrue(checked.passed, checked.output)

  def test_moe_aux_loss_coeff_only_with_experts(self):
    self.assertNotIn(
        hyperparameters.MOE_AUX_LOSS_COEFF,
        _hyperparameters(default.get_config()),
    )
    config = moe_tiny.get_config()
    config.load_balance_loss_weight = 0.003
    values = _hyperparameters(config)
    self.assertEqual(values[hyperparameters.MOE_AUX_LOSS_COEFF], 0.003)
    self.assertEqual(values["expert_parallelism"], 1)

  def test_deepseek_rules_require_the_coefficient(self):
    directory = rules.ruleset_dir("6.1.0")
    self.assertTrue(
        hyperparameters.rules_require_key(
            directory, "closed", "deepseekv3_671b", "moe_aux_loss_coeff"
        )
    )
    self.assertFalse(
        hyperparameters.rules_require_key(
            directory, "closed", "llama31_8b", "moe_aux_loss_coeff"
        )
    )

  def test_config_validates_and_moe_fields_are_checked(self):
    config_lib.validate(moe_tiny.get_config())
    bad = [
        ("num_experts_per_token", 5, "num_experts_per_token=5"),
        ("num_dense_layers", 2, "num_dense_layers=2"),
        ("router_score", "cosine", "router_score='cosine'"),
        ("load_balance_loss", "z", "load_balance_loss='z'"),
        ("capacity_factor", -1.0, "capacity_factor=-1.0"),
        ("expert_parallelism", 3, "expert_parallelism=3"),
        ("routed_scaling_factor", 0.0, "routed_scaling_factor=0.0"),
        ("num_expert_groups", 3, "num_expert_groups=3: must divide"),
        # Groups of one expert cannot rank by their two best.
        ("num_expert_groups", 4, "num_expert_groups=4: must divide"),
        ("num_expert_groups", 0, "num_expert_groups=0: must be >= 1"),
    ]
    for key, value, message in bad:
      config = moe_tiny.get_config()
      config[key] = value
      with self.subTest(key), self.assertRaisesRegex(ValueError, message):
        config_lib.validate(config)
    # Two groups of two experts: a token's two experts need one group.
    config = moe_tiny.get_config()
    config.update(num_expert_groups=2, expert_groups_per_token=3)
    with self.assertRaisesRegex(
        ValueError, r"expert_groups_per_token=3: must be in \[1, "
    ):
      config_lib.validate(config)
    config.update(num_experts_per_token=3, expert_groups_per_token=1)
    with self.assertRaisesRegex(
        ValueError, r"expert_groups_per_token=1: must be in \[2, "
    ):
      config_lib.validate(config)
    config.expert_groups_per_token = 2
    config_lib.validate(config)
    dense = default.get_config()
    dense.expert_parallelism = 2
    with self.assertRaisesRegex(ValueError, "expert_parallelism=2"):
      config_lib.validate(dense)


if __name__ == "__main__":
  jax.config.parse_flags_with_absl()
  absltest.main()
