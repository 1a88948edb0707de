"""step: GRPO steps through the real engine on a tiny model."""

import functools
import time

from absl.testing import absltest
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from maxtext.engine import engine as engine_lib
from maxtext.generation import scoring
from maxtext.grpo import policy_loss
from maxtext.grpo import progression_task
from maxtext.grpo import rewards
from maxtext.grpo import rollout as rollout_lib
from maxtext.grpo import step as step_lib
from maxtext.grpo import train_loss
from maxtext.metrics import recorder as recorder_lib
from maxtext.model import transformer
from maxtext.generation import sampling
from testing import compile_counter
from testing import dispatch_counter
from testing import tiny_configs

# Every metric a GRPO step records (the engine adds grad_norm,
# learning_rate and step_skipped).
EXPECTED = {
    "loss", "pg_loss", "kl", "kl_loss", "pg_clipfrac", "pg_clipfrac_lower",
    "pg_clipfrac_upper", "ppo_kl", "entropy", "is_ratio/mean", "is_ratio/max",
    "is_ratio/min", "advantage/mean", "advantage/abs_mean", "advantage/max",
    "advantage/min", "advantage/nonzero_frac", "rewards/sum", "rewards/mean",
    "rewards/min", "rewards/max", "rewards/std", "rewards/prefix_match",
    "frac_reward_zero_std", "completions/mean_length",
    "completions/min_length", "completions/max_length",
    "completions/clipped_ratio", "completion_tokens", "timing/rollout",
    "timing/generate", "timing/reward", "timing/reference",
    "timing/old_logprobs", "timing/update", "timing/step",
    "grad_norm", "learning_rate", "step_skipped",
    "sampling_is_ratio/mean", "sampling_is_ratio/max",
    "sampling_is_ratio/min", "tis_geo_mean/max", "tis_geo_mean/min",
    "logprob_error/mean", "logprob_error/max", "masked/tis_frac",
    "masked/logprob_error_frac", "masked/overlong_frac", "trained_token_frac",
}  # fmt: skip


def _copy(tree):
  """A copy of every array of `tree` (the engine donates its own)."""
  return jax.tree_util.tree_map(jnp.copy, tree)


class StepTest(absltest.TestCase):

  def _step(self, num_iterations=1, beta=0.04, learning_rate=1e-2):
    """An engine with the GRPO loss and a GrpoStep on the progression task."""
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
    step = step_lib.GrpoStep(
        engine,
        frozen,
        lambda s: task.train_prompts(s, 4),
        lambda s: sampling.SamplingOptions(
            max_new_tokens=4,
            temperature=1.0,
            seed=rollout_lib.step_seed(0, s),
            num_samples=4,
        ),
        rewards.load("maxtext.grpo.progression_task:prefix_match"),
        num_micro_batches=2,
        num_iterations=num_iterations,
        width=8,
        reference_params=reference,
    )
    return engine, step, frozen

  def test_first_pass_is_on_policy_and_records_every_metric(self):
    engine, step, _ = self._step()
    result = step.run(0)
    self.assertLen(result.records, 1)
    record = recorder_lib.reduce_buffer(result.records[0])
    self.assertEqual(set(record), EXPECTED)
    # The behaviour policy is the policy, and the reference too (step 0).
    self.assertAlmostEqual(record["is_ratio/mean"], 1.0, places=3)
    self.assertEqual(record["pg_clipfrac"], 0.0)
    self.assertLess(abs(record["kl"]), 1e-5)
    self.assertEqual(record["step_skipped"], 0.0)
    self.assertGreater(record["entropy"], 0.0)
    # The rollout's statistics go from the host straight into the record.
    self.assertEqual(
        record["rewards/mean"], result.rollout.stats["rewards/mean"]
    )
    self.assertEqual(record["completion_tokens"], result.rollout.mask.sum())
    self.assertEqual(engine.step, 1)
    # The extremes are the step's, not the mean of the micro-batches'.
    values = result.records[0].scalar_metrics
    self.assertLen(values["is_ratio/max"], 2)
    for name in ("is_ratio/max", "advantage/max", "sampling_is_ratio/max"):
      self.assertEqual(record[name], np.max(values[name]))
    for name in ("is_ratio/min", "advantage/min", "sampling_is_ratio/min"):
      self.assertEqual(record[name], np.min(values[name]))

  def test_timings_split_the_step(self):
    _, step, _ = self._step(num_iterations=2)
    first, second = (recorder_lib.reduce_buffer(r) for r in step.run(0).records)
    for name in step_lib.ROLLOUT_TIMINGS + step_lib.UPDATE_TIMINGS:
      self.assertGreaterEqual(first[name], 0.0, name)
    # Generation computes the behaviour log-probabilities: no phase of
    # their own.
    self.assertEqual(first["timing/old_logprobs"], 0.0)
    self.assertGreater(first["timing/reference"], 0.0)  # beta > 0.
    self.assertLessEqual(
        first["timing/generate"] + first["timing/reward"],
        first["timing/rollout"],
    )
    # The first pass's step spans its rollout, reference and update; the
    # second pass's is its update alone.
    self.assertGreaterEqual(
        first["timing/step"],
        first["timing/rollout"]
        + first["timing/reference"]
        + first["timing/update"],
    )
    self.assertEqual(second["timing/step"], second["timing/update"])
    self.assertEqual(second["timing/rollout"], first["timing/rollout"])

  def test_warm_up_compiles_the_step_and_changes_nothing(self):
    compile_counter.install()
    engine, step, _ = self._step()
    before = _copy(engine.params)
    began = time.monotonic()
    step.warm_up(0)
    self.assertNotEmpty(compile_counter.backend_compiles_after(began))
    self.assertEqual(engine.step, 0)
    jax.tree_util.tree_map(np.testing.assert_array_equal, engine.params, before)
    warmed = time.monotonic()
    record = recorder_lib.reduce_buffer(step.run(0).records[0])
    self.assertEqual(compile_counter.backend_compiles_after(warmed), [])
    self.assertEqual(compile_counter.count_after(warmed), 0)
    # The step is the one a run without warm-up takes first: on-policy.
    self.assertAlmostEqual(record["is_ratio/mean"], 1.0, places=3)
    self.assertEqual(engine.step, 1)

  def test_without_warm_up_the_first_step_compiles(self):
    # The control: the count above can fail.
    compile_counter.install()
    _, step, _ = self._step()
    began = time.monotonic()
    step.run(0)
    self.assertNotEmpty(compile_counter.backend_compiles_after(began))

  def test_passes_after_the_first_are_off_policy(self):
    engine, step, _ = self._step(num_iterations=2, learning_rate=3e-2)
    result = step.run(0)
    self.assertLen(result.records, 2)
    self.assertEqual(engine.step, 2)
    first, second = (recorder_lib.reduce_buffer(r) for r in result.records)
    self.assertAlmostEqual(first["is_ratio/mean"], 1.0, places=3)
    self.assertGreater(second["is_ratio/max"] - second["is_ratio/min"], 1e-3)
    self.assertGreater(abs(second["kl"]), 0.0)
    # Same rollout: the rollout statistics are the same in both passes.
    self.assertEqual(first["rewards/mean"], second["rewards/mean"])

  def test_update_raises_the_likelihood_of_better_completions(self):
    engine, step, frozen = self._step(beta=0.0)
    before = _copy(engine.params)
    result = step.run(0)
    r = result.rollout
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
    step.rollout(0)  # Compiles.
    with dispatch_counter.record_launches() as launches:
      result, batches = step.rollout(0)
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

  def test_a_step_is_k_plus_1_device_programs_whatever_its_metrics(self):
    # The ~36 metrics of a GRPO step ride the packed array: K micro-steps
    # (the last also takes the update) and one concatenation for the flush.
    engine, step, _ = self._step()
    _, batches = step.rollout(0)
    step.train(batches)  # Compiles.
    with dispatch_counter.record_launches() as launches:
      record = step.train(batches)
    self.assertGreater(len(recorder_lib.reduce_buffer(record)), 30)
    self.assertEqual(
        launches, ["jit(micro_step)"] * 2 + ["jit(_concat_groups)"]
    )
    self.assertEqual(engine.step, 2)


if __name__ == "__main__":
  absltest.main()
