"""Group-relative advantages: each completion's reward against its group's.

A GRPO rollout draws G completions of each of P prompts; the G completions of
one prompt are a group. The advantage of a completion is its reward compared
with the other rewards of its group, so no value network is needed:

* "grpo": (r - group mean) / (group std + eps), the std being the sample
  standard deviation (ddof = 1, as TRL and verl compute it);
* "dr_grpo": r - group mean (Dr.GRPO drops the std, which weights groups of
  nearly equal rewards up);
* "rloo": r minus the mean of the *other* G - 1 rewards of the group (the
  leave-one-out baseline), which is G / (G - 1) x (r - group mean);
* "rloo_normalized": the leave-one-out baseline with reward normalisation,
  as NeMo-RL's GRPO advantage with `use_leave_one_out_baseline` and
  `normalize_rewards` (the MLPerf qwen35_397b_grpo reference):
  (r - b) / (s + eps), where b is the mean of the other G - 1 rewards and s
  their standard deviation with ddof = 1 (the leave-one-out std, not the
  whole group's); where s is 0 (the others all equal, or G = 2) the
  advantage is r - b, unnormalised ("don't sharpen the ones with no
  variation").

A group whose rewards are all equal has advantage exactly 0 everywhere under
every estimator and every eps, 0 included: it teaches nothing
(`frac_reward_zero_std` counts such groups). Rounding would otherwise leave
each member about 1e-17 to one side of the group mean, which a small eps
turns into advantages of one sign. Likewise "rloo_normalized" takes the std
of equal others as exactly 0. Rewards live on the host (reward functions
are Python), so this is NumPy.
"""

import numpy as np

from maxtext.core import choices
from maxtext.grpo.loss import registry

# The estimators by name: each takes the checked rewards, float64 [P, G],
# and eps (>= 0), and returns the [P, G] advantages before the equal-rewards
# rule of `group_advantages`. A new estimator is one function registered
# here under a name of maxtext.core.choices.GRPO_ADVANTAGE_ESTIMATORS.
_ESTIMATORS = registry.Registry(
    "grpo_advantage_estimator", choices.GRPO_ADVANTAGE_ESTIMATORS
)


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
    eps: added to the std ("grpo", "rloo_normalized"); >= 0 (0 is safe: a
      group of equal rewards is 0 without a division).

  Returns:
    float32 [P, G] advantages.

  Raises:
    ValueError: an unknown estimator, a bad shape, G < 2, non-finite rewards
      or eps < 0.
  """
  rewards = _check_rewards(rewards)
  if eps < 0:
    raise ValueError(f"eps={eps!r}: must be >= 0")
  out = _ESTIMATORS[estimator](rewards, eps)
  # Equal rewards: exactly 0, whatever rounding and eps made of them.
  out = np.where(_all_equal(rewards)[:, None], 0.0, out)
  return out.astype(np.float32)


def per_completion(
    total: np.ndarray, num_generations: int, estimator: str, eps: float
) -> np.ndarray:
  """`group_advantages` of prompt-major rewards float [N] (N = P x G), as
  float32 [N]."""
  return group_advantages(
      np.reshape(total, (-1, num_generations)), estimator, eps
  ).reshape(-1)


def _centred(rewards: np.ndarray) -> np.ndarray:
  """Each reward minus its group's mean."""
  return rewards - rewards.mean(axis=1, keepdims=True)


@_ESTIMATORS.register("grpo")
def _grpo(rewards: np.ndarray, eps: float) -> np.ndarray:
  """(r - group mean) / (group std (ddof 1) + eps)."""
  centred = _centred(rewards)
  denominator = rewards.std(axis=1, ddof=1, keepdims=True) + eps
  return np.divide(
      centred,
      denominator,
      out=np.zeros_like(centred),
      where=denominator > 0,
  )


@_ESTIMATORS.register("dr_grpo")
def _dr_grpo(rewards: np.ndarray, eps: float) -> np.ndarray:
  """r - group mean (eps unused)."""
  del eps
  return _centred(rewards)


@_ESTIMATORS.register("rloo")
def _rloo(rewards: np.ndarray, eps: float) -> np.ndarray:
  """r - the mean of the other G - 1 rewards = G / (G - 1) (r - mean)."""
  del eps
  g = rewards.shape[1]
  return _centred(rewards) * (g / (g - 1))


def _all_equal(values: np.ndarray) -> np.ndarray:
  """Whether each row (the last axis) holds one value only."""
  return np.all(values == values[..., :1], axis=-1)


@_ESTIMATORS.register("rloo_normalized")
def _leave_one_out_normalized(rewards: np.ndarray, eps: float) -> np.ndarray:
  """(r - b) / (s + eps) with the others' mean b and std s (ddof 1)."""
  g = rewards.shape[1]
  others_index = np.array(
      [[j for j in range(g) if j != i] for i in range(g)], np.int64
  )
  others = rewards[:, others_index]  # [P, G, G - 1]
  baseline = others.mean(axis=2)
  if g > 2:
    std = others.std(axis=2, ddof=1)
    std = np.where(_all_equal(others), 0.0, std)
  else:
    std = np.zeros_like(baseline)  # One other reward: no spread.
  centred = rewards - baseline
  safe = np.where(std > 0, std, 1.0)
  return np.where(std > 0, centred / (safe + eps), centred)


_ESTIMATORS.complete()
# The estimators' names (maxtext.core.choices.GRPO_ADVANTAGE_ESTIMATORS).
ESTIMATORS = _ESTIMATORS.names


def zero_std_fraction(rewards) -> float:
  """The fraction of groups whose rewards are all equal (they teach nothing).

  Args:
    rewards: float [P, G].
  """
  rewards = _check_rewards(rewards)
  return float(np.mean(np.all(rewards == rewards[:, :1], axis=1)))
