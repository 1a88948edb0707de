"""advantages: each estimator against a loop written from its definition."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.core import choices
from maxtext.grpo import advantages


def _reference(rewards, estimator, eps):
  """Element by element, straight from each estimator's definition."""
  out = np.zeros_like(rewards)
  for p, group in enumerate(rewards):
    g = len(group)
    for i, r in enumerate(group):
      mean = sum(group) / g
      if estimator == "grpo":
        var = sum((x - mean) ** 2 for x in group) / (g - 1)
        out[p, i] = (r - mean) / (var**0.5 + eps)
      elif estimator == "dr_grpo":
        out[p, i] = r - mean
      else:
        others = [x for j, x in enumerate(group) if j != i]
        out[p, i] = r - sum(others) / len(others)
  return out


class AdvantagesTest(parameterized.TestCase):

  def test_estimators_are_the_config_choices(self):
    self.assertEqual(advantages.ESTIMATORS, choices.GRPO_ADVANTAGE_ESTIMATORS)

  @parameterized.named_parameters(
      (name, name) for name in advantages.ESTIMATORS
  )
  def test_matches_definition(self, estimator):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(5, 4))
    rewards[2] = 0.7  # A group of equal rewards.
    got = advantages.group_advantages(rewards, estimator, eps=1e-4)
    want = _reference(rewards, estimator, 1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    self.assertEqual(got.dtype, np.float32)
    np.testing.assert_array_equal(got[2], 0.0)

  def test_grpo_normalises_each_group(self):
    rewards = np.array([[0.0, 1.0, 0.0, 1.0], [0.0, 10.0, 0.0, 10.0]])
    got = advantages.group_advantages(rewards, "grpo", eps=0.0)
    # Scaled rewards give the same advantages; each group has std 1 (ddof 1).
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6)
    np.testing.assert_allclose(np.std(got, axis=1, ddof=1), [1.0, 1.0])

  def test_rloo_is_scaled_dr_grpo(self):
    rewards = np.array([[1.0, 2.0, 6.0]])
    np.testing.assert_allclose(
        advantages.group_advantages(rewards, "rloo"),
        1.5 * advantages.group_advantages(rewards, "dr_grpo"),
        rtol=1e-6,
    )

  def test_zero_std_fraction(self):
    rewards = np.array([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [2.0, 3.0]])
    self.assertEqual(advantages.zero_std_fraction(rewards), 0.5)

  @parameterized.named_parameters(
      ("one_generation", np.zeros((3, 1)), "grpo", "at least 2 generations"),
      ("flat", np.zeros(6), "grpo", r"shape \[prompts, generations\]"),
      ("nan", np.array([[0.0, np.nan]]), "grpo", "finite"),
      ("estimator", np.zeros((2, 2)), "ppo", "estimator='ppo'"),
  )
  def test_rejects(self, rewards, estimator, message):
    with self.assertRaisesRegex(ValueError, message):
      advantages.group_advantages(rewards, estimator)


if __name__ == "__main__":
  absltest.main()
