"""The SFT workload: its config check, and its place among the workloads."""

from absl.testing import absltest

from maxtext.config import config_lib
from maxtext.run import trainer
from maxtext.run import workload
from maxtext import workloads
from maxtext.configs import sft_tiny
from maxtext.sft import sft_workload


class SftWorkloadTest(absltest.TestCase):

  def test_sft_tiny_names_the_sft_workload(self):
    config = sft_tiny.get_config()
    config_lib.validate(config)
    made = workloads.for_config(config)
    self.assertIsInstance(made, sft_workload.SftWorkload)
    self.assertIsInstance(made, workload.Workload)
    self.assertEqual(made.settings, sft_workload.SftConfig("chat"))

  def test_refuses_data_that_is_not_chat(self):
    config = sft_tiny.get_config()
    config.dataset_type = "synthetic"
    with self.assertRaisesRegex(
        trainer.ConfigError,
        r"^config.dataset_type='synthetic': workload='sft' trains on chat "
        r"examples; set dataset_type='chat' \(docs/sft.md\)$",
    ):
      workloads.check(config)

  def test_settings_refuse_data_that_is_not_chat(self):
    with self.assertRaisesRegex(
        ValueError, r"^config.dataset_type='megatron': workload='sft' "
    ):
      sft_workload.SftConfig.from_config({"dataset_type": "megatron"})


if __name__ == "__main__":
  absltest.main()
