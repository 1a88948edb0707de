"""Episode rollouts on a tiny model: the real decoders (static and paged) on
the math task, and a repair episode in the sandbox whose tool and template
tokens carry no loss."""

from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maxtext.env import environment
from maxtext.env import episodes
from maxtext.env import executor
from maxtext.env import math_task
from maxtext.env import repair_task
from maxtext.env import sandbox
from maxtext.env import tasks
from maxtext.generation import decoder
from maxtext.generation import paged_decoder
from maxtext.generation import sampling
from maxtext.generation import scoring
from maxtext.grpo.rollout import episode_rollout
from maxtext.grpo.loss import policy_loss
from maxtext.grpo.rewards import rewards
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.grpo.tasks import text_task
from maxtext.grpo.loss import train_loss
from maxtext.model import transformer
from testing import tiny_configs

_SETTINGS = tasks.ToolSettings(sandbox.Limits(wall_seconds=30), True, 30.0)


class EpisodeRolloutTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = tiny_configs.model_config(vocab_size=320, max_sequence_length=1536)
    cls.config = ml_collections.FrozenConfigDict(config)
    cls.params = transformer.init_params(config, jax.random.PRNGKey(0))
    cls.chat = text_task.load_tokenizer(text_task.BYTE_CHATML)

  def test_both_decoders_stop_at_the_models_length(self):
    # A context 4 ids short of the model's length beside a short one, each
    # with its episode's budget.
    contexts = [[65] * (self.config.max_sequence_length - 4), [65] * 10]
    options = sampling.SamplingOptions(max_new_tokens=16, temperature=1.0)
    for paged in (None, paged_decoder.EngineOptions()):
      generate = episode_rollout.generation_fn(
          self.params, self.config, 2, 320, paged
      )
      long, short = generate(contexts, options, [4, 16])
      self.assertLen(long.ids, 4)
      # The static decoder's rows share one length: the longest context's.
      self.assertLen(short.ids, 4 if paged is None else 16)

  def test_math_with_the_decoder(self):
    setup = episode_rollout.EpisodeSetup(
        math_task.make_task(num_eval=2),
        self.chat,
        episodes.Limits(max_turns=1, max_tokens=12, max_turn_tokens=12),
        _SETTINGS,
    )
    records = setup.task.train_records(0, 2)
    options = sampling.SamplingOptions(
        max_new_tokens=12,
        temperature=1.0,
        seed=4,
        num_samples=2,
        stop_ids=self.chat.stop_ids,
    )
    result = episode_rollout.rollout(
        self.params,
        self.config,
        records,
        options,
        rewards.load("maxtext.env.math_task:correct"),
        setup=setup,
        width=128,
    )
    for row in range(4):
      record = records[row // 2]
      prompt = self.chat.encode_prompt(
          [{"role": "user", "content": record["prompt"]}]
      )
      self.assertEqual(result.prompt_lengths[row], len(prompt))
      self.assertEqual(list(result.tokens[row, : len(prompt)]), prompt)
      n = result.completion_lengths[row]
      self.assertEqual(result.mask[row].sum(), n)  # One turn: all the model's.
      self.assertTrue(np.all(result.tokens[row, len(prompt) :][n:] == 0))
      # Only the tokenizer's ids are drawn.
      self.assertTrue(np.all(result.tokens[row] < self.chat.vocab_size))
    forced, _ = scoring.completion_log_probs_and_entropy(
        self.params, result.tokens, result.prompt_lengths, 12, self.config
    )
    np.testing.assert_allclose(
        result.old_log_probs, np.asarray(forced) * result.mask, atol=2e-4
    )
    self.assertEqual(result.stats["episode/turns"], 1.0)
    self.assertEqual(result.stats["episode/timeouts"], 0.0)
    self.assertIn("rewards/kind/math", result.stats)
    self.assertIn("rewards/correct", result.stats)

  def test_the_row_is_the_whole_conversation(self):
    # Rows of W = the longest first prompt + 6 tokens, 12 loss columns: an
    # episode's whole conversation, its first prompt counted, fills at most
    # W (the longest prompt leaves 6 ids, a shorter one more, up to the 12
    # columns), and each loss column holds its own id's log-probability.
    task = math_task.make_task(num_eval=2)
    records = task.train_records(0, 2)
    prompts = [
        len(self.chat.encode_prompt([{"role": "user", "content": r["prompt"]}]))
        for r in records
    ]
    self.assertNotEqual(prompts[0], prompts[1])
    width = max(prompts) + 6
    setup = episode_rollout.EpisodeSetup(
        task,
        self.chat,
        episodes.Limits(
            max_turns=1, max_tokens=12, max_turn_tokens=12, max_length=width
        ),
        _SETTINGS,
    )
    options = sampling.SamplingOptions(
        max_new_tokens=12, temperature=1.0, seed=5, num_samples=2
    )
    result = episode_rollout.rollout(
        self.params,
        self.config,
        records,
        options,
        rewards.load("maxtext.env.math_task:correct"),
        setup=setup,
        width=width,
    )
    for row in range(4):
      prompt = prompts[row // 2]
      self.assertEqual(result.prompt_lengths[row], prompt)
      # No stop id: every turn fills what is left of its episode.
      self.assertEqual(result.completion_lengths[row], min(12, width - prompt))
      self.assertEqual(result.mask[row].sum(), result.completion_lengths[row])
    self.assertEqual(result.stats["episode/truncated"], 1.0)
    forced, _ = scoring.completion_log_probs_and_entropy(
        self.params, result.tokens, result.prompt_lengths, 12, self.config
    )
    np.testing.assert_allclose(
        result.old_log_probs, np.asarray(forced) * result.mask, atol=2e-4
    )

  def test_paged_decoder_plays_the_decoders_episodes(self):
    # The paged, continuous-batching decoder draws each row with the static
    # decoder's key, so the same step's episodes are the same tokens.
    setup = episode_rollout.EpisodeSetup(
        math_task.make_task(num_eval=2),
        self.chat,
        episodes.Limits(max_turns=1, max_tokens=10, max_turn_tokens=10),
        _SETTINGS,
    )
    records = setup.task.train_records(0, 2)
    options = sampling.SamplingOptions(
        max_new_tokens=10,
        temperature=1.0,
        seed=7,
        num_samples=2,
        stop_ids=self.chat.stop_ids,
    )
    results = [
        episode_rollout.rollout(
            self.params,
            self.config,
            records,
            options,
            rewards.load("maxtext.env.math_task:correct"),
            setup=setup,
            width=128,
            paged=paged,
        )
        for paged in (None, paged_decoder.EngineOptions(page_size=8))
    ]
    np.testing.assert_array_equal(results[0].tokens, results[1].tokens)
    np.testing.assert_array_equal(results[0].mask, results[1].mask)
    np.testing.assert_allclose(
        results[0].old_log_probs, results[1].old_log_probs, atol=1e-4
    )

  def test_eval_plays_on_the_runs_decoder(self):
    # The held-out evaluation generates as the rollouts do: with the paged
    # engine the static decoder (a dense batch of every episode) is never
    # called, and both give the same pass rates. A third of the ids end a
    # turn, so this random model's turns end with text, and the reward
    # passes about half of them by their bytes.
    setup = episode_rollout.EpisodeSetup(
        math_task.make_task(num_eval=6),
        self.chat,
        episodes.Limits(max_turns=1, max_tokens=8, max_turn_tokens=8),
        _SETTINGS,
    )
    options = sampling.SamplingOptions(
        max_new_tokens=8,
        temperature=1.0,
        seed=3,
        num_samples=4,
        stop_ids=tuple(range(0, self.chat.vocab_size, 3)),
    )
    by_bytes = [
        rewards.RewardFunction(
            "test:by_bytes", lambda p, c, **f: float(sum(c.encode()) % 2), 1.0
        )
    ]

    def evaluate(paged):
      return episode_rollout.evaluate(
          self.params, self.config, setup, options, by_bytes, paged=paged
      )

    static = evaluate(None)
    with mock.patch.object(
        decoder, "generate", side_effect=AssertionError("static decoder")
    ):
      paged = evaluate(paged_decoder.EngineOptions(num_slots=5, page_size=8))
    self.assertEqual(static, paged)
    self.assertGreater(static["pass@1"], 0.0)
    self.assertLess(static["pass@1"], 1.0)

  def test_repair_episode_trains_only_the_models_tokens(self):
    task = repair_task.make_task(num_eval=1)
    record = task.train_records(0, 1)[0]
    demo = [
        m["content"] for m in task.demonstration(record)
        if m["role"] == "assistant"
    ]  # fmt: skip
    calls = []

    def generate(contexts, options, budgets):
      del options, budgets  # The script decides.
      # Episode 0 follows the demonstration; episode 1 gives up at once.
      turn = len(calls)
      calls.append(len(contexts))
      out = []
      for i, _ in enumerate(contexts):
        text = "I give up." if turn == 0 and i == 1 else demo[turn]
        ids = self.chat.tokenizer.encode(text, add_special_tokens=False).ids
        ids = ids + [self.chat.end_of_turn_id]
        out.append(episodes.Completion(ids, [-1.0] * len(ids)))
      return out

    setup = episode_rollout.EpisodeSetup(
        task,
        self.chat,
        episodes.Limits(max_turns=8, max_tokens=1024, max_turn_tokens=256),
        _SETTINGS,
    )
    options = sampling.SamplingOptions(
        max_new_tokens=256, temperature=1.0, num_samples=2,
        stop_ids=self.chat.stop_ids,
    )  # fmt: skip
    result = episode_rollout.rollout(
        self.params, self.config, [record], options, [], setup=setup,
        width=1536, generate=generate,
    )  # fmt: skip
    np.testing.assert_array_equal(result.rewards.total, [1.0, 0.0])
    self.assertEqual(calls, [2, 1, 1, 1])
    self.assertEqual(result.stats["episode/tool_calls"], 2.0)  # (4 + 0) / 2
    self.assertGreater(result.stats["episode/env_tokens"], 0)
    # The solved episode holds tool results, which are not the model's.
    mask = result.mask[0]
    n = result.completion_lengths[0]
    self.assertLess(mask[:n].sum(), n)
    self.assertGreater(mask[:n].sum(), 0)
    env_positions = np.flatnonzero((np.arange(len(mask)) < n) & (mask == 0))
    model_positions = np.flatnonzero(mask > 0)
    text = self.chat.tokenizer.decode(
        result.tokens[0, result.prompt_lengths[0] + env_positions].tolist(),
        skip_special_tokens=False,
    )
    self.assertIn("<tool_response>", text)
    self.assertIn("def ", text)  # The viewed file.

    # The gradient of the loss with respect to each position's
    # log-probability: none at the environment's and template's tokens.
    batch = rollout_lib.micro_batches(result, 1)[0]
    options_loss = policy_loss.LossOptions()

    def loss_of(log_probs):
      return policy_loss.policy_loss(
          log_probs,
          jnp.asarray(batch["old_log_probs"]),
          jnp.asarray(batch["advantages"]),
          jnp.asarray(batch["mask"]),
          options_loss,
          sequence_mask=jnp.asarray(batch["sequence_mask"]),
      )[0]

    grad = np.asarray(jax.grad(loss_of)(jnp.asarray(batch["old_log_probs"])))
    self.assertTrue(np.all(grad[0, env_positions] == 0.0))
    self.assertTrue(np.all(grad[0, model_positions] != 0.0))
    # And through the model: changing what the environment's positions
    # hold in the loss's inputs changes nothing.
    loss = train_loss.loss_fn(self.params, batch, self.config, options_loss)[0]
    changed = dict(batch)
    changed["old_log_probs"] = batch["old_log_probs"].copy()
    changed["old_log_probs"][0, env_positions] = -7.0
    np.testing.assert_allclose(
        train_loss.loss_fn(self.params, changed, self.config, options_loss)[0],
        loss,
        rtol=1e-6,
    )

  def test_timed_out_episodes_keep_their_place_in_the_group(self):
    # Four episodes of one record start at clock 0, 1, 2 and 3, each with
    # 2.5 s of its own; the clock reads 4, then 5 after the two turns: the
    # first two end after turn 1, the third after turn 2, and the fourth
    # uses its two turns and is scored by its verifier.
    ticks = iter(range(1000))
    ids = self.chat.tokenizer.encode("ok", add_special_tokens=False).ids
    ids.append(self.chat.end_of_turn_id)

    def generate(contexts, options, budgets):
      del options, budgets
      return [episodes.Completion(ids, [-1.0] * len(ids)) for _ in contexts]

    setup = episode_rollout.EpisodeSetup(
        _Endless(),
        self.chat,
        episodes.Limits(
            max_turns=2, max_tokens=256, max_turn_tokens=64,
            episode_seconds=2.5,
        ),
        _SETTINGS,
        clock=lambda: float(next(ticks)),
    )  # fmt: skip
    result = episode_rollout.rollout(
        self.params, self.config, [{"prompt": "Go on."}],
        sampling.SamplingOptions(max_new_tokens=64, num_samples=4,
                                 stop_ids=self.chat.stop_ids),
        [], setup=setup, width=512, generate=generate,
        estimator="rloo_normalized", advantage_eps=1e-6,
        overlong_filtering=True,
    )  # fmt: skip
    np.testing.assert_array_equal(result.rewards.total, [0, 0, 0, 1])
    # Every episode is a sample (none reached the length limit) and takes
    # its place in the group's leave-one-out baseline.
    np.testing.assert_array_equal(result.sequence_mask, [1, 1, 1, 1])
    np.testing.assert_allclose(
        result.advantages,
        _reference_rloo_normalized([0.0, 0.0, 0.0, 1.0], 1e-6),
        rtol=1e-6,
    )
    self.assertEqual(result.stats["episode/timeouts"], 3.0)
    self.assertEqual(result.stats["episode/turn_limit"], 0.25)
    self.assertEqual(result.stats["rewards/verifier"], 0.25)
    # Their tokens train: the model's turns are in the loss's mask.
    self.assertTrue(np.all(result.mask.sum(axis=1) > 0))

  def test_episodes_their_executor_failed_score_zero_and_are_counted(self):
    # The executor fails episode 1's first turn and episode 2's verifier
    # (as a dead or late Ray actor does); episodes 0 and 3 play on.
    ids = self.chat.tokenizer.encode("ok", add_special_tokens=False).ids
    ids.append(self.chat.end_of_turn_id)

    def generate(contexts, options, budgets):
      del options, budgets
      return [episodes.Completion(ids, [-1.0] * len(ids)) for _ in contexts]

    setup = episode_rollout.EpisodeSetup(
        _Endless(),
        self.chat,
        episodes.Limits(max_turns=2, max_tokens=256, max_turn_tokens=64),
        _SETTINGS,
        executor=_Failing(step={1}, reward={2}),
    )
    result = episode_rollout.rollout(
        self.params, self.config, [{"prompt": "Go on."}],
        sampling.SamplingOptions(max_new_tokens=64, num_samples=4,
                                 stop_ids=self.chat.stop_ids),
        [], setup=setup, width=512, generate=generate,
    )  # fmt: skip
    np.testing.assert_array_equal(result.rewards.total, [1, 0, 0, 1])
    self.assertEqual(result.stats["episode/executor_errors"], 2.0)
    self.assertEqual(result.stats["episode/timeouts"], 0.0)
    # Episode 1 ended at the turn that failed; the others played both.
    self.assertEqual(result.stats["episode/turns"], 1.75)


class _Failing(executor.LocalExecutor):
  """The local executor, with a Fault for the episodes in `step` at their
  first turn and for those in `reward` at their verifier."""

  def __init__(self, step, reward):
    self._step, self._reward = step, reward

  def open(self, *args):
    batch = super().open(*args)
    step, verify = batch.step, batch.rewards
    fault = executor.Fault("the actor died")

    def failing_step(turns):
      out = step(turns)
      out.update({i: fault for i in self._step if i in out})
      self._step = set()
      return out

    def failing_rewards(timed_out):
      out = verify(timed_out)
      out.update({i: fault for i in self._reward if i in out})
      return out

    batch.step, batch.rewards = failing_step, failing_rewards
    return batch


def _reference_rloo_normalized(group, eps):
  """NeMo-RL's GRPO advantage with the leave-one-out baseline and
  normalised rewards, over one group, as the reference computes it."""
  out = []
  for i, r in enumerate(group):
    others = np.array(group[:i] + group[i + 1 :])
    baseline, std = others.mean(), others.std(ddof=1)
    out.append((r - baseline) / (std + eps) if std > 0 else r - baseline)
  return out


class _EndlessEnvironment(environment.Environment):
  """Asks for another turn after every turn; reward 1 once played."""

  kind = "endless"

  def __init__(self, record):
    self.record = record

  def start(self):
    return [{"role": "user", "content": self.record["prompt"]}]

  def step(self, text):
    del text
    return environment.Reply([{"role": "user", "content": "Again."}], False)

  def reward(self):
    return 1.0


class _Endless(tasks.Task):
  """A task of one record whose episodes never end by themselves."""

  kind = "endless"

  def train_records(self, step, count):
    return [{"prompt": "Go on."}] * count

  def eval_records(self):
    return []

  def make_environment(self, record, tools):
    del tools
    return _EndlessEnvironment(record)


if __name__ == "__main__":
  absltest.main()
