"""workloads: every `workload` name has its workload, and only those."""

from absl.testing import absltest
import ml_collections

from maxtext.core import choices
from maxtext.run import run_settings
from maxtext.run import workload
from maxtext import workloads
from maxtext.configs import base


class WorkloadsTest(absltest.TestCase):

  def test_every_choice_has_a_workload_of_its_name(self):
    self.assertEqual(set(workloads.WORKLOADS), set(choices.WORKLOADS))
    for name in choices.WORKLOADS:
      # SFT's settings require a chat data set.
      config = ml_collections.ConfigDict(
          {"workload": name, "dataset_type": "chat"}
      )
      made = workloads.for_config(config)
      self.assertIsInstance(made, workload.Workload)
      self.assertEqual(made.name, name)

  def test_a_workload_gets_its_settings_from_the_config(self):
    config = base.get_config()
    config.workload = "grpo"
    config.grpo_num_generations = 8
    config.steps = 7
    config.warmup_steps = 0  # Within the 7 steps' schedule (`engine`'s).
    config.seed = 5
    made = workloads.for_config(config)
    self.assertEqual(made.settings.grpo_num_generations, 8)
    self.assertEqual(made.settings.mlperf.grpo_num_generations, 8)
    self.assertEqual(made.settings.mlperf.steps, 7)
    # Every component's settings GRPO builds, from the same config.
    self.assertEqual(made.settings.rollout.grpo_num_generations, 8)
    self.assertEqual(made.settings.task.grpo_num_generations, 8)
    self.assertEqual(made.settings.engine.optimizer.warmup_steps, 0)
    self.assertEqual(made.settings.engine.seed, 5)
    config.workload, config.dataset_type = "sft", "chat"
    self.assertEqual(workloads.for_config(config).settings.dataset_type, "chat")

  def test_each_run_gets_its_own_workload(self):
    config = ml_collections.ConfigDict({"workload": "grpo"})
    self.assertIsNot(workloads.for_config(config), workloads.for_config(config))

  def test_base_config_pretrains(self):
    config = base.get_config()
    self.assertEqual(config.workload, "pretraining")
    self.assertFalse(workloads.is_grpo(config))

  def test_only_grpo_keeps_devices_for_generation(self):
    # The mesh reads no workload name: each workload sets how many devices
    # generate instead of training (GRPO's own field, 0 for the others).
    for name in choices.WORKLOADS:
      config = base.get_config()
      config.workload = name
      config.grpo_generation_devices = 2
      config.fsdp_parallelism = 4
      config.dataset_type = "chat"  # SFT's settings require it.
      settings = workloads.for_config(config).mesh_config(
          run_settings.RunSettings.from_config(config)
      )
      with self.subTest(name):
        self.assertEqual(settings.fsdp_parallelism, 4)
        self.assertEqual(
            settings.generation_devices, 2 if name == "grpo" else 0
        )

  def test_unknown_name_is_one_line(self):
    config = ml_collections.ConfigDict({"workload": "dpo"})
    with self.assertRaisesRegex(
        ValueError, r"^config\.workload='dpo': must be one of 'pretraining'"
    ) as caught:
      workloads.for_config(config)
    self.assertNotIn("\n", str(caught.exception))


if __name__ == "__main__":
  absltest.main()
