"""rollout_source: GRPO's rollouts pulled by the one loop, watched through
a run listener (`trainer.run` with the GRPO workload on a tiny model)."""

import contextlib
import time

from absl.testing import absltest
import jax
import numpy as np

from maxtext import workloads
from maxtext.grpo import grpo_config
from maxtext.grpo import grpo_workload
from maxtext.grpo.rollout import rollout_batches
from maxtext.listeners import interface
from maxtext.run import run_state
from testing import compile_counter
from testing import dispatch_counter
from testing import grpo_start
from testing import tiny_configs

# Every metric a GRPO update records with the tiny run's two reward
# functions (the engine adds grad_norm, learning_rate and step_skipped).
EXPECTED = {
    "loss", "pg_loss", "kl", "kl_loss", "pg_clipfrac", "pg_clipfrac_lower",
    "pg_clipfrac_upper", "ppo_kl", "entropy", "is_ratio/mean", "is_ratio/max",
    "is_ratio/min", "advantage/mean", "advantage/abs_mean", "advantage/max",
    "advantage/min", "advantage/nonzero_frac", "rewards/sum", "rewards/mean",
    "rewards/min", "rewards/max", "rewards/std", "rewards/prefix_match",
    "rewards/exact_match",
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


def _config(output_dir, **overrides):
  """A tiny GRPO run from random parameters: 2 prompts x 4 completions per
  rollout in 2 micro-batches, the KL term on."""
  config = tiny_configs.tiny_config(output_dir, run_name="grpo", steps=2)
  for key, value in dict(grpo_start.RUN_FIELDS, **overrides).items():
    config[key] = value
  return config


def _grpo(config) -> grpo_workload.GrpoWorkload:
  """The GRPO workload of `config`, as the top builds it."""
  return grpo_workload.GrpoWorkload(grpo_config.GrpoConfig.from_config(config))


class _Watch(interface.RunListener):
  """Keeps every train record, and the device programs launched from the
  start of step `launches_of` until its record is written."""

  name = "watch"

  def __init__(self, launches_of: int):
    self.records = {}
    self.launches = None
    self._of = launches_of
    self._stack = contextlib.ExitStack()

  def on_step_start(self, step):
    if step == self._of:
      self.launches = self._stack.enter_context(
          dispatch_counter.record_launches()
      )

  def on_step(self, record):
    self.records[record.step] = record.metrics
    if record.step == self._of:
      self._stack.close()

  def close(self):
    self._stack.close()


class RolloutSourceRunTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Two passes over one rollout: update 0 on-policy, update 1 not; the
    # second draws nothing, so its launches are the update's alone.
    cls.watch = _Watch(launches_of=1)
    config = _config(
        absltest.get_default_test_tmpdir(),
        grpo_num_iterations=2,
        learning_rate=3e-2,
        eval_interval=2,
        checkpoint_period=2,
    )
    cls.result = workloads.run(
        config, workload=_grpo(config), extra_listeners=[cls.watch]
    )

  def test_first_pass_is_on_policy_and_records_every_metric(self):
    self.assertEqual(self.result.final_step, 2)
    record = self.watch.records[0]
    self.assertEqual(set(record), EXPECTED)
    # The behaviour policy is the policy, and the reference too (step 0).
    self.assertAlmostEqual(record["is_ratio/mean"], 1.0, places=3)
    self.assertEqual(record["pg_clipfrac"], 0.0)
    self.assertLess(abs(record["kl"]), 1e-5)
    self.assertEqual(record["step_skipped"], 0.0)
    self.assertGreater(record["entropy"], 0.0)

  def test_timings_split_the_step(self):
    first, second = self.watch.records[0], self.watch.records[1]
    for name in (
        rollout_batches.ROLLOUT_TIMINGS + rollout_batches.UPDATE_TIMINGS
    ):
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

  def test_passes_after_the_first_are_off_policy(self):
    first, second = self.watch.records[0], self.watch.records[1]
    self.assertGreater(second["is_ratio/max"] - second["is_ratio/min"], 1e-3)
    self.assertGreater(abs(second["kl"]), 0.0)
    # Same rollout: the rollout statistics are the same in both passes.
    self.assertEqual(first["rewards/mean"], second["rewards/mean"])

  def test_an_update_is_k_plus_1_device_programs_whatever_its_metrics(self):
    # The ~50 metrics of a GRPO update ride the packed array: K micro-steps
    # (the last also takes the update) and one concatenation for the flush.
    self.assertGreater(len(self.watch.records[1]), 30)
    self.assertEqual(
        self.watch.launches,
        ["jit(micro_step)"] * 2 + ["jit(_concat_groups)"],
    )


class WarmUpTest(absltest.TestCase):

  def test_warm_up_compiles_the_step_and_changes_nothing(self):
    compile_counter.install()
    config = _config(self.create_tempdir().full_path)
    workload = _grpo(config)
    settings, _ = workloads.check(config, workload)
    state = run_state.build(settings, workload=workload)
    try:
      workload.start(state)
      engine = state.engine
      before = jax.tree_util.tree_map(np.asarray, engine.params)
      began = time.monotonic()
      workload.warm_up(state)
      self.assertNotEmpty(compile_counter.backend_compiles_after(began))
      self.assertEqual(engine.step, 0)
      jax.tree_util.tree_map(
          np.testing.assert_array_equal, engine.params, before
      )
    finally:
      state.close()
      state.listeners.close()
      workload.close()


if __name__ == "__main__":
  absltest.main()
