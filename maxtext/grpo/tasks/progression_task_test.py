"""progression_task: prompts, held-out split and the verifiable rewards."""

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.data import builtin_datasets
from maxtext.grpo.tasks import progression_task as task_lib


class RewardTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("right", [3, 5, 7], [9, 11], 1.0, 1.0),
      ("wrong_last", [3, 5, 7], [9, 12], 0.0, 0.5),
      ("wrong_first", [3, 5, 7], [10, 11], 0.0, 0.0),
      ("empty", [3, 5], [], 0.0, 0.0),
      ("step_five", [10, 15], [20, 25, 30], 1.0, 1.0),
  )
  def test_rewards(self, prompt, completion, exact, prefix):
    self.assertEqual(task_lib.exact_match(prompt, completion), exact)
    self.assertEqual(task_lib.prefix_match(prompt, completion), prefix)

  def test_short_prompt_is_an_error(self):
    with self.assertRaisesRegex(ValueError, "2 terms"):
      task_lib.exact_match([3], [4])


class TaskTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.task = task_lib.ProgressionTask(256, 4, 6, num_eval=64, seed=3)

  def test_prompts_are_progressions_that_fit(self):
    for prompt in self.task.train_prompts(0, 32) + self.task.eval_prompts():
      self.assertLen(prompt, 4)
      step = prompt[1] - prompt[0]
      self.assertIn(step, builtin_datasets.SYNTHETIC_STEPS)
      self.assertEqual(prompt, [prompt[0] + step * t for t in range(4)])
      answer = task_lib.expected_continuation(prompt, 6)
      self.assertLess(max(answer), 256)
      self.assertEqual(task_lib.exact_match(prompt, answer), 1.0)

  def test_held_out_prompts_are_never_trained_on(self):
    held_out = {tuple(p) for p in self.task.eval_prompts()}
    self.assertLen(held_out, 64)
    for step in range(50):
      for prompt in self.task.train_prompts(step, 16):
        self.assertNotIn(tuple(prompt), held_out)

  def test_training_prompts_are_a_function_of_seed_and_step(self):
    again = task_lib.ProgressionTask(256, 4, 6, num_eval=64, seed=3)
    self.assertEqual(self.task.train_prompts(7, 8), again.train_prompts(7, 8))
    self.assertNotEqual(
        self.task.train_prompts(7, 8), self.task.train_prompts(8, 8)
    )
    other = task_lib.ProgressionTask(256, 4, 6, num_eval=64, seed=4)
    self.assertNotEqual(
        self.task.train_prompts(7, 8), other.train_prompts(7, 8)
    )
    self.assertEqual(self.task.eval_prompts(), other.eval_prompts())

  def test_answers(self):
    self.assertEqual(
        self.task.answers([[1, 3, 5, 7]]), [[9, 11, 13, 15, 17, 19]]
    )

  def test_impossible_tasks(self):
    with self.assertRaisesRegex(ValueError, "grpo_prompt_length=1"):
      task_lib.ProgressionTask(256, 1, 6, num_eval=4)
    with self.assertRaisesRegex(ValueError, "grpo_eval_prompts=100000"):
      task_lib.ProgressionTask(256, 4, 6, num_eval=100000)


if __name__ == "__main__":
  absltest.main()
