"""pending_rollout: a rollout through JSON and back; the data set's state."""

import json

from absl.testing import absltest
import numpy as np

from maxtext.data import dataset as dataset_lib
from maxtext.grpo.rollout import pending_rollout
from maxtext.grpo.rewards import rewards as rewards_lib
from maxtext.grpo.rollout import rollout as rollout_lib


def _rollout(seed: int = 0) -> rollout_lib.Rollout:
  rng = np.random.default_rng(seed)
  n, w, l = 4, 7, 3
  return rollout_lib.Rollout(
      prompts=[[5, 6, 7, 8], [9, 10]],
      completions=[(1, 2, 3), (4,), (), (11, 12)],
      tokens=rng.integers(0, 32, (n, w)).astype(np.int32),
      prompt_lengths=np.array([4, 4, 2, 2], np.int32),
      completion_lengths=np.array([3, 1, 0, 2], np.int32),
      mask=(rng.random((n, l)) > 0.5).astype(np.float32),
      # Values whose decimal printing would round: raw bytes keep them.
      old_log_probs=rng.standard_normal((n, l)).astype(np.float32) / 3,
      rewards=rewards_lib.Rewards(
          total=rng.random(n), per_function={"exact_match": rng.random(n)}
      ),
      advantages=rng.standard_normal(n).astype(np.float32),
      stats={"rewards/mean": 0.1 + 0.2, "timing/generate": 1.5},
      sequence_mask=np.array([1, 0, 1, 1], np.float32),
  )


class _Prompts(dataset_lib.Dataset):
  """A data set with a position of its own, as Grain's has."""

  def __init__(self):
    self.restored = None

  def get_batch(self, step):
    return {"prompts": np.full((2, 3), step)}

  def get_eval_batch(self, index):
    return {"prompts": np.full((2, 3), -index)}

  def checkpoint_state(self, step):
    return {"next": step}

  def restore_checkpoint_state(self, state):
    self.restored = state


class PendingRolloutTest(absltest.TestCase):

  def test_round_trip_through_json_is_bit_exact(self):
    rollout = _rollout()
    versions = np.array([6, 6, 6, 6], np.int64)
    text = json.dumps(pending_rollout.encode(7, rollout, versions))
    index, back, back_versions = pending_rollout.decode(json.loads(text))
    self.assertEqual(index, 7)
    np.testing.assert_array_equal(back_versions, versions)
    self.assertEqual(back.prompts, rollout.prompts)
    self.assertEqual(back.completions, rollout.completions)
    for name in pending_rollout.ARRAYS:
      ours, theirs = getattr(rollout, name), getattr(back, name)
      self.assertEqual(ours.dtype, theirs.dtype, name)
      self.assertEqual(ours.tobytes(), theirs.tobytes(), name)
    self.assertEqual(
        back.rewards.total.tobytes(), rollout.rewards.total.tobytes()
    )
    self.assertEqual(
        back.rewards.per_function["exact_match"].tobytes(),
        rollout.rewards.per_function["exact_match"].tobytes(),
    )
    self.assertEqual(back.stats, rollout.stats)
    # The micro-batches the loss reads are the same.
    for ours, theirs in zip(
        rollout_lib.micro_batches(rollout, 2),
        rollout_lib.micro_batches(back, 2),
    ):
      for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], name)

  def test_malformed_state_is_refused_in_one_line(self):
    value = pending_rollout.encode(1, _rollout(), np.zeros(4, np.int64))
    value["versions"] = pending_rollout.encode(
        1, _rollout(), np.zeros(3, np.int64)
    )["versions"]
    with self.assertRaisesRegex(
        ValueError, r"^pending rollout: 'versions' has 3 rows for 4 samples$"
    ):
      pending_rollout.decode(value)
    value = pending_rollout.encode(1, _rollout(), np.zeros(4, np.int64))
    value["arrays"]["mask"]["data"] = "not base64!"
    with self.assertRaisesRegex(
        ValueError, r"^pending rollout: array 'mask' is malformed"
    ):
      pending_rollout.decode(value)
    with self.assertRaisesRegex(ValueError, r"^pending rollout: missing"):
      pending_rollout.decode({"index": 1})

  def test_data_set_state_carries_both_and_restores_both(self):
    prompts = _Prompts()
    saved = pending_rollout.encode(3, _rollout(), np.zeros(4, np.int64))
    restored = []
    data = pending_rollout.WithPendingRollout(
        prompts,
        lambda step: saved if step == 3 else None,
        restored.append,
    )
    np.testing.assert_array_equal(data.get_batch(2)["prompts"], 2)
    np.testing.assert_array_equal(data.get_eval_batch(1)["prompts"], -1)
    state = json.loads(json.dumps(data.checkpoint_state(3)))
    self.assertEqual(state["inner"], {"next": 3})
    data.restore_checkpoint_state(state)
    self.assertEqual(prompts.restored, {"next": 3})
    self.assertLen(restored, 1)
    self.assertEqual(pending_rollout.decode(restored[0])[0], 3)
    # No rollout drawn ahead: only the data set's own position.
    self.assertEqual(
        data.checkpoint_state(4),
        {"inner": {"next": 4}, "pending_rollout": None},
    )


if __name__ == "__main__":
  absltest.main()
