"""The math task: splits, answers, the math-verify verifier, demonstrations."""

from absl.testing import absltest

from maxtext.env import math_task
from maxtext.env import tasks


class MathTaskTest(absltest.TestCase):

  def test_problems_are_right_and_reproducible(self):
    for index in range(200):
      record = math_task.problem(index)
      self.assertEqual(record, math_task.problem(index))
      # The worked solution computes the answer.
      left, right = record["working"].split("=")
      # Our own arithmetic text: "3*4+2".
      self.assertEqual(eval(left), int(right))  # pylint: disable=eval-used
      self.assertEqual(right, record["answer"])

  def test_splits_are_disjoint_and_seeded(self):
    task = tasks.load("maxtext.env.math_task:make_task", num_eval=20, seed=1)
    held_out = {r["prompt"] for r in task.eval_records()}
    self.assertLen(task.eval_records(), 20)
    train = [r["prompt"] for s in range(30) for r in task.train_records(s, 8)]
    self.assertEmpty(held_out & set(train))
    self.assertEqual(task.train_records(3, 8), task.train_records(3, 8))
    self.assertNotEqual(task.train_records(3, 8), task.train_records(4, 8))
    other = math_task.make_task(num_eval=20, seed=2)
    self.assertNotEqual(other.train_records(3, 8), task.train_records(3, 8))
    self.assertEqual(other.eval_records(), task.eval_records())

  def test_verifier(self):
    self.assertEqual(math_task.correct("q", "3*4=12. \\boxed{12}", "12"), 1.0)
    self.assertEqual(math_task.correct("q", "It is 12.0", "12"), 1.0)
    self.assertEqual(math_task.correct("q", "\\boxed{13}", "12"), 0.0)
    self.assertEqual(math_task.correct("q", "no idea", "12"), 0.0)
    self.assertEqual(math_task.correct("q", "", "12"), 0.0)

  def test_demonstrations_pass_the_verifier(self):
    task = math_task.make_task(num_eval=5)
    for record in task.eval_records() + task.train_records(0, 10):
      messages = task.demonstration(record)
      self.assertEqual(messages[0]["content"], record["prompt"])
      self.assertEqual(
          math_task.correct(
              record["prompt"], messages[-1]["content"], record["answer"]
          ),
          1.0,
      )

  def test_bad_task_names(self):
    with self.assertRaisesRegex(ValueError, "grpo_task='x'"):
      tasks.load("x", 1, 0)
    with self.assertRaisesRegex(ValueError, "does not import"):
      tasks.load("no_such_module_q:f", 1, 0)
    with self.assertRaisesRegex(ValueError, "has no nope"):
      tasks.load("maxtext.env.math_task:nope", 1, 0)
    with self.assertRaisesRegex(ValueError, "must take num_eval and seed"):
      tasks.load("maxtext.env.math_task:problem", 1, 0)
    with self.assertRaisesRegex(ValueError, "not a maxtext.env.tasks.Task"):
      tasks.load("builtins:dict", 1, 0)


if __name__ == "__main__":
  absltest.main()
