"""prompts: the GRPO run's prompts as a data set, by rollout."""

from absl.testing import absltest
import numpy as np

from maxtext.grpo.tasks import progression_task
from maxtext.grpo.tasks import prompts
from maxtext.grpo.tasks import task_config
from testing import tiny_configs


def _config(**overrides) -> task_config.TaskConfig:
  return task_config.TaskConfig.from_config(
      tiny_configs.model_config(
          tiny_configs.TINY_GRPO, global_batch_size=8, **overrides
      )
  )


class PromptDatasetTest(absltest.TestCase):

  def test_batches_are_the_tasks_prompts_of_each_rollout(self):
    config = _config()
    data = prompts.PromptDataset(config)
    task = progression_task.ProgressionTask(32, 3, 4, 8, seed=config.seed)
    for rollout in (0, 1, 7):
      batch = data.get_batch(rollout)
      self.assertEqual(batch["prompts"].dtype, np.int32)
      # global_batch_size 8 / 4 completions per prompt = 2 prompts.
      self.assertEqual(
          batch["prompts"].tolist(), task.train_prompts(rollout, 2)
      )
    np.testing.assert_array_equal(
        data.get_eval_batch(0)["prompts"], task.eval_prompts()
    )

  def test_a_resumed_reader_gives_the_same_prompts(self):
    # No position: a new reader (a resumed run) continues where the old
    # one was, from the rollout alone.
    first, second = prompts.PromptDataset(_config()), prompts.PromptDataset(
        _config()
    )
    first.get_batch(0)
    np.testing.assert_array_equal(
        first.get_batch(3)["prompts"], second.get_batch(3)["prompts"]
    )
    self.assertIsNone(first.checkpoint_state(3))

  def test_seed_changes_the_prompts_and_the_provenance(self):
    a, b = prompts.PromptDataset(_config()), prompts.PromptDataset(
        _config(seed=5)
    )
    self.assertFalse(
        np.array_equal(a.get_batch(0)["prompts"], b.get_batch(0)["prompts"])
    )
    self.assertNotEqual(a.provenance(), b.provenance())
    self.assertEqual(a.provenance()["prompts"]["kind"], "progression_task")

  def test_bad_indices_name_themselves(self):
    data = prompts.PromptDataset(_config())
    with self.assertRaisesRegex(ValueError, "rollout -1"):
      data.get_batch(-1)
    with self.assertRaisesRegex(ValueError, "eval batch 1"):
      data.get_eval_batch(1)


if __name__ == "__main__":
  absltest.main()
