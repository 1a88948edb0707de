"""A rollout drawn ahead, kept beside each checkpoint (grpo_max_age = 1).

With rollouts drawn one update ahead, the checkpoint of step s (s updates
done) comes after rollout s was drawn, with the parameters of step s - 1,
which the checkpoint no longer holds. A resume that drew rollout s again
would draw it with the parameters of step s: another rollout than an
uninterrupted run trains. So the rollout itself goes into the checkpoint:
its ids, masks, behaviour log-probabilities, rewards, advantages and
statistics, and every sample's version (`step.Prepared.versions`), a few
bytes per token, where keeping the parameters it was drawn with would cost
a second copy of the model and a second drawing (and a second call of the
reward functions and tools) on resume.

It travels as the GRPO data set's checkpoint state (`WithPendingRollout`
wraps the prompts' data set): the run state writes it beside each
checkpoint, one JSON file per process (`maxtext/storage/data_state.py`:
local checkpoint directories only), prunes it with the checkpoints and hands
it back on resume. Arrays are stored as their raw bytes (base64), so a
restored rollout is the saved one bit for bit.
"""

import base64
from typing import Any, Callable, Optional

import numpy as np

from maxtext.data import dataset as dataset_lib
from maxtext.grpo.rewards import rewards as rewards_lib
from maxtext.grpo.rollout import rollout as rollout_lib

# The state's key for the rollout, beside the wrapped data set's own.
KEY = "pending_rollout"
_INNER = "inner"
# The Rollout's arrays, saved by their bytes.
ARRAYS = (
    "tokens",
    "prompt_lengths",
    "completion_lengths",
    "mask",
    "old_log_probs",
    "advantages",
    "sequence_mask",
)


def _encode_array(x: np.ndarray) -> dict[str, Any]:
  x = np.ascontiguousarray(x)
  return {
      "dtype": x.dtype.str,
      "shape": list(x.shape),
      "data": base64.b64encode(x.tobytes()).decode("ascii"),
  }


def _decode_array(value: dict[str, Any], name: str) -> np.ndarray:
  try:
    data = base64.b64decode(value["data"], validate=True)
    x = np.frombuffer(data, np.dtype(value["dtype"]))
    return x.reshape(value["shape"]).copy()
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(
        f"pending rollout: array {name!r} is malformed: {e}"
    ) from e


def encode(
    index: int, rollout: rollout_lib.Rollout, versions: np.ndarray
) -> dict[str, Any]:
  """Rollout `index` and its samples' versions as a JSON-serialisable dict."""
  arrays = {name: getattr(rollout, name) for name in ARRAYS}
  if arrays["sequence_mask"] is None:
    del arrays["sequence_mask"]
  return {
      "index": int(index),
      "prompts": [[int(t) for t in p] for p in rollout.prompts],
      "completions": [[int(t) for t in c] for c in rollout.completions],
      "arrays": {name: _encode_array(x) for name, x in arrays.items()},
      "versions": _encode_array(np.asarray(versions, np.int64)),
      "rewards_total": _encode_array(rollout.rewards.total),
      "rewards_per_function": {
          name: _encode_array(x)
          for name, x in rollout.rewards.per_function.items()
      },
      "stats": {name: float(v) for name, v in rollout.stats.items()},
  }


def decode(
    value: dict[str, Any],
) -> tuple[int, rollout_lib.Rollout, np.ndarray]:
  """What `encode` wrote: (index, rollout, versions).

  Raises:
    ValueError: the state is not one `encode` wrote (names what is wrong).
  """
  try:
    arrays = {
        name: _decode_array(x, name) for name, x in value["arrays"].items()
    }
    versions = _decode_array(value["versions"], "versions")
    rewards = rewards_lib.Rewards(
        total=_decode_array(value["rewards_total"], "rewards_total"),
        per_function={
            name: _decode_array(x, name)
            for name, x in value["rewards_per_function"].items()
        },
    )
    rollout = rollout_lib.Rollout(
        prompts=[list(p) for p in value["prompts"]],
        completions=[tuple(c) for c in value["completions"]],
        rewards=rewards,
        stats=dict(value["stats"]),
        sequence_mask=arrays.pop("sequence_mask", None),
        **arrays,
    )
    index = int(value["index"])
  except (KeyError, TypeError) as e:
    raise ValueError(f"pending rollout: missing or malformed {e}") from e
  rows = len(rollout.completions)
  for name in (*ARRAYS, "versions"):
    x = versions if name == "versions" else getattr(rollout, name)
    if x is not None and len(x) != rows:
      raise ValueError(
          f"pending rollout: {name!r} has {len(x)} rows for {rows} samples"
      )
  return index, rollout, versions


class WithPendingRollout(dataset_lib.Dataset):
  """A data set whose checkpoint state also holds the rollout drawn ahead.

  Args:
    inner: the prompts' data set (every call but the state's goes to it).
    pending: step -> the encoded rollout that feeds update `step` (`encode`),
      or None when there is none.
    restore: called with the encoded rollout of a restored checkpoint.
  """

  def __init__(
      self,
      inner: dataset_lib.Dataset,
      pending: Callable[[int], Optional[dict[str, Any]]],
      restore: Callable[[dict[str, Any]], None],
  ):
    self._inner = inner
    self._pending = pending
    self._restore = restore

  def get_batch(self, step: int) -> dataset_lib.Batch:
    return self._inner.get_batch(step)

  def get_eval_batch(self, index: int) -> dataset_lib.Batch:
    return self._inner.get_eval_batch(index)

  def checkpoint_state(self, step: int) -> Optional[dict[str, Any]]:
    inner = self._inner.checkpoint_state(step)
    pending = self._pending(step)
    if pending is None and inner is None:
      return None
    return {_INNER: inner, KEY: pending}

  def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
    if state.get(_INNER) is not None:
      self._inner.restore_checkpoint_state(state[_INNER])
    if state.get(KEY) is not None:
      self._restore(state[KEY])

  def provenance(self) -> Optional[dict[str, Any]]:
    return self._inner.provenance()

  def close(self) -> None:
    self._inner.close()
