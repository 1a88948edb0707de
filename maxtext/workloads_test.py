"""workloads: every `workload` name has its workload, and only those."""

from absl.testing import absltest
import ml_collections

from maxtext.core import choices
from maxtext.run import workload
from maxtext import workloads
from maxtext.configs import base


class WorkloadsTest(absltest.TestCase):

  def test_every_choice_has_a_workload_of_its_name(self):
    self.assertEqual(set(workloads.WORKLOADS), set(choices.WORKLOADS))
    for name in choices.WORKLOADS:
      config = ml_collections.ConfigDict({"workload": name})
      made = workloads.for_config(config)
      self.assertIsInstance(made, workload.Workload)
      self.assertEqual(made.name, name)

  def test_each_run_gets_its_own_workload(self):
    config = ml_collections.ConfigDict({"workload": "grpo"})
    self.assertIsNot(workloads.for_config(config), workloads.for_config(config))

  def test_base_config_pretrains(self):
    config = base.get_config()
    self.assertEqual(config.workload, "pretraining")
    self.assertFalse(workloads.is_grpo(config))

  def test_unknown_name_is_one_line(self):
    config = ml_collections.ConfigDict({"workload": "dpo"})
    with self.assertRaisesRegex(
        ValueError, r"^config\.workload='dpo': must be one of 'pretraining'"
    ) as caught:
      workloads.for_config(config)
    self.assertNotIn("\n", str(caught.exception))


if __name__ == "__main__":
  absltest.main()
