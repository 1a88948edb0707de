"""packed_batches: a rollout's micro-batches packed into fewer rows give the
same per-sequence log-probabilities, entropies, loss and metrics."""

import functools

from absl.testing import absltest
import jax
import numpy as np

from maxtext.generation import scoring
from maxtext.grpo.rollout import packed_batches
from maxtext.grpo.loss import policy_loss
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.grpo.rollout import rollout_batches
from maxtext.grpo.loss import train_loss
from testing import progression_rollouts
from testing import tiny_configs

_K = 2


class PackedBatchesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = tiny_configs.model_config()
    config.packing = True
    # Rows of 20 tokens; sequences of 4..9: several share a packed row.
    cls.config, cls.params, cls.result = progression_rollouts.rollout(
        config, (5, 7, 11, 13), width=20
    )
    cls.padded = rollout_lib.micro_batches(cls.result, _K)
    cls.rows = packed_batches.num_rows(cls.padded, 1)
    cls.packed = [packed_batches.pack(b, cls.rows) for b in cls.padded]

  def test_fewer_rows_and_less_padding(self):
    lengths = self.result.completion_lengths
    self.assertGreater(len(set(lengths.tolist())), 1)  # Lengths differ.
    padded_rows = len(self.padded[0]["prompt_lengths"])
    self.assertLess(self.rows, padded_rows)
    self.assertEqual(self.packed[0]["tokens"].shape, (self.rows, 20))
    # Every sequence's tokens, once, in the packed rows.
    self.assertEqual(
        int(np.sum(self.packed[0]["segment_ids"] > 0)),
        int(np.sum(packed_batches.sequence_lengths(self.padded[0]))),
    )
    self.assertLess(
        packed_batches.padding_fraction(self.padded, self.rows),
        packed_batches.padding_fraction(self.padded),
    )

  def test_loss_and_every_metric_unchanged(self):
    options = policy_loss.LossOptions(temperature=1.0, beta=0.0)
    loss = jax.jit(lambda p, b: train_loss.loss_fn(p, b, self.config, options))
    for padded, packed in zip(self.padded, self.packed):
      padded_loss, padded_metrics = loss(self.params, padded)
      packed_loss, packed_metrics = loss(self.params, packed)
      np.testing.assert_allclose(packed_loss, padded_loss, rtol=1e-5, atol=1e-6)
      # The same metrics (names and kinds: the trees' structures) with the
      # same values.
      self.assertEqual(
          jax.tree_util.tree_structure(padded_metrics),
          jax.tree_util.tree_structure(packed_metrics),
      )
      jax.tree_util.tree_map_with_path(
          lambda path, a, b: np.testing.assert_allclose(
              b, a, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path)
          ),
          padded_metrics,
          packed_metrics,
      )

  def test_per_sequence_log_probs_entropy_and_token_counts(self):
    padded, packed = self.padded[0], self.packed[0]
    mask = padded["mask"]
    want = scoring.completion_log_probs_and_entropy(
        self.params,
        padded["tokens"],
        padded["prompt_lengths"],
        mask.shape[1],
        self.config,
    )
    got = scoring.packed_completion_log_probs_and_entropy(
        self.params,
        packed["tokens"],
        packed["segment_ids"],
        packed["positions"],
        packed["completion_at"],
        self.config,
    )
    for w, g in zip(want, got):
      np.testing.assert_allclose(g * mask, w * mask, rtol=1e-5, atol=1e-5)
    # Per-sequence sums of log-probabilities and token counts.
    np.testing.assert_allclose(
        np.sum(got[0] * mask, 1), np.sum(want[0] * mask, 1), rtol=1e-5
    )
    np.testing.assert_array_equal(
        np.sum(packed["mask"], 1), np.sum(padded["mask"], 1)
    )
    # Advantages and the rest per sequence ride along as they were.
    for name in ("advantages", "old_log_probs", "sequence_mask"):
      np.testing.assert_array_equal(packed[name], padded[name])

  def test_reference_log_probs_unchanged(self):
    def whole(batches):
      return {
          name: np.concatenate([b[name] for b in batches])
          for name in batches[0]
      }

    reference = functools.partial(
        # The step's reference pass is step.py's own; its cut of the
        # stacked rows is what this checks.
        # pylint: disable-next=protected-access
        rollout_batches._micro_batches_with_reference,
        num_micro_batches=_K,
        config=self.config,
        mesh=None,
    )
    padded = reference(self.params, whole(self.padded), 1.0)
    packed = reference(self.params, whole(self.packed), 1.0)
    for p, q in zip(padded, packed):
      np.testing.assert_allclose(
          q["ref_log_probs"], p["ref_log_probs"], rtol=1e-5, atol=1e-5
      )
      self.assertEqual(q["tokens"].shape, (self.rows, 20))


if __name__ == "__main__":
  absltest.main()
