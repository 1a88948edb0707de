"""What a run asks of its data: the `Dataset` interface every data set has.

A data set is one process's share of a run's training and eval data.
Training batches are addressed by the global step, eval batches by their
index within an evaluation; both are dicts of NumPy arrays
{"inputs": int32 [B_local, S], "targets": int32 [B_local, S]}, with
targets[:, t] the token after inputs[:, t].

The run state (`maxtext/run/run_state.py`) calls these methods and nothing else:
`get_batch` and `get_eval_batch` in the loop, `checkpoint_state` beside each
checkpoint, `restore_checkpoint_state` on resume, `provenance` for the run's
`config.json`, `close` at the end. A data set whose batches are a pure
function of the step keeps the defaults of the last four: no state, nothing
to record, nothing to release. `maxtext/data/dataset_kinds.py` maps each
`config.dataset_type` to its implementation.
"""

import abc
from typing import Any, Optional

import numpy as np

Batch = dict[str, np.ndarray]


class Dataset(abc.ABC):
  """One process's rows of a run's training and eval batches."""

  @abc.abstractmethod
  def get_batch(self, step: int) -> Batch:
    """This process's rows of the training batch of global step `step`.

    Raises:
      ValueError: a step the data set cannot give (negative; for a data set
        read in order, not the next one).
    """

  @abc.abstractmethod
  def get_eval_batch(self, index: int) -> Batch:
    """This process's rows of eval batch `index` (eval_batch_size rows)."""

  def checkpoint_state(self, step: int) -> Optional[dict[str, Any]]:
    """The position from which `get_batch(step)` is read next.

    Saved beside the checkpoint of `step` completed steps, one per process
    (`maxtext/storage/data_state.py`).

    Returns:
      A JSON-serialisable dict, or None (the default) when the batches are
      a function of the step and there is no position to save.
    """
    del step

  def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
    """Puts back what `checkpoint_state` returned for this process.

    The default ignores it: a data set without state finds its position
    from the step it is asked for.
    """
    del state

  def provenance(self) -> Optional[dict[str, Any]]:
    """What `config.json` records about the data, or None (the default)."""
    return None

  def close(self) -> None:
    """Releases threads, processes and files; the default holds none."""
