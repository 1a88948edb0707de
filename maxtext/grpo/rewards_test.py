"""rewards: parsing, importing and calling the functions a config names."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.grpo import rewards


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

  def test_counts_must_match(self):
    with self.assertRaisesRegex(ValueError, "3 completions for 1 prompts"):
      rewards.score([], [[1]], [[1], [2], [3]], 2)


if __name__ == "__main__":
  absltest.main()
