"""GRPO learns through the episode path: a text task on the tiny model.

The policy is the tiny model with the byte-level ChatML tokenizer, at its
random start. Each episode is a chat: the task's prompt, rendered by the
template, then the model's turn, decoded and answered by the environment
(`maxtext.env.episodes`), rolled out by `episode_rollout.rollout` and
trained by the GRPO step (`step.GrpoStep`) with the loss of the benchmark's
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
"""

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
from maxtext.generation import paged_decoder
from maxtext.generation import sampling
from maxtext.grpo import episode_rollout
from maxtext.grpo import policy_loss
from maxtext.grpo import rollout as rollout_lib
from maxtext.grpo import step as step_lib
from maxtext.grpo import text_task
from maxtext.grpo import train_loss
from maxtext.metrics import recorder as recorder_lib
from maxtext.model import transformer
from testing import tiny_configs

_MARKER = "!"
_TURN = 96  # Ids per model turn.
_PROMPTS, _GENERATIONS = 4, 8


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


def _negated(rollout_fn):
  """`rollout_fn` whose advantages are negated."""

  def negated(*args, **kwargs):
    result = rollout_fn(*args, **kwargs)
    return dataclasses.replace(result, advantages=-result.advantages)

  return negated


class EpisodeLearnTest(absltest.TestCase):

  def _rewards(self, steps, turns=1, negate=False, stop_at=None):
    """The mean training reward of each of `steps` GRPO steps (fewer when
    one reaches `stop_at`)."""
    learning_rate = 3e-3
    config = tiny_configs.model_config(vocab_size=320, max_sequence_length=512)
    frozen = ml_collections.FrozenConfigDict(config)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    chat = text_task.load_tokenizer(text_task.BYTE_CHATML)
    setup = episode_rollout.EpisodeSetup(
        _MarkerTask(turns),
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
    step = step_lib.GrpoStep(
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
        width=96 + turns * (_TURN + 64),
        rollout_fn=_negated(rollout_fn) if negate else rollout_fn,
        paged=paged_decoder.EngineOptions(),
    )
    means = []
    for s in range(steps):
      result = step.run(s)
      means.append(float(np.mean(result.rollout.rewards.total)))
      logging.info("step %d: mean training reward %.3f", s, means[-1])
      if stop_at is not None and means[-1] >= stop_at:
        break
    return np.array(means)

  def test_learns_the_marker(self):
    rewards = self._rewards(60, stop_at=0.9)
    # The random policy writes the marker in 20-50% of its turns.
    self.assertTrue(0.2 <= rewards[:3].mean() <= 0.5, rewards)
    self.assertGreaterEqual(rewards[-1], 0.9, rewards)

  def test_negated_advantages_unlearn_the_marker(self):
    rewards = self._rewards(20, negate=True)
    self.assertTrue(0.2 <= rewards[:3].mean() <= 0.5, rewards)
    self.assertLess(rewards[-5:].mean(), rewards[:3].mean() - 0.1, rewards)

  def test_learns_the_marker_in_the_second_turn(self):
    rewards = self._rewards(30, turns=2)
    self.assertGreaterEqual(
        rewards[-5:].mean() - rewards[:3].mean(), 0.3, rewards
    )


if __name__ == "__main__":
  absltest.main()
