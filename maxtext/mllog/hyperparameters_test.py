"""Tests for maxtext/mllog/hyperparameters.py: a run's header, its config."""

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from maxtext.config import optimizer
from maxtext.configs import base
from maxtext.mllog import hyperparameters


def _config(**overrides):
  """base.py's config, a small batch and budget, then `overrides`."""
  values = base.get_config().to_dict()
  values.update(
      steps=50,
      warmup_steps=10,
      lr_schedule_steps=0,
      global_batch_size=12,
      gradient_accumulation_steps=3,
      mllog_train_samples=0,
      eval_steps=5,
      eval_batch_size=7,
  )
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def _header(config, data_parallelism=1, start_step=0):
  return hyperparameters.run_hyperparameters(
      config,
      data_parallelism=data_parallelism,
      start_step=start_step,
      config_filename="x.py",
  )


class RunHyperparametersTest(parameterized.TestCase):

  def test_samples(self):
    config = _config()
    self.assertEqual(hyperparameters.train_samples_of(config), 50 * 12)
    self.assertEqual(hyperparameters.eval_samples_of(config), 35)
    config = _config(mllog_train_samples=999)
    self.assertEqual(hyperparameters.train_samples_of(config), 999)

  def test_header_of_a_resumed_data_parallel_run(self):
    header = _header(_config(), data_parallelism=2, start_step=7)
    hyperparameters.check_values(header)
    self.assertEqual(header["micro_batch_size"], 12 // 3 // 2)
    self.assertEqual(header["init_checkpoint_step"], 7)
    self.assertEqual(header["train_samples"], 600)
    self.assertEqual(header["eval_samples"], 35)
    self.assertEqual(header["config_filename"], "x.py")

  def test_header_states_the_meshs_parallelism(self):
    header = _header(_config())
    self.assertEqual(
        (header["tensor_parallelism"], header["context_parallelism"]), (1, 1)
    )
    header = _header(_config(tensor_parallelism=2, context_parallelism=4))
    hyperparameters.check_values(header)
    self.assertEqual(
        (
            header["tensor_parallelism"],
            header["context_parallelism"],
            header["pipeline_parallelism"],
        ),
        (2, 4, 1),
    )

  @parameterized.named_parameters(
      ("cosine", "cosine", "cosine with linear warmup"),
      ("constant", "constant", "constant"),
  )
  def test_schedule_keys_are_the_optimizers_facts(self, kind, name):
    config = _config(lr_schedule=kind, warmup_steps=5, lr_schedule_steps=40)
    header = _header(config)
    facts = optimizer.schedule_facts(
        optimizer.OptimizerConfig.from_config(config)
    )
    self.assertEqual(header["opt_learning_rate_decay_schedule"], name)
    self.assertEqual(header["opt_learning_rate_warmup_steps"], 5)
    self.assertEqual(header["opt_learning_rate_decay_steps"], 35)
    self.assertEqual(header["opt_end_learning_rate"], facts.end_learning_rate)

  def test_every_header_source_is_a_key_of_the_header(self):
    header = _header(_config(num_experts=4, num_experts_per_token=2))
    self.assertLessEqual(set(hyperparameters.HEADER_SOURCES), set(header))

  def test_grpo_benchmark_header_is_the_grpo_runs(self):
    pretraining = _header(_config())
    self.assertNotIn("num_generations_per_prompt", pretraining)
    self.assertEqual(pretraining["max_sequence_length"], 64)
    config = _config(
        submission_benchmark="qwen35_397b_grpo",
        grpo_num_generations=4,
        grpo_num_iterations=2,
        grpo_prompt_length=5,
        grpo_max_completion_length=9,
        grpo_eval_prompts=30,
        grpo_temperature=0.7,
        grpo_top_p=0.8,
        grpo_eval_temperature=0.2,
        grpo_eval_top_p=0.9,
    )
    self.assertTrue(hyperparameters.is_grpo_benchmark(config))
    header = _header(config)
    self.assertEqual(
        {k: header[k] for k in hyperparameters.GRPO_HYPERPARAMETERS},
        {
            "num_prompts_per_step": 3,
            "num_generations_per_prompt": 4,
            "generation_training_rollout_temperature": 0.7,
            "generation_training_rollout_top_p": 0.8,
            "generation_validation_rollout_temperature": 0.2,
            "generation_validation_rollout_top_p": 0.9,
        },
    )
    self.assertEqual(header["max_sequence_length"], 14)
    self.assertEqual(header["eval_samples"], 30)
    # 50 updates, 2 per rollout: 25 rollouts of 12 samples.
    self.assertEqual(header["train_samples"], 300)
    self.assertLessEqual(
        set(hyperparameters.header_sources(config))
        - {hyperparameters.MOE_AUX_LOSS_COEFF},
        set(header),
    )


if __name__ == "__main__":
  absltest.main()
