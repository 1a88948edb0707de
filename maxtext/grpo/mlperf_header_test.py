"""Tests for maxtext/grpo/mlperf_header.py: a GRPO run's part of its log."""

from absl.testing import absltest

from maxtext.configs import base
from maxtext.configs import qwen35_397b_grpo
from maxtext.grpo import mlperf_header
from maxtext.mllog import hyperparameters


def _config(**overrides):
  """A GRPO config's MLPerf settings: base.py with small numbers."""
  config = base.get_config()
  config.update(
      dict(
          steps=50,
          global_batch_size=12,
          grpo_num_generations=4,
          grpo_num_iterations=2,
          grpo_prompt_length=5,
          grpo_max_completion_length=9,
          grpo_eval_prompts=30,
          grpo_temperature=0.7,
          grpo_top_p=0.8,
          grpo_eval_temperature=0.2,
          grpo_eval_top_p=0.9,
          grpo_target_pass_rate=0.6,
      )
  )
  config.update(overrides)
  return mlperf_header.GrpoMlperfConfig.from_config(config)


class GrpoHeaderTest(absltest.TestCase):

  def test_the_header_states_what_the_grpo_run_uses(self):
    header = mlperf_header.header(_config())
    self.assertEqual(
        dict(header.values),
        {
            "max_sequence_length": 14,
            "eval_samples": 30,
            # 50 updates, 2 per rollout: 25 rollouts of 12 samples.
            "train_samples": 300,
            "num_prompts_per_step": 3,
            "num_generations_per_prompt": 4,
            "generation_training_rollout_temperature": 0.7,
            "generation_training_rollout_top_p": 0.8,
            "generation_validation_rollout_temperature": 0.2,
            "generation_validation_rollout_top_p": 0.9,
        },
    )
    self.assertEqual(
        list(header.values)[3:], list(hyperparameters.GRPO_HYPERPARAMETERS)
    )
    self.assertEqual(header.updates_per_batch, 2)
    self.assertEqual(
        (header.target, header.target_field, header.higher_is_better),
        (0.6, "grpo_target_pass_rate", True),
    )

  def test_every_stated_key_has_its_source(self):
    header = mlperf_header.header(_config())
    self.assertEqual(set(header.sources), set(header.values))

  def test_the_benchmark_config_states_its_rules_key(self):
    settings = mlperf_header.GrpoMlperfConfig.from_config(
        qwen35_397b_grpo.get_config()
    )
    self.assertIn(
        hyperparameters.GRPO_RULE_KEY, mlperf_header.header(settings).values
    )


if __name__ == "__main__":
  absltest.main()
