"""Tests for maxtext/mllog/hyperparameters.py: a run's header, its config."""

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from maxtext import optimizer
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

  @parameterized.named_parameters(
      ("cosine", "cosine", "cosine with linear warmup"),
      ("constant", "constant", "constant"),
  )
  def test_schedule_keys_are_the_optimizers_facts(self, kind, name):
    config = _config(lr_schedule=kind, warmup_steps=5, lr_schedule_steps=40)
    header = _header(config)
    facts = optimizer.schedule_facts(config)
    self.assertEqual(header["opt_learning_rate_decay_schedule"], name)
    self.assertEqual(header["opt_learning_rate_warmup_steps"], 5)
    self.assertEqual(header["opt_learning_rate_decay_steps"], 35)
    self.assertEqual(header["opt_end_learning_rate"], facts.end_learning_rate)

  def test_every_header_source_is_a_key_of_the_header(self):
    header = _header(_config(num_experts=4, num_experts_per_token=2))
    self.assertLessEqual(set(hyperparameters.HEADER_SOURCES), set(header))


if __name__ == "__main__":
  absltest.main()
