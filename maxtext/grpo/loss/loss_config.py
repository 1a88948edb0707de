"""A GRPO run's loss settings: `LossConfig`.

The loss package's settings class (`maxtext/core/component_config.py`):
the `grpo_*` fields of the policy loss (`options` makes its
`policy_loss.LossOptions`, which refuses a bad combination) and whether
the MoE router trains (`grpo_freeze_router`, `frozen_router`). The
fields' ranges are `config_lib.validate_grpo`'s.
"""

import dataclasses

from maxtext.core import component_config
from maxtext.grpo.loss import policy_loss


@dataclasses.dataclass(frozen=True)
class LossConfig(component_config.ComponentConfig):
  """The loss's fields (`maxtext/configs/base.py` documents each; 0 turns
  off the optional bounds and the threshold, and `grpo_epsilon_high` 0 is
  `grpo_epsilon`)."""

  grpo_epsilon: float = 0.2
  grpo_epsilon_high: float = 0.0
  grpo_beta: float = 0.0
  grpo_kl_estimator: str = "k3"
  grpo_loss_aggregation: str = "token_mean"
  grpo_max_completion_length: int = 8
  grpo_temperature: float = 1.0
  grpo_force_on_policy_ratio: bool = False
  grpo_tis_ratio_min: float = 0.0
  grpo_tis_ratio_max: float = 0.0
  grpo_logprob_error_threshold: float = 0.0
  grpo_freeze_router: bool = False

  def options(self) -> policy_loss.LossOptions:
    """The policy loss's options.

    Raises:
      ValueError: as `policy_loss.LossOptions`.
    """
    return policy_loss.LossOptions(
        epsilon=self.grpo_epsilon,
        epsilon_high=self.grpo_epsilon_high or None,
        beta=self.grpo_beta,
        kl_estimator=self.grpo_kl_estimator,
        aggregation=self.grpo_loss_aggregation,
        max_completion_length=self.grpo_max_completion_length,
        temperature=self.grpo_temperature,
        force_on_policy_ratio=self.grpo_force_on_policy_ratio,
        # Truncated importance sampling is on when its upper bound is set
        # (its lower bound may be 0).
        tis_ratio_min=(
            self.grpo_tis_ratio_min if self.grpo_tis_ratio_max else None
        ),
        tis_ratio_max=self.grpo_tis_ratio_max or None,
        logprob_error_threshold=self.grpo_logprob_error_threshold or None,
    )
