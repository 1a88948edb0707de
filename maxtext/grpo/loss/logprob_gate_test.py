"""logprob_gate: the step's loss as the reference normalises it, any K."""

import dataclasses

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.grpo.loss import logprob_gate
from maxtext.grpo.loss import policy_loss
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.grpo.loss import train_loss
from testing import progression_rollouts
from testing import tiny_configs

_THRESHOLD = 2.0


class LogprobGateTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.config, cls.params, result = progression_rollouts.rollout(
        tiny_configs.model_config(), (5, 9, 13, 17), width=9
    )
    # Rows 2 and 9: the generator's log-probabilities 1.5 off the trained
    # policy's on every token (error e^1.5 > 2); row 13 is overlong.
    old = result.old_log_probs.copy()
    signs = np.where(np.arange(old.shape[1]) % 2, -1.5, 1.5)
    old[[2, 9]] += signs[None, :]
    sequence_mask = np.ones(len(old), np.float32)
    sequence_mask[13] = 0.0
    cls.result = dataclasses.replace(
        result,
        old_log_probs=old,
        sequence_mask=sequence_mask,
        advantages=np.linspace(-1.0, 1.5, len(old)).astype(np.float32),
    )
    cls.options = policy_loss.LossOptions(
        force_on_policy_ratio=True, logprob_error_threshold=_THRESHOLD
    )
    cls.gate = logprob_gate.Gate(_THRESHOLD, cls.config)

  def _step(self, k):
    """(loss, gradient) of the step over K gated micro-batches, averaged
    as the engine averages them."""
    batches = self.gate(
        self.params, rollout_lib.micro_batches(self.result, k), 1.0
    )
    value_and_grad = jax.jit(
        jax.value_and_grad(
            lambda p, b: train_loss.loss_fn(p, b, self.config, self.options)[0]
        )
    )
    losses, grads = zip(*(value_and_grad(self.params, b) for b in batches))
    grad = jax.tree.map(lambda *g: np.mean(np.asarray(g), axis=0), *grads)
    return float(np.mean(losses)), grad, batches

  def _reference_loss(self):
    """The reference's computation written out in NumPy: `prev` from a
    pass before training, the error gate taken out of the sample mask,
    the loss summed over the kept tokens and divided by their count."""
    r = self.result
    prev = np.asarray(
        train_loss.completion_log_probs_and_entropy(
            self.params,
            {
                "tokens": r.tokens,
                "prompt_lengths": r.prompt_lengths,
                "mask": r.mask,
            },
            self.config,
            1.0,
        )[0],
        np.float64,
    )
    gen = r.old_log_probs.astype(np.float64)
    mask = r.mask.astype(np.float64)
    sample_mask = r.sequence_mask.astype(np.float64).copy()
    for i, row in enumerate(mask):
      error = (np.exp(np.abs(gen[i] - prev[i])) * row).sum() / row.sum()
      if error > _THRESHOLD:
        sample_mask[i] = 0.0
    counted = mask * sample_mask[:, None]
    weights = np.exp(prev - gen)
    per_token = -r.advantages[:, None].astype(np.float64) * weights
    return (per_token * counted).sum() / counted.sum(), sample_mask

  def test_the_step_loss_is_the_references_for_any_k(self):
    want, sample_mask = self._reference_loss()
    # The rows built for the gate, and only they, leave the sample mask.
    np.testing.assert_array_equal(
        np.flatnonzero(self.result.sequence_mask - sample_mask), [2, 9]
    )
    one_loss, one_grad, (batch,) = self._step(1)
    np.testing.assert_allclose(one_loss, want, rtol=1e-5)
    np.testing.assert_array_equal(batch["sequence_mask"], sample_mask)
    np.testing.assert_array_equal(
        np.flatnonzero(batch["logprob_error_mask"]), [2, 9]
    )
    four_loss, four_grad, _ = self._step(4)
    np.testing.assert_allclose(four_loss, want, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        one_grad,
        four_grad,
    )
    # The gated rows' tokens left the step's normaliser (K = 1: the whole
    # count).
    counted = self.result.mask * self.result.sequence_mask[:, None]
    self.assertEqual(
        batch["token_normaliser"][0],
        counted.sum() - self.result.mask[[2, 9]].sum(),
    )

  def test_lazily_gated_reads_the_parameters_at_first_use(self):
    batches = rollout_lib.micro_batches(self.result, 2)
    # The parameters when the rollout's micro-batches are made (stale), and
    # those its update starts from, set before it reads them.
    stale = jax.tree.map(jnp.zeros_like, self.params)
    holder = {"params": stale}
    calls = []

    def gate(b):
      calls.append(1)
      return self.gate(holder["params"], b, 1.0)

    lazy = logprob_gate.LazilyGated(batches, gate)
    self.assertLen(lazy, 2)
    self.assertEmpty(calls)  # Nothing runs before an item is read.
    holder["params"] = self.params
    *head, last = lazy
    self.assertLen(calls, 1)
    gated = np.concatenate([b["logprob_error_mask"] for b in [*head, last]])
    np.testing.assert_array_equal(np.flatnonzero(gated), [2, 9])
    at_stale = self.gate(stale, batches, 1.0)
    self.assertFalse(
        np.array_equal(
            np.concatenate([b["logprob_error_mask"] for b in at_stale]), gated
        )
    )
    list(lazy)
    self.assertLen(calls, 1)  # Gated once.


if __name__ == "__main__":
  absltest.main()
