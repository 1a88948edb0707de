"""The episode runner with the real chat template and a scripted policy.

The policy is a generation function that writes given texts (so the tests
know every turn); the template, the tokenizer, the tool-call parsing and
the environments are the real ones.
"""

import dataclasses
import itertools

from absl.testing import absltest

from maxtext.env import environment
from maxtext.env import episodes
from maxtext.generation import sampling
from maxtext.text import byte_chat
from maxtext.text import chat

_CALL = (
    "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n"
    "<parameter=b>\n3\n</parameter>\n</function>\n</tool_call>"
)


class Adder(environment.ToolEnvironment):
  """A tool environment: `add` answers the sum; reward 1 if told 5."""

  def __init__(self, task):
    super().__init__("adder")
    self.task = task
    self.add_tool("add", self._add, "Adds two integers.")
    self.answer = None
    self.closed = False

  def _add(self, a, b):
    try:
      return str(int(a) + int(b))
    except ValueError:
      raise environment.ToolError(f"not integers: {a!r}, {b!r}") from None

  def start(self):
    return [{"role": "user", "content": self.task["prompt"]}]

  def step(self, text):
    reply = super().step(text)
    if reply.done:
      self.answer = text
    return reply

  def reward(self):
    return float(self.answer == "5")

  def timed_out_reward(self):
    return self.task.get("timeout_reward", 0.0)

  def close(self):
    self.closed = True


class Scripted:
  """A generation function writing `turns[episode][turn]` for each context."""

  def __init__(self, chat_tokenizer, scripts, stop=True):
    self.chat = chat_tokenizer
    self.scripts = scripts
    self.calls = []
    self.stop = stop

  def __call__(self, contexts, options, budgets):
    self.calls.append((list(map(list, contexts)), options, list(budgets)))
    out = []
    for context, budget in zip(contexts, budgets):
      # The episode is known by its prompt (the scripts' keys).
      text = self.chat.tokenizer.decode(context, skip_special_tokens=False)
      key = next(k for k in self.scripts if k in text)
      turn = text.count("<|im_start|>assistant") - 1
      text = self.scripts[key][turn]
      ids = self.chat.tokenizer.encode(text, add_special_tokens=False).ids
      if self.stop:
        ids.append(self.chat.end_of_turn_id)
      ids = ids[:budget]
      out.append(episodes.Completion(ids, [-0.5] * len(ids)))
    return out


class EpisodesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.chat = chat.ChatTokenizer.load(
        byte_chat.write(self.create_tempdir().full_path)
    )
    self.options = sampling.SamplingOptions(
        max_new_tokens=8, temperature=1.0, seed=3, stop_ids=self.chat.stop_ids
    )
    self.envs = []

  def _make(self, task):
    env = (
        Adder(task)
        if task.get("kind") == "adder"
        else (environment.SingleTurn(task))
    )
    self.envs.append(env)
    return env

  def _run(self, tasks, scripts, limits, **kwargs):
    generate = Scripted(self.chat, scripts, **kwargs.pop("script", {}))
    result = episodes.run(
        tasks, self._make, self.chat, generate, self.options, limits, **kwargs
    )
    return result, generate

  def test_single_turn(self):
    (e,), generate = self._run(
        [{"prompt": "Say hi", "kind": "hello"}],
        {"Say hi": ["hi"]},
        episodes.Limits(max_turns=1, max_turn_tokens=16),
    )
    messages = [{"role": "user", "content": "Say hi"}]
    self.assertEqual(e.prompt_ids, self.chat.encode_prompt(messages))
    self.assertEqual(self.chat.decode(e.ids), "hi")
    self.assertEqual(e.model_mask, [1] * 3)
    self.assertEqual((e.turns, e.done, e.truncated, e.timed_out), (1, 1, 0, 0))
    self.assertIsNone(e.env_reward)
    self.assertLen(generate.calls, 1)
    options = generate.calls[0][1]
    self.assertEqual((options.num_samples, options.max_new_tokens), (1, 16))

  def test_a_turn_asks_for_what_is_left_of_the_episode(self):
    tasks = [{"prompt": "What is 2+3?", "kind": "adder"}]
    scripts = {"2+3": [_CALL, "5"]}
    (e,), generate = self._run(
        tasks,
        scripts,
        episodes.Limits(max_turns=4, max_tokens=2000, max_turn_tokens=200),
    )
    self.assertEqual([call[2] for call in generate.calls], [[200], [200]])
    # The ids before the second turn: the call and the tool's answer.
    before = len(generate.calls[1][0][0]) - len(e.prompt_ids)
    (e,), generate = self._run(
        tasks,
        scripts,
        episodes.Limits(
            max_turns=4, max_tokens=before + 3, max_turn_tokens=200
        ),
    )
    self.assertEqual(generate.calls[1][2], [3])
    self.assertEqual(generate.calls[1][1].max_new_tokens, 3)
    self.assertEqual(self.chat.decode(e.ids[before:]), "5")
    self.assertTrue(e.done)
    self.assertFalse(e.truncated)

  def test_tool_turns_append_exactly_the_templates_tokens(self):
    tasks = [{"prompt": "What is 2+3?", "kind": "adder"}]
    (e,), generate = self._run(
        tasks,
        {"2+3": [_CALL, "5"]},
        episodes.Limits(max_turns=4, max_tokens=2000, max_turn_tokens=200),
    )
    self.assertEqual((e.turns, e.tool_calls, e.tool_errors), (2, 1, 0))
    self.assertTrue(e.done)
    self.assertEqual(e.env_reward, 1.0)
    self.assertEqual(e.model_text, [_CALL, "5"])
    # The second turn's context is the whole conversation as the template
    # renders it, with the tool's answer, up to the generation prompt.
    conversation = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": _CALL},
        {"role": "tool", "content": "5"},
    ]
    tools = self.envs[0].tools
    second_context = generate.calls[1][0][0]
    self.assertEqual(
        second_context,
        self.chat.encode_prompt(conversation, tools=tools),
    )
    # The model's ids are its own; the tool's and the template's are not.
    model_ids = [i for i, m in zip(e.ids, e.model_mask) if m]
    self.assertEqual(
        self.chat.decode(model_ids),
        self.chat.decode(self.chat.tokenizer.encode(_CALL + "5").ids),
    )
    env_text = self.chat.tokenizer.decode(
        [i for i, m in zip(e.ids, e.model_mask) if not m],
        skip_special_tokens=False,
    )
    self.assertEqual(
        env_text,
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
    )
    self.assertEqual(e.model_tokens + e.env_tokens, len(e.ids))
    self.assertEqual(
        [p for p, m in zip(e.log_probs, e.model_mask) if not m],
        [0.0] * e.env_tokens,
    )
    self.assertTrue(self.envs[0].closed)

  def test_malformed_and_unknown_calls_are_tool_errors(self):
    bad = '<tool_call>{oops</tool_call><tool_call>{"name": "mul"}</tool_call>'
    args = _CALL.replace("3", "three")
    (e,), generate = self._run(
        [{"prompt": "What is 2+3?", "kind": "adder"}],
        {"2+3": [bad, args, "5"]},
        episodes.Limits(max_turns=4, max_tokens=4000, max_turn_tokens=200),
    )
    self.assertEqual((e.turns, e.tool_calls, e.tool_errors), (3, 3, 3))
    third = self.chat.decode(generate.calls[2][0][0])
    self.assertIn("Error: malformed tool call: not JSON", third)
    self.assertIn("Error: no tool 'mul'", third)
    self.assertIn("Error: not integers", third)
    self.assertEqual(e.env_reward, 1.0)

  def test_truncated_only_at_the_length_limit(self):
    # MLPerf qwen35_397b_grpo's reference marks an episode truncated when its
    # conversation reaches the model's length, and only then.
    def reference_truncated(e, limits, overflowed):
      return len(e.ids) == limits.max_tokens or overflowed

    scripts = {"2+3": [_CALL] * 10}
    adder = [{"prompt": "What is 2+3?", "kind": "adder"}]
    # The turn limit: scored and trained, not truncated.
    limits = episodes.Limits(max_turns=2, max_tokens=4000, max_turn_tokens=200)
    (e,), _ = self._run(adder, scripts, limits)
    self.assertEqual((e.turns, e.turn_limit, e.done), (2, True, False))
    self.assertEqual(e.truncated, reference_truncated(e, limits, False))
    self.assertFalse(e.truncated)
    self.assertEqual(e.env_reward, 0.0)  # Scored as it stands.
    self.assertGreater(e.env_tokens, 0)  # Both tool answers kept.
    # The length: the first turn fits, its tool answer does not.
    limits = episodes.Limits(max_turns=5, max_tokens=110, max_turn_tokens=200)
    (e,), _ = self._run(adder, scripts, limits)
    self.assertEqual((e.turns, e.truncated), (1, True))
    self.assertEqual(e.truncated, reference_truncated(e, limits, True))
    self.assertLessEqual(len(e.ids), 110)
    self.assertEqual(e.env_tokens, 0)
    # A turn that fills the length without its stop id.
    limits = episodes.Limits(max_turns=3, max_tokens=4, max_turn_tokens=4)
    (e,), _ = self._run([{"prompt": "Say hi"}], {"Say hi": ["hello"]}, limits)
    self.assertEqual((len(e.ids), e.truncated, e.done), (4, True, False))
    self.assertEqual(e.truncated, reference_truncated(e, limits, False))

  def test_the_length_counts_the_first_prompt(self):
    # MLPerf qwen35_397b_grpo's reference bounds the whole conversation,
    # the first prompt counted: a shorter first prompt leaves its episode
    # more of the length, and every episode that reaches it ends at exactly
    # max_length tokens in all.
    tasks = [{"prompt": "Say hi"}, {"prompt": "Say hi, at length, " * 4}]
    scripts = {"Say hi": ["hello " * 40]}
    prompts = [
        len(self.chat.encode_prompt([{"role": "user", "content": t["prompt"]}]))
        for t in tasks
    ]
    self.assertGreater(prompts[1] - prompts[0], 60)
    limits = episodes.Limits(
        max_turns=3, max_tokens=4000, max_turn_tokens=4000,
        max_length=prompts[1] + 20,
    )  # fmt: skip
    (short, long), generate = self._run(
        tasks, scripts, limits, script={"stop": False}
    )
    self.assertEqual(generate.calls[0][2], [prompts[1] + 20 - prompts[0], 20])
    for e in (short, long):
      self.assertEqual(e.length, limits.max_length)
      self.assertEqual((e.turns, e.truncated), (1, True))
    self.assertEqual(len(short.ids), prompts[1] + 20 - prompts[0])
    # max_tokens still bounds the ids after the prompt.
    (short, long), _ = self._run(
        tasks,
        scripts,
        dataclasses.replace(limits, max_tokens=30),
        script={"stop": False},
    )
    self.assertEqual((len(short.ids), len(long.ids)), (30, 20))
    self.assertTrue(short.truncated and long.truncated)
    # A first prompt that leaves no room for a turn: refused before any
    # generation.
    generate = Scripted(self.chat, scripts)
    with self.assertRaisesRegex(
        ValueError,
        rf"^a first prompt of {prompts[1]} tokens leaves no room for a turn "
        rf"in an episode's length \({prompts[1]} tokens in all",
    ):
      episodes.run(
          tasks,
          self._make,
          self.chat,
          generate,
          self.options,
          dataclasses.replace(limits, max_length=prompts[1]),
      )
    self.assertEqual(generate.calls, [])

  def test_a_turn_cut_below_the_length_goes_to_the_environment(self):
    # 4 ids of "hello there" (no stop id), well below the 4,000 of the
    # length: the environment answers the turn and the episode goes on.
    limits = episodes.Limits(max_turns=3, max_tokens=4000, max_turn_tokens=4)
    (e,), generate = self._run(
        [{"prompt": "What is 2+3?", "kind": "adder"}],
        {"2+3": ["hello there", "5", "5"]},
        limits,
        script={"stop": False},
    )
    self.assertFalse(e.truncated)
    self.assertEqual(e.model_tokens, 4 * e.turns)
    self.assertEqual(e.turns, 1)  # No call in the turn: the episode ended.
    self.assertTrue(e.done)
    self.assertEqual(self.envs[0].answer, "hell")
    self.assertLen(generate.calls, 1)

  def test_each_episode_has_its_own_time_limit(self):
    # The clock reads 0 and 1 as the two episodes start, then 2, 3, ...
    # after each turn; the limit is 1.5 s from each episode's start.
    ticks = itertools.count()
    tasks = [
        {"prompt": "What is 2+3?", "kind": "adder"},
        {"prompt": "Now 2+3?", "kind": "adder", "timeout_reward": 0.25},
    ]
    result, _ = self._run(
        tasks,
        {"What is 2+3": [_CALL, "5"], "Now 2+3": [_CALL, _CALL, "5"]},
        episodes.Limits(
            max_turns=5, max_tokens=4000, max_turn_tokens=200,
            episode_seconds=1.5,
        ),
        clock=lambda: float(next(ticks)),
    )  # fmt: skip
    first, second = result
    # After turn 1 (clock 2): the first episode is 2 s old and ends; the
    # second, 1 s old, goes on and is past its time after turn 2 (clock 3).
    self.assertEqual(
        (first.turns, first.timed_out, first.done), (1, True, False)
    )
    self.assertEqual((second.turns, second.timed_out), (2, True))
    # Each keeps its tokens (the tool answers included) and takes its
    # environment's timed-out reward: 0, unless the environment says
    # otherwise.
    self.assertGreater(first.env_tokens, 0)
    self.assertEqual((first.env_reward, second.env_reward), (0.0, 0.25))
    self.assertFalse(first.truncated or second.truncated)
    self.assertTrue(all(env.closed for env in self.envs))

  def test_bad_limits(self):
    with self.assertRaisesRegex(ValueError, "max_turns=0"):
      episodes.Limits(max_turns=0)
    with self.assertRaisesRegex(ValueError, "max_length=0: must be > 0"):
      episodes.Limits(max_length=0)


if __name__ == "__main__":
  absltest.main()
