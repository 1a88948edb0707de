"""rewards: parsing, importing and calling the functions a config names."""

import math
import time

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.grpo.rewards import rewards


def length_reward(prompt, completion):
  """A test reward: the completion's length over the prompt's."""
  return len(completion) / len(prompt)


def first_id(prompt, completion):
  """A test reward: the completion's first id (0 when empty)."""
  del prompt
  return completion[0] if completion else 0


def broken(prompt, completion):
  """A test reward that fails on the third completion it sees."""
  del prompt
  if completion == (7,):
    raise KeyError("no such answer")
  return 1.0


def not_a_number(prompt, completion):
  del prompt, completion
  return math.nan


def a_string(prompt, completion):
  del prompt, completion
  return "1.0"


NOT_CALLABLE = 3


class ParseTest(parameterized.TestCase):

  def test_names_and_weights(self):
    self.assertEqual(
        rewards.parse(" a.b:f=0.5, c:g ,d:h=-2"),
        [("a.b:f", 0.5), ("c:g", 1.0), ("d:h", -2.0)],
    )

  @parameterized.named_parameters(
      ("empty", " , ", "name at least one"),
      ("no_function", "a.b", r"'a.b' is not module:function"),
      ("no_module", ":f", r"':f' is not module:function"),
      ("two_colons", "a:b:c", r"'a:b:c' is not module:function"),
      ("weight", "a:f=x", "weight that is not a number"),
      ("inf_weight", "a:f=inf", "weight must be finite"),
      ("same_name", "a:f,b:f", "share a name"),
  )
  def test_refuses(self, spec, message):
    with self.assertRaisesRegex(
        ValueError, r"config\.grpo_reward_functions.*" + message
    ):
      rewards.parse(spec)


class LoadTest(absltest.TestCase):

  def test_loads_functions(self):
    loaded = rewards.load("__main__:length_reward=2,__main__:first_id")
    self.assertEqual([f.fn for f in loaded], [length_reward, first_id])
    self.assertEqual([f.weight for f in loaded], [2.0, 1.0])
    self.assertEqual(loaded[0].short_name, "length_reward")

  def test_moved_module_names_load_the_same_function(self):
    old, new = (
        f"{module}:exact_match"
        for module in (
            "maxtext.grpo.progression_task",
            "maxtext.grpo.tasks.progression_task",
        )
    )
    self.assertIs(rewards.load(old)[0].fn, rewards.load(new)[0].fn)

  def test_module_that_does_not_import(self):
    with self.assertRaisesRegex(
        ValueError,
        r"'no_such_module_xyz:f' does not import: ModuleNotFoundError",
    ):
      rewards.load("no_such_module_xyz:f")

  def test_missing_or_not_callable(self):
    for name in ("missing", "NOT_CALLABLE"):
      with self.assertRaisesRegex(
          ValueError, f"module '__main__' has no function '{name}'"
      ):
        rewards.load(f"__main__:{name}")


class ScoreTest(absltest.TestCase):

  def test_weighted_sum_and_per_function(self):
    functions = rewards.load("__main__:length_reward=2,__main__:first_id=0.5")
    prompts = [[1, 2], [3, 4, 5, 6]]
    completions = [[9], [4, 4], [], [8, 1]]
    got = rewards.score(functions, prompts, completions, 2)
    np.testing.assert_allclose(
        got.per_function["length_reward"], [0.5, 1.0, 0.0, 0.5]
    )
    np.testing.assert_allclose(got.per_function["first_id"], [9, 4, 0, 8])
    np.testing.assert_allclose(got.total, [5.5, 4.0, 0.0, 5.0])

  def test_raising_function_is_one_line_naming_it(self):
    functions = rewards.load("__main__:broken")
    with self.assertRaises(rewards.RewardError) as caught:
      rewards.score(functions, [[1, 2], [3, 4]], [[1], [2], [3], [7]], 2)
    message = str(caught.exception)
    self.assertEqual(
        message,
        "reward function __main__:broken on prompt 1 (sample 1) raised "
        "KeyError: 'no such answer'",
    )

  def test_non_finite_and_non_numbers_are_errors(self):
    for name, shown in (("not_a_number", "nan"), ("a_string", "'1.0'")):
      with self.assertRaisesRegex(
          rewards.RewardError,
          rf"^reward function __main__:{name} on prompt 0 \(sample 0\) "
          rf"returned {shown}",
      ):
        rewards.score(rewards.load(f"__main__:{name}"), [[1]], [[2], [3]], 2)

  def test_values_no_float_holds_and_exits_are_errors(self):
    for name, shown in (
        ("huge", "returned an integer of 401 digits, too large for a float"),
        ("exits", "raised SystemExit: 0"),
    ):
      with self.subTest(name):
        in_process = rewards.load(f"testing.hostile_rewards:{name}")
        in_worker = rewards.load(f"testing.hostile_rewards:{name}", 30.0)
        self.assertIsNone(in_process[0].worker)
        self.assertIsNotNone(in_worker[0].worker)
        for functions in (in_process, in_worker):
          with self.assertRaises(rewards.RewardError) as caught:
            rewards.score(functions, [[1]], [[2], [3]], 2)
          self.assertEqual(
              str(caught.exception),
              f"reward function testing.hostile_rewards:{name} on prompt 0 "
              f"(sample 0) {shown}"
              + (": a reward is a finite number" if name == "huge" else ""),
          )

  def test_weights_that_make_the_total_infinite_are_an_error(self):
    functions = rewards.load(
        "testing.hostile_rewards:near_max,"
        "testing.hostile_rewards:constant=1e308"
    )
    with self.assertRaises(rewards.RewardError) as caught:
      rewards.score(functions, [[1]], [[2], [3]], 2)
    self.assertEqual(
        str(caught.exception),
        "the weighted reward of prompt 0 (sample 0) is inf: weights x values "
        "1 x 1.7e+308 + 1e+308 x 0.5 overflow (config.grpo_reward_functions)",
    )

  def test_worker_gives_the_same_values(self):
    spec = (
        "maxtext.grpo.rewards.rewards_test:length_reward=2,"
        "testing.hostile_rewards:constant"
    )
    prompts = [[1, 2], [3, 4, 5, 6]]
    completions = [[9], [4, 4], [], [8, 1]]
    here = rewards.score(rewards.load(spec), prompts, completions, 2)
    there = rewards.score(rewards.load(spec, 30.0), prompts, completions, 2)
    np.testing.assert_array_equal(here.total, there.total)
    np.testing.assert_array_equal(here.total, [1.5, 2.5, 0.5, 1.5])

  def test_a_started_worker_serves_the_calls_after_it(self):
    # The child process is the worker's own; the test reads it to see it
    # started once.
    # pylint: disable=protected-access
    functions = rewards.load("testing.hostile_rewards:constant", 30.0)
    worker = functions[0].worker
    self.assertIsNone(worker._process)
    worker.start()
    child = worker._process
    self.assertIsNone(child.poll())
    worker.start()  # Running: not started again.
    rewards.score(functions, [[1]], [[2], [3]], 2)
    self.assertIs(worker._process, child)
    worker.close()

  def test_a_hung_reward_is_stopped_at_the_timeout(self):
    functions = rewards.load(
        "testing.hostile_rewards:constant,testing.hostile_rewards:hangs", 1.0
    )
    worker = functions[0].worker
    began = time.monotonic()
    with self.assertRaises(rewards.RewardError) as caught:
      rewards.score(functions, [[1], [2]], [[2], [3], [4], [5]], 2)
    self.assertLess(time.monotonic() - began, 20)
    self.assertEqual(
        str(caught.exception),
        "reward function testing.hostile_rewards:hangs on prompt 0 (sample 0) "
        "did not return within 1 s (config.grpo_reward_timeout_seconds); it "
        "was stopped",
    )
    # Stopped: the process is gone; the next call starts a new one.
    self.assertIsNone(worker._process)  # pylint: disable=protected-access
    with self.assertRaisesRegex(rewards.RewardError, "did not return"):
      rewards.score(functions, [[1]], [[2], [3]], 2)

  def test_a_reward_that_ends_its_process_is_an_error(self):
    functions = rewards.load("testing.hostile_rewards:dies", 30.0)
    with self.assertRaises(rewards.RewardError) as caught:
      rewards.score(functions, [[1]], [[2], [3]], 2)
    self.assertEqual(
        str(caught.exception),
        "reward function testing.hostile_rewards:dies on prompt 0 (sample 0) "
        "ended the reward worker process (exit status 3)",
    )

  def test_text_form_gets_texts_and_the_records_fields(self):
    spec = "testing.hostile_rewards:contains_answer"
    prompts = ["What is 2+2?", "What is 3+3?"]
    completions = ["It is 4.", "5", "6!", "six"]
    fields = [{"answer": 4, "id": "a"}, {"answer": 6, "id": "b"}]
    for timeout in (None, 30.0):
      functions = rewards.load(spec, timeout)
      got = rewards.score(functions, prompts, completions, 2, fields)
      np.testing.assert_array_equal(got.total, [1, 0, 1, 0])
      for f in functions:
        if f.worker is not None:
          f.worker.close()
    with self.assertRaisesRegex(rewards.RewardError, "missing 1 required"):
      rewards.score(rewards.load(spec), prompts, completions, 2)

  def test_timeout_must_be_positive(self):
    with self.assertRaisesRegex(
        ValueError, r"grpo_reward_timeout_seconds=0: must be > 0"
    ):
      rewards.load("testing.hostile_rewards:constant", 0)

  def test_counts_must_match(self):
    with self.assertRaisesRegex(ValueError, "3 completions for 1 prompts"):
      rewards.score([], [[1]], [[1], [2], [3]], 2)


if __name__ == "__main__":
  absltest.main()
