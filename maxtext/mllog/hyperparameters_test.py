"""Tests for maxtext/mllog/hyperparameters.py: a run's header, its config."""

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from maxtext.config import optimizer
from maxtext.configs import base
from maxtext.mllog import hyperparameters
from maxtext.mllog import mlperf_config
from maxtext.mllog import workload_header


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
  return mlperf_config.MlperfConfig.from_config(
      ml_collections.ConfigDict(values)
  )


def _header(config, data_parallelism=1, start_step=0, header=None):
  return hyperparameters.run_hyperparameters(
      config,
      data_parallelism=data_parallelism,
      start_step=start_step,
      config_filename="x.py",
      header=header,
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
    facts = optimizer.schedule_facts(config.optimizer)
    self.assertEqual(header["opt_learning_rate_decay_schedule"], name)
    self.assertEqual(header["opt_learning_rate_warmup_steps"], 5)
    self.assertEqual(header["opt_learning_rate_decay_steps"], 35)
    self.assertEqual(header["opt_end_learning_rate"], facts.end_learning_rate)

  def test_every_header_source_is_a_key_of_the_header(self):
    header = _header(_config(num_experts=4, num_experts_per_token=2))
    self.assertLessEqual(set(hyperparameters.HEADER_SOURCES), set(header))

  def test_a_workloads_values_replace_the_configs_and_follow_them(self):
    stated = workload_header.WorkloadHeader(
        values={
            "max_sequence_length": 14,
            "eval_samples": 30,
            "train_samples": 300,
            "num_generations_per_prompt": 4,
        },
        sources={"num_generations_per_prompt": "config.g"},
    )
    header = _header(_config(), header=stated)
    hyperparameters.check_values(header)
    self.assertEqual(
        list(header)[: len(hyperparameters.REQUIRED_HYPERPARAMETERS)],
        list(hyperparameters.REQUIRED_HYPERPARAMETERS),
    )
    self.assertEqual(list(header)[-1], "num_generations_per_prompt")
    self.assertEqual(
        (
            header["max_sequence_length"],
            header["eval_samples"],
            header["train_samples"],
            header["num_generations_per_prompt"],
        ),
        (14, 30, 300, 4),
    )
    self.assertEqual(
        hyperparameters.header_sources(stated)["num_generations_per_prompt"],
        "config.g",
    )
    # The log's own train_samples, when set, is logged whoever states it.
    header = _header(_config(mllog_train_samples=999), header=stated)
    self.assertEqual(header["train_samples"], 999)

  def test_a_benchmark_is_grpos_when_its_rules_require_the_grpo_key(self):
    self.assertFalse(hyperparameters.is_grpo_benchmark(_config()))
    self.assertTrue(
        hyperparameters.is_grpo_benchmark(
            _config(submission_benchmark="qwen35_397b_grpo")
        )
    )


if __name__ == "__main__":
  absltest.main()
