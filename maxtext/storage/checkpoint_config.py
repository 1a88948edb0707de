"""Checkpointing's settings: `CheckpointConfig`, the config's fields of its
names (`maxtext/core/component_config.py`).

The run's `Checkpointer` (`maxtext.storage.checkpointing`) saves every
`save_period` steps and keeps the newest `max_checkpoints_to_keep`.
"""

import dataclasses

from maxtext.core import component_config


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(component_config.ComponentConfig):
  """When a run saves checkpoints and how many it keeps
  (`maxtext/configs/base.py` documents each field).

  Attributes:
    checkpoint_period: steps between checkpoints; 0 = only at the run's end.
    max_checkpoints_to_keep: the newest checkpoints kept; 0 = all.
    steps: the run's length, the period when checkpoint_period is 0.
  """

  checkpoint_period: int = 1000
  max_checkpoints_to_keep: int = 3
  steps: int = 1000

  @property
  def save_period(self) -> int:
    """`Checkpointer`'s save period: checkpoint_period, 0 = steps."""
    return self.checkpoint_period or self.steps

  def validate(self) -> None:
    """Raises ValueError naming the first field below its least value."""
    for key in ("checkpoint_period", "max_checkpoints_to_keep"):
      if getattr(self, key) < 0:
        raise component_config.fail(key, getattr(self, key), "must be >= 0")
