"""RolloutConfig: the decodes' sizes and the eval's samples, as config_lib's."""

from absl.testing import absltest

from maxtext.config import config_lib
from maxtext.configs import base
from maxtext.grpo.rollout import rollout_config


class RolloutConfigTest(absltest.TestCase):

  def test_eval_samples_per_prompt_is_config_libs(self):
    config = base.get_config()
    config.grpo_num_generations = 8
    for temperature, samples, want in ((0.0, 0, 1), (0.5, 0, 8), (0.5, 2, 2)):
      config.grpo_eval_temperature = temperature
      config.grpo_eval_samples_per_prompt = samples
      with self.subTest(temperature=temperature, samples=samples):
        settings = rollout_config.RolloutConfig.from_config(config)
        self.assertEqual(settings.eval_samples_per_prompt(), want)
        self.assertEqual(want, config_lib.eval_samples_per_prompt(config))

  def test_decoded_rows_count_the_evals_samples(self):
    config = base.get_config()
    config.grpo_eval_temperature = 0.5
    config.grpo_num_generations = 8
    config.grpo_eval_prompts = 4
    settings = rollout_config.RolloutConfig.from_config(config)
    self.assertEqual(settings.decoded_rows(), config_lib.decoded_rows(config))
    self.assertEqual(settings.decoded_rows(), max(config.global_batch_size, 32))


if __name__ == "__main__":
  absltest.main()
