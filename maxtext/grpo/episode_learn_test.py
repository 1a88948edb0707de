"""GRPO learns through the episode path: a text task on the tiny model.

The policy is the tiny model with the byte-level ChatML tokenizer, at its
random start. Each episode is a chat: the task's prompt, rendered by the
template, then the model's turn, decoded and answered by the environment
(`maxtext.env.episodes`), rolled out by `episode_rollout.rollout` and
made into micro-batches (`rollout_batches.RolloutBatches`) and trained by
the engine, one update per rollout, with the loss of the benchmark's
config (the leave-one-out normalised advantage, token_mean). The reward is
a harmless marker, the byte "!", in the model's text: the random policy
writes it in about a third of its turns (uniform over 259 ids, 96 of them).

* Trained, the mean training reward reaches 0.9 within 60 steps.
* With the advantages negated (the same run otherwise), it falls below its
  start: the tokens, masks, behaviour log-probabilities and advantages of
  an episode line up, or the sign would not matter.
* A multi-turn variant: the environment answers the model's first turn with
  a message, and only the second turn is rewarded, so the first turn's
  tokens, the environment's tokens between the turns (no loss) and the
  second turn's tokens must all sit where the loss reads them.
* A tool call: the reward needs a `mark()` call, answered by the tool
  environment (`ToolEnvironment`, the qwen3_xml form); the random model
  never writes the syntax, so it is first fine-tuned to call the tool in a
  quarter of its turns, and GRPO raises that share by 0.3 or more.
"""

from testing import run_compile_level

# The runs train up to 60 steps each, whose programs run slower with the
# suite's cheap compiles than their compiles save (cold, under Bazel: 171
# CPU seconds with them, 144 at XLA's default level), so this test
# compiles as runs do.
run_compile_level.request()

# XLA reads the flags when JAX starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order,ungrouped-imports
import dataclasses
import functools

from absl import logging
from absl.testing import absltest
import jax
import ml_collections
import numpy as np
import optax

from maxtext.engine import engine as engine_lib
from maxtext.env import environment
from maxtext.env import episodes
from maxtext.env import sandbox
from maxtext.env import tasks
from maxtext.env import tool_calls
from maxtext.generation import paged_decoder
from maxtext.generation import sampling
from maxtext.grpo.rollout import episode_rollout
from maxtext.grpo.loss import policy_loss
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.grpo.rollout import rollout_batches
from maxtext.grpo.tasks import text_task
from maxtext.grpo.loss import train_loss
from maxtext.metrics import recorder as recorder_lib
from maxtext.model import transformer
from maxtext.run import batch_source
from testing import tiny_configs

_MARKER = "!"
_TURN = 96  # Ids per model turn.
_PROMPTS, _GENERATIONS = 4, 8
# 167 ids with the template's tool description: over 160, so a first turn
# (96 ids) needs the 512-position length bucket, as the marker task's second
# turns do; their paged decoder then compiles one set of programs for both.
_MARK_PROMPT = "Task: mark this one, please."
# The paged decoder's pool and prefill sizes, the same for every turn of
# every case, so that all the runs share one set of decode programs (one a
# table view). Its defaults size both by each call's longest context: the
# pool by its length bucket (528 pages for a 256-position one, 1056 for
# 512) and the buffer of prefilled contexts by prefill_tokens / its prefill
# bucket, so the first turns, the marker task's second turns and the mark
# task's second turns each compiled their own. Here the pool is the
# default's for the widest table (32 slots and one waiting context, 8
# pages of 64 each: the 512 bucket), and prefill_tokens lets every
# prefill bucket (up to 512) take all 32 contexts in one call. Pages of 64
# positions make 4 table views (1, 2, 4 and 8 pages), so 4 decode programs.
# The rollouts' tokens do not depend on these sizes: each row draws with
# its own key.
_PAGE = 64
_ENGINE = paged_decoder.EngineOptions(
    page_size=_PAGE,
    num_pages=(_PROMPTS * _GENERATIONS + 1) * 512 // _PAGE,
    prefill_tokens=_PROMPTS * _GENERATIONS * 512,
)


class _MarkerEnvironment(environment.Environment):
  """Reward 1 when the rewarded turn holds the marker.

  With `turns` = 2 the first turn is answered with a message and the
  second is the rewarded one.
  """

  kind = "marker"

  def __init__(self, record, turns):
    self.record = record
    self.turns = turns
    self.seen = []

  def start(self):
    return [{"role": "user", "content": self.record["prompt"]}]

  def step(self, text):
    self.seen.append(text)
    if len(self.seen) < self.turns:
      return environment.Reply([{"role": "user", "content": "Again."}], False)
    return environment.Reply([], True)

  def reward(self):
    return float(len(self.seen) == self.turns and _MARKER in self.seen[-1])


class _MarkerTask(tasks.Task):
  """Prompts of a few words; each episode a `_MarkerEnvironment`."""

  kind = "marker"

  def __init__(self, turns):
    self.turns = turns

  def train_records(self, step, count):
    return [{"prompt": f"Say something ({step}.{i})."} for i in range(count)]

  def eval_records(self):
    return []

  def make_environment(self, record, tools):
    del tools
    return _MarkerEnvironment(record, self.turns)


class _MarkEnvironment(environment.ToolEnvironment):
  """One tool, `mark()`; reward 1 when the episode called it."""

  def __init__(self, record):
    super().__init__("mark")
    self.record = record
    self.marked = False
    self.add_tool("mark", self._mark, "Marks the task.")

  def _mark(self):
    self.marked = True
    return "marked"

  def start(self):
    return [{"role": "user", "content": self.record["prompt"]}]

  def reward(self):
    return float(self.marked)


class _MarkTask(tasks.Task):
  """One prompt, `_MARK_PROMPT`; each episode a `_MarkEnvironment`."""

  kind = "mark"

  def train_records(self, step, count):
    del step
    return [{"prompt": _MARK_PROMPT}] * count

  def eval_records(self):
    return []

  def make_environment(self, record, tools):
    del tools
    return _MarkEnvironment(record)


def _fine_tuned(params, config, chat, steps, call_share):
  """`params` fine-tuned on `_MarkTask`'s prompt: a `mark` call in a
  `call_share` of the turns, "ok" in the rest (the assistant's ids alone
  carry the loss), so the policy calls the tool in about that share of its
  turns and writes the call's syntax."""
  call = tool_calls.format_xml(tool_calls.ToolCall("mark", {}))
  rows, weights = [], []
  # One row of each reply in that share: the loss is the weighted mean over
  # the rows' tokens, so copies of these rows would not change it.
  for i in range(round(1 / call_share)):
    env = _MarkEnvironment({"prompt": _MARK_PROMPT})
    reply = call if i == 0 else "ok"
    encoded = chat.encode(
        env.start() + [{"role": "assistant", "content": reply}],
        tools=env.tools,
    )
    rows.append(encoded.ids)
    weights.append(encoded.assistant_mask)
  width = max(len(r) for r in rows) + 1
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), np.float32)
  for r, (ids, w) in enumerate(zip(rows, weights)):
    tokens[r, : len(ids)] = ids
    mask[r, : len(ids)] = w
  batch = {
      "inputs": tokens[:, :-1],
      "targets": tokens[:, 1:],
      "weights": mask[:, 1:],
  }
  optimizer = optax.adam(1e-2)
  state = optimizer.init(params)

  @jax.jit
  def update(params, state):
    grads = jax.grad(lambda p: transformer.loss_fn(p, batch, config)[0])(params)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(steps):
    params, state = update(params, state)
  return params


def _negated(rollout_fn):
  """`rollout_fn` whose advantages are negated."""

  def negated(*args, **kwargs):
    result = rollout_fn(*args, **kwargs)
    return dataclasses.replace(result, advantages=-result.advantages)

  return negated


def _tool_calls_risen(rewards):
  """Whether the mean reward of the last 5 steps is 0.3 or more above step
  0's (the fine-tuned policy's, before any update)."""
  return len(rewards) >= 5 and rewards[-5:].mean() - rewards[0] >= 0.3


def _unlearned(rewards):
  """Whether the mean reward of the last 5 steps is 0.1 or more below that
  of the first 3."""
  return len(rewards) >= 8 and rewards[-5:].mean() < rewards[:3].mean() - 0.1


def _second_turn_risen(rewards):
  """Whether the mean reward of the last 5 steps is 0.3 or more above that
  of the first 3."""
  return len(rewards) >= 8 and rewards[-5:].mean() - rewards[:3].mean() >= 0.3


# A run that must learn stops at the first step where it has: every check
# holds on the rewards up to there, and fails where the step budget ends
# before.
class EpisodeLearnTest(absltest.TestCase):

  def _rewards(
      self, steps, turns=1, negate=False, stop_when=None, tool_call=False
  ):
    """The mean training reward of each of `steps` GRPO steps (fewer when
    `stop_when` holds for the rewards so far): the marker task of `turns`
    turns, or with `tool_call` the `mark` task from a fine-tuned start."""
    learning_rate = 3e-3
    # For the first prompt: the marker task's is 39 to 41 ids, the mark
    # task's 165 (the template's tool description). The rows are no wider
    # than the prompt and the episode's max_tokens need: a training step's
    # cost grows with the square of their width (its attention).
    room = 176 if tool_call else 48
    # One model config for every case (the mark task's episodes need 768
    # positions; the parameters do not depend on it): runs whose turns fall
    # in the same length buckets share the decoder's compiled programs.
    config = tiny_configs.model_config(vocab_size=320, max_sequence_length=768)
    frozen = ml_collections.FrozenConfigDict(config)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    chat = text_task.load_tokenizer(text_task.BYTE_CHATML)
    if tool_call:
      params = _fine_tuned(params, frozen, chat, 200, 1 / 4)
    setup = episode_rollout.EpisodeSetup(
        _MarkTask() if tool_call else _MarkerTask(turns),
        chat,
        episodes.Limits(
            max_turns=turns, max_tokens=turns * (_TURN + 64),
            max_turn_tokens=_TURN,
        ),
        tasks.ToolSettings(sandbox.Limits(), False, 30.0),
    )  # fmt: skip
    options = policy_loss.LossOptions(force_on_policy_ratio=True)
    engine = engine_lib.Engine(
        functools.partial(train_loss.loss_fn, config=frozen, options=options),
        params,
        optax.adam(learning_rate),
        learning_rate,
        recorder_lib.MetricsRecorder(),
        1,
    )
    rollout_fn = functools.partial(episode_rollout.rollout, setup=setup)
    step = rollout_batches.RolloutBatches(
        engine,
        frozen,
        lambda s: setup.task.train_records(s, _PROMPTS),
        lambda s: sampling.SamplingOptions(
            max_new_tokens=_TURN,
            temperature=1.0,
            seed=rollout_lib.step_seed(0, s),
            num_samples=_GENERATIONS,
            stop_ids=chat.stop_ids,
        ),
        [],
        num_micro_batches=1,
        estimator="rloo_normalized",
        advantage_eps=1e-6,
        width=room + turns * (_TURN + 64),
        rollout_fn=_negated(rollout_fn) if negate else rollout_fn,
        paged=_ENGINE,
    )
    means = []
    for s in range(steps):
      prepared = step.prepare(
          s, batch_source.Policy(engine.params, engine.step)
      )
      for micro_batch in prepared.batches:
        engine.fwd_bwd(micro_batch)
      engine.update(release=True)
      means.append(float(np.mean(prepared.rollout.rewards.total)))
      logging.info("step %d: mean training reward %.3f", s, means[-1])
      if stop_when is not None and stop_when(np.array(means)):
        break
    return np.array(means)

  def test_learns_the_marker(self):
    rewards = self._rewards(60, stop_when=lambda r: r[-1] >= 0.9)
    # The random policy writes the marker in 20-50% of its turns.
    self.assertTrue(0.2 <= rewards[:3].mean() <= 0.5, rewards)
    self.assertGreaterEqual(rewards[-1], 0.9, rewards)

  def test_negated_advantages_unlearn_the_marker(self):
    rewards = self._rewards(20, negate=True, stop_when=_unlearned)
    self.assertTrue(0.2 <= rewards[:3].mean() <= 0.5, rewards)
    self.assertTrue(_unlearned(rewards), rewards)

  def test_learns_to_call_the_tool(self):
    # Fine-tuned to call `mark` in a quarter of its turns; the reward needs
    # the call (the tool's answer, then a second turn).
    rewards = self._rewards(
        20, turns=2, tool_call=True, stop_when=_tool_calls_risen
    )
    # Step 0's episodes are the fine-tuned policy's, before any update.
    self.assertTrue(0.15 <= rewards[0] <= 0.5, rewards)
    self.assertTrue(_tool_calls_risen(rewards), rewards)

  def test_learns_the_marker_in_the_second_turn(self):
    rewards = self._rewards(30, turns=2, stop_when=_second_turn_risen)
    self.assertTrue(_second_turn_risen(rewards), rewards)


if __name__ == "__main__":
  absltest.main()
