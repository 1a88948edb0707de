"""rollout: generation, rewards, advantages and micro-batches, tiny model."""

from absl.testing import absltest
import jax
import ml_collections
import numpy as np

from maxtext.generation import paged_decoder
from maxtext.generation import scoring
from maxtext.grpo.loss import advantages
from maxtext.grpo import grpo_config
from maxtext.grpo import grpo_workload
from maxtext.grpo.loss import logprob_gate
from maxtext.grpo.tasks import progression_task
from maxtext.grpo.rewards import rewards
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.model import transformer
from maxtext.generation import sampling
from testing import tiny_configs

_REWARDS = (
    "maxtext.grpo.tasks.progression_task:prefix_match,"
    "maxtext.grpo.tasks.progression_task:exact_match=0.5"
)


class RolloutTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = tiny_configs.model_config()
    cls.config = ml_collections.FrozenConfigDict(config)
    cls.params = transformer.init_params(config, jax.random.PRNGKey(0))
    task = progression_task.ProgressionTask(32, 3, 4, num_eval=8, seed=0)
    cls.prompts = task.train_prompts(0, 4)
    cls.functions = rewards.load(_REWARDS)
    cls.options = sampling.SamplingOptions(
        max_new_tokens=4, temperature=1.0, seed=5, num_samples=4
    )
    cls.result = rollout_lib.rollout(
        cls.params,
        cls.config,
        cls.prompts,
        cls.options,
        cls.functions,
        width=8,
    )

  def test_ahead_of_time_shapes_are_the_micro_batches(self):
    # train_compile compiles GRPO's step for these shapes: a rollout's
    # micro-batches must be exactly them (16 rows of 8 in K = 2).
    config = ml_collections.ConfigDict(
        dict(
            global_batch_size=16,
            gradient_accumulation_steps=2,
            grpo_prompt_length=4,
            grpo_max_completion_length=4,
            grpo_beta=0.0,
            grpo_logprob_error_threshold=0.0,
            packing=False,
        )
    )
    want = jax.tree.map(
        lambda a: (a.shape, a.dtype),
        grpo_workload.abstract_micro_batch(
            grpo_config.GrpoConfig.from_config(config)
        ),
    )
    for batch in rollout_lib.micro_batches(self.result, 2):
      self.assertEqual(
          jax.tree.map(lambda a: (a.shape, np.asarray(a).dtype), batch), want
      )
    # With the log-prob-error gate, the gated micro-batches' shapes.
    config.grpo_logprob_error_threshold = 2.0
    want = jax.tree.map(
        lambda a: (a.shape, a.dtype),
        grpo_workload.abstract_micro_batch(
            grpo_config.GrpoConfig.from_config(config)
        ),
    )
    gate = logprob_gate.Gate(2.0, self.config)
    for batch in gate(
        self.params, rollout_lib.micro_batches(self.result, 2), 1.0
    ):
      self.assertEqual(
          jax.tree.map(lambda a: (a.shape, np.asarray(a).dtype), batch), want
      )
    config.packing = True
    with self.assertRaisesRegex(ValueError, "config.packing=True: a packed"):
      grpo_workload.abstract_micro_batch(
          grpo_config.GrpoConfig.from_config(config)
      )

  def test_rows_hold_prompt_then_completion(self):
    r = self.result
    self.assertEqual(r.tokens.shape, (16, 8))
    self.assertLen(r.completions, 16)
    for row, completion in enumerate(r.completions):
      prompt = self.prompts[row // 4]
      self.assertLen(completion, r.completion_lengths[row])
      self.assertEqual(
          list(r.tokens[row, : 3 + len(completion)]), prompt + list(completion)
      )
      self.assertTrue(np.all(r.tokens[row, 3 + len(completion) :] == 0))
    np.testing.assert_array_equal(r.mask.sum(axis=1), r.completion_lengths)

  def test_behaviour_log_probs_match_teacher_forcing(self):
    r = self.result
    forced, entropy = scoring.completion_log_probs_and_entropy(
        self.params, r.tokens, r.prompt_lengths, 4, self.config
    )
    np.testing.assert_allclose(
        r.old_log_probs, np.asarray(forced) * r.mask, atol=2e-4
    )
    self.assertTrue(np.all(np.asarray(entropy) > 0))
    self.assertTrue(np.all(r.old_log_probs[r.mask > 0] < 0))

  def test_rewards_and_advantages(self):
    r = self.result
    prefix = [
        progression_task.prefix_match(self.prompts[i // 4], c)
        for i, c in enumerate(r.completions)
    ]
    exact = [
        progression_task.exact_match(self.prompts[i // 4], c)
        for i, c in enumerate(r.completions)
    ]
    np.testing.assert_allclose(
        r.rewards.total, np.array(prefix) + 0.5 * np.array(exact)
    )
    np.testing.assert_allclose(
        r.advantages,
        advantages.group_advantages(
            r.rewards.total.reshape(4, 4), eps=1e-4
        ).reshape(-1),
    )
    s = r.stats
    self.assertAlmostEqual(s["rewards/mean"], np.mean(r.rewards.total))
    self.assertAlmostEqual(s["rewards/sum"], np.sum(r.rewards.total))
    self.assertAlmostEqual(s["rewards/std"], np.std(r.rewards.total))
    self.assertAlmostEqual(s["rewards/prefix_match"], np.mean(prefix))
    self.assertAlmostEqual(s["rewards/exact_match"], np.mean(exact))
    # No stop ids: every completion runs to the limit and is clipped.
    self.assertEqual(s["completions/clipped_ratio"], 1.0)
    self.assertEqual(s["completions/mean_length"], 4.0)

  def test_overlong_filtering_masks_the_cut_completions(self):
    # A stop id that some completions draw: those end early and train; the
    # ones cut by the length limit do not.
    counts = np.bincount(self.result.tokens[:, 3:].ravel(), minlength=32)
    stop = int(np.argmax(counts[1:]) + 1)
    options = sampling.SamplingOptions(
        max_new_tokens=4,
        temperature=1.0,
        seed=5,
        num_samples=4,
        stop_ids=(stop,),
    )
    filtered = rollout_lib.rollout(
        self.params,
        self.config,
        self.prompts,
        options,
        self.functions,
        width=8,
        overlong_filtering=True,
    )
    cut = np.array(
        [len(c) == 4 and c[-1] != stop for c in filtered.completions]
    )
    self.assertTrue(0 < cut.sum() < len(cut))
    np.testing.assert_array_equal(filtered.sequence_mask, (~cut) * 1.0)
    self.assertAlmostEqual(filtered.stats["masked/overlong_frac"], cut.mean())
    self.assertAlmostEqual(
        filtered.stats["completions/clipped_ratio"], cut.mean()
    )
    # The normalisers: the step's counted tokens and sequences over K.
    batches = rollout_lib.micro_batches(filtered, 2)
    tokens = float((filtered.mask * (~cut)[:, None]).sum())
    for batch in batches:
      np.testing.assert_allclose(batch["token_normaliser"], tokens / 2)
      np.testing.assert_allclose(batch["sequence_normaliser"], (~cut).sum() / 2)
    # Off, every completion trains.
    self.assertEqual(self.result.stats["masked/overlong_frac"], 0.0)
    np.testing.assert_array_equal(self.result.sequence_mask, 1.0)

  def test_same_seed_same_rollout(self):
    again = rollout_lib.rollout(
        self.params,
        self.config,
        self.prompts,
        self.options,
        self.functions,
        width=8,
    )
    self.assertEqual(again.completions, self.result.completions)
    self.assertNotEqual(
        rollout_lib.step_seed(0, 1), rollout_lib.step_seed(0, 2)
    )
    self.assertEqual(rollout_lib.step_seed(3, 1), rollout_lib.step_seed(3, 1))

  def test_stop_ids_end_completions(self):
    options = sampling.SamplingOptions(
        max_new_tokens=4,
        temperature=1.0,
        seed=5,
        num_samples=2,
        stop_ids=tuple(range(32)),
    )
    r = rollout_lib.rollout(
        self.params,
        self.config,
        self.prompts,
        options,
        self.functions,
        width=8,
    )
    np.testing.assert_array_equal(r.completion_lengths, 1)
    self.assertEqual(r.stats["completions/clipped_ratio"], 0.0)
    self.assertEqual(r.stats["completions/max_length"], 1.0)
    # A slot per completion: every row's one id in one decode step.
    self.assertEqual(r.decode_steps, 1)

  def test_decode_steps_are_the_decoders(self):
    # A slot per completion, all 16 admitted at once: 4 steps for 4 ids.
    self.assertEqual(self.result.decode_steps, 4)
    # Two slots for 16 completions of 4 ids: 8 rounds of 4 steps.
    two = rollout_lib.rollout(
        self.params,
        self.config,
        self.prompts,
        self.options,
        self.functions,
        width=8,
        paged=paged_decoder.EngineOptions(num_slots=2),
    )
    self.assertEqual(two.decode_steps, 8 * 4)
    static = rollout_lib.rollout(
        self.params,
        self.config,
        self.prompts,
        self.options,
        self.functions,
        width=8,
        paged=None,
    )
    self.assertEqual(static.decode_steps, 4)

  def test_micro_batches(self):
    r = self.result
    batches = rollout_lib.micro_batches(r, 2)
    self.assertLen(batches, 2)
    np.testing.assert_array_equal(
        np.concatenate([b["tokens"] for b in batches]), r.tokens
    )
    np.testing.assert_array_equal(
        np.concatenate([b["mask"] for b in batches]), r.mask
    )
    self.assertEqual(batches[1]["advantages"].shape, (8,))
    # The statistics are host values: they stay out of the micro-batches.
    self.assertEqual(
        set(batches[0]),
        {
            "tokens",
            "prompt_lengths",
            "mask",
            "old_log_probs",
            "advantages",
            "sequence_mask",
            "token_normaliser",
            "sequence_normaliser",
        },
    )
    with self.assertRaisesRegex(ValueError, "gradient_accumulation_steps=3"):
      rollout_lib.micro_batches(r, 3)

  def test_one_generation_is_refused(self):
    options = sampling.SamplingOptions(max_new_tokens=4, num_samples=1)
    with self.assertRaisesRegex(ValueError, "num_generations=1"):
      rollout_lib.rollout(
          self.params, self.config, self.prompts, options, self.functions
      )

  def test_reward_error_names_function_and_prompt(self):
    functions = rewards.load("maxtext.grpo.tasks.progression_task:exact_match")
    with self.assertRaisesRegex(
        rewards.RewardError,
        r"^reward function maxtext.grpo.tasks.progression_task:exact_match on "
        r"prompt 1 \(sample 0\) raised ValueError: a prompt needs 2 terms",
    ):
      rollout_lib.rollout(
          self.params, self.config, [[1, 2], [3]], self.options, functions
      )


if __name__ == "__main__":
  absltest.main()
