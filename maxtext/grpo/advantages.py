"""Group-relative advantages: each completion's reward against its group's.

A GRPO rollout draws G completions of each of P prompts; the G completions of
one prompt are a group. The advantage of a completion is its reward compared
with the other rewards of its group, so no value network is needed:

* "grpo": (r - group mean) / (group std + eps), the std being the sample
  standard deviation (ddof = 1, as TRL and verl compute it);
* "dr_grpo": r - group mean (Dr.GRPO drops the std, which weights groups of
  nearly equal rewards up);
* "rloo": r minus the mean of the *other* G - 1 rewards of the group (the
  leave-one-out baseline), which is G / (G - 1) x (r - group mean).

A group whose rewards are all equal has advantage 0 everywhere under every
estimator: it teaches nothing (`frac_reward_zero_std` counts such groups).
Rewards live on the host (reward functions are Python), so this is NumPy.
"""

import numpy as np

# The estimators by name (maxtext.core.choices.GRPO_ADVANTAGE_ESTIMATORS).
ESTIMATORS = ("grpo", "dr_grpo", "rloo")


def _check_rewards(rewards) -> np.ndarray:
  """`rewards` as float64 [P, G], checked: 2-D, G >= 2, finite."""
  rewards = np.asarray(rewards, dtype=np.float64)
  if rewards.ndim != 2:
    raise ValueError(
        f"rewards must have shape [prompts, generations]; got shape "
        f"{rewards.shape}"
    )
  if rewards.shape[1] < 2:
    raise ValueError(
        f"rewards: a group needs at least 2 generations; got "
        f"{rewards.shape[1]}"
    )
  if not np.all(np.isfinite(rewards)):
    raise ValueError("rewards must be finite")
  return rewards


def group_advantages(
    rewards, estimator: str = "grpo", eps: float = 1e-6
) -> np.ndarray:
  """The advantage of every completion.

  Args:
    rewards: float [P, G]: the reward of completion g of prompt p.
    estimator: one of ESTIMATORS.
    eps: added to the group std ("grpo" only), so a group of equal rewards
      divides 0 by eps, not by 0.

  Returns:
    float32 [P, G] advantages.

  Raises:
    ValueError: an unknown estimator, a bad shape, G < 2, non-finite rewards
      or eps < 0.
  """
  rewards = _check_rewards(rewards)
  if eps < 0:
    raise ValueError(f"eps={eps!r}: must be >= 0")
  mean = rewards.mean(axis=1, keepdims=True)
  centred = rewards - mean
  if estimator == "grpo":
    std = rewards.std(axis=1, ddof=1, keepdims=True)
    out = centred / (std + eps)
  elif estimator == "dr_grpo":
    out = centred
  elif estimator == "rloo":
    g = rewards.shape[1]
    out = centred * (g / (g - 1))
  else:
    raise ValueError(
        f"estimator={estimator!r}: must be one of {list(ESTIMATORS)}"
    )
  return out.astype(np.float32)


def zero_std_fraction(rewards) -> float:
  """The fraction of groups whose rewards are all equal (they teach nothing).

  Args:
    rewards: float [P, G].
  """
  rewards = _check_rewards(rewards)
  return float(np.mean(np.all(rewards == rewards[:, :1], axis=1)))
