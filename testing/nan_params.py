"""A starting checkpoint whose parameters make every gradient non-finite.

Tests of the skip guard start a run from it through `load_parameters_path`:
one NaN in the unembedding makes every logit row it touches, and so every
step's loss and gradients, non-finite, whatever the workload's loss.
"""

import jax
import numpy as np

from maxtext.model import transformer
from maxtext.storage import checkpointing


def write(config, directory: str, seed: int = 0) -> dict:
  """Saves `config`'s model with a NaN in its unembedding as step 0 of the
  checkpoint directory `directory`; returns those parameters."""
  params = transformer.init_params(config, jax.random.PRNGKey(seed))
  params["unembedding"] = params["unembedding"].at[0, 0].set(np.nan)
  with checkpointing.Checkpointer(
      directory, save_period=1, max_to_keep=0
  ) as ckpt:
    ckpt.save(0, {"params": params, "step": np.asarray(0, np.int64)}, {})
  return params
