"""rollout_batches: a rollout's micro-batches, and the update they train,
on the real engine and a tiny model (the loop's dispatch of them, and their
records in a run: `rollout_source_test`)."""

import functools

from absl.testing import absltest
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from maxtext.engine import engine as engine_lib
from maxtext.generation import scoring
from maxtext.grpo.loss import policy_loss
from maxtext.grpo.tasks import progression_task
from maxtext.grpo.rewards import rewards
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.grpo.rollout import rollout_batches
from maxtext.grpo.loss import train_loss
from maxtext.metrics import recorder as recorder_lib
from maxtext.model import transformer
from maxtext.generation import sampling
from maxtext.run import batch_source
from testing import dispatch_counter
from testing import tiny_configs


def _copy(tree):
  """A copy of every array of `tree` (the engine donates its own)."""
  return jax.tree_util.tree_map(jnp.copy, tree)


def _policy(engine) -> batch_source.Policy:
  """The engine's parameters now, as the loop hands them to a draw."""
  return batch_source.Policy(engine.params, engine.step)


class RolloutBatchesTest(absltest.TestCase):

  def _step(self, beta=0.04, learning_rate=1e-2):
    """An engine with the GRPO loss and its RolloutBatches on the
    progression task."""
    config = tiny_configs.model_config()
    frozen = ml_collections.FrozenConfigDict(config)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    task = progression_task.ProgressionTask(32, 3, 4, num_eval=8, seed=0)
    options = policy_loss.LossOptions(beta=beta)
    engine = engine_lib.Engine(
        functools.partial(train_loss.loss_fn, config=frozen, options=options),
        params,
        optax.adam(learning_rate),
        learning_rate,
        recorder_lib.MetricsRecorder(),
        2,
    )
    reference = _copy(params) if beta > 0 else None
    step = rollout_batches.RolloutBatches(
        engine,
        frozen,
        lambda s: task.train_prompts(s, 4),
        lambda s: sampling.SamplingOptions(
            max_new_tokens=4,
            temperature=1.0,
            seed=rollout_lib.step_seed(0, s),
            num_samples=4,
        ),
        rewards.load("maxtext.grpo.tasks.progression_task:prefix_match"),
        num_micro_batches=2,
        width=8,
        reference_params=reference,
    )
    return engine, step, frozen

  def test_update_raises_the_likelihood_of_better_completions(self):
    engine, step, frozen = self._step(beta=0.0)
    before = _copy(engine.params)
    prepared = step.prepare(0, _policy(engine))
    # The loop's update on them: K micro-batches, one update.
    for micro_batch in prepared.batches:
      engine.fwd_bwd(micro_batch)
    engine.update(release=True)
    r = prepared.rollout
    self.assertGreater(np.abs(r.advantages).sum(), 0.0)

    def sequence_log_probs(params):
      lp, _ = scoring.completion_log_probs_and_entropy(
          params, r.tokens, r.prompt_lengths, 4, frozen
      )
      return (np.asarray(lp) * r.mask).sum(axis=1)

    change = sequence_log_probs(engine.params) - sequence_log_probs(before)
    # The policy gradient's direction: likelihood moves with the advantage.
    self.assertGreater(float(np.dot(r.advantages, change)), 0.0)

  def test_reference_log_probs_stay_on_the_devices_in_one_program(self):
    engine, step, frozen = self._step()
    step.prepare(0, _policy(engine))  # Compiles.
    with dispatch_counter.record_launches() as launches:
      prepared = step.prepare(0, _policy(engine))
    result, batches = prepared.rollout, prepared.batches
    # The reference's program is the rollout's one launch besides the
    # decoder's; its output never went through the host.
    self.assertEqual(
        [name for name in launches if "reference" in name],
        ["jit(_micro_batches_with_reference)"],
    )
    self.assertLen(batches, 2)
    for batch in batches:
      self.assertIsInstance(batch["ref_log_probs"], jax.Array)
      self.assertNotIn("stats", batch)
    # The values: the reference (the starting parameters) scored on the
    # host path, completion tokens only.
    expected, _ = scoring.completion_log_probs_and_entropy(
        engine.params,
        result.tokens,
        result.prompt_lengths,
        4,
        frozen,
    )
    np.testing.assert_allclose(
        np.concatenate([np.asarray(b["ref_log_probs"]) for b in batches]),
        np.asarray(expected) * result.mask,
        atol=1e-5,
    )

  def test_complete_puts_the_rollouts_values_into_the_record(self):
    engine, step, _ = self._step()
    prepared = step.prepare(0, _policy(engine))
    for micro_batch in prepared.batches:
      engine.fwd_bwd(micro_batch)
    record = engine.update(release=True)
    step.complete(record, update_start=0.0, prepared=prepared)
    reduced = recorder_lib.reduce_buffer(record)
    # The rollout's statistics go from the host straight into the record.
    self.assertEqual(
        reduced["rewards/mean"], prepared.rollout.stats["rewards/mean"]
    )
    self.assertEqual(reduced["completion_tokens"], prepared.rollout.mask.sum())
    for name in (
        rollout_batches.ROLLOUT_TIMINGS + rollout_batches.UPDATE_TIMINGS
    ):
      self.assertIn(name, reduced)
    # The extremes are the step's, not the mean of the micro-batches'.
    values = record.scalar_metrics
    self.assertLen(values["is_ratio/max"], 2)
    for name in ("is_ratio/max", "advantage/max", "sampling_is_ratio/max"):
      self.assertEqual(reduced[name], np.max(values[name]))
    for name in ("is_ratio/min", "advantage/min", "sampling_is_ratio/min"):
      self.assertEqual(reduced[name], np.min(values[name]))
    # Its first update counted the rollout's time; a later one times
    # itself.
    self.assertIsNone(prepared.start)


if __name__ == "__main__":
  absltest.main()
