"""advantages: each estimator against a loop written from its definition."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.core import choices
from maxtext.grpo.loss import advantages


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
      elif estimator == "rloo":
        others = [x for j, x in enumerate(group) if j != i]
        out[p, i] = r - sum(others) / len(others)
      else:  # rloo_normalized
        others = [x for j, x in enumerate(group) if j != i]
        b = sum(others) / len(others)
        if len(others) > 1 and len(set(others)) > 1:
          s = (sum((x - b) ** 2 for x in others) / (len(others) - 1)) ** 0.5
        else:
          s = 0.0
        out[p, i] = (r - b) / (s + eps) if s > 0 else r - b
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

  @parameterized.product(
      estimator=advantages.ESTIMATORS,
      reward=[0.1, 0.7, 1.0 / 3.0],
      g=[2, 3, 6, 7, 16],
      eps=[0.0, 1e-6, 1e-4],
  )
  def test_equal_rewards_are_exactly_zero(self, estimator, reward, g, eps):
    # Rounding puts each member ~1e-17 off the group mean; a tiny eps (or
    # none) would make that an advantage of one sign for the whole group.
    rewards = np.full((2, g), reward)
    rewards[1, 0] = reward + 1.0  # A group that does teach.
    got = advantages.group_advantages(rewards, estimator, eps=eps)
    np.testing.assert_array_equal(got[0], np.zeros(g, np.float32))
    self.assertTrue(np.all(np.isfinite(got)))
    self.assertGreater(np.abs(got[1]).max(), 0.1)

  @parameterized.named_parameters(("g3", 3), ("g4", 4), ("g16", 16))
  def test_rloo_normalized_uses_the_leave_one_out_std(self, g):
    rng = np.random.default_rng(g)
    rewards = rng.integers(0, 3, size=(6, g)).astype(np.float64) * 0.5
    got = advantages.group_advantages(rewards, "rloo_normalized", eps=1e-6)
    np.testing.assert_allclose(
        got,
        _reference(rewards, "rloo_normalized", 1e-6),
        rtol=1e-5,
        atol=1e-6,
    )
    # Not the whole group's std: one right of four, leave-one-out.
    one = advantages.group_advantages(
        np.array([[1.0, 0.0, 0.0, 0.0]]), "rloo_normalized", eps=0.0
    )
    # The right one: its others (0, 0, 0) have std 0, so r - b = 1.
    self.assertEqual(one[0, 0], 1.0)
    # A wrong one: others (1, 0, 0), b = 1/3, s = sqrt(1/3) (ddof 1).
    np.testing.assert_allclose(
        one[0, 1], (0 - 1 / 3) / np.sqrt(1 / 3), rtol=1e-6
    )

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
