"""Junk through both tool-call forms and every built-in tool: `step`
always returns, every call ends as a tool message of valid text, and the
host is untouched (real sandbox, real files)."""

import json
import os
import random
import shutil
import tempfile

from absl.testing import absltest

from maxtext.env import repair_task
from maxtext.env import sandbox
from maxtext.env import tasks
from maxtext.env import tiny_benchmark_inputs
from maxtext.env import tool_calls

_SETTINGS = tasks.ToolSettings(sandbox.Limits(wall_seconds=5), True, 5.0)
_STRINGS = (
    "", " ", "a\0b", "\ud800", "\udcff", "../../etc/passwd", "/etc/shadow",
    "/testbed", "/testbed/../..", ".", "tests", "pipe", "x" * 70000,
    "[1, 2]", "[1", "null", "true", "3", "-1", "1e999", "view", "create",
    "str_replace", "<parameter=p>", "</function>", "echo hi", "exit 3",
    "\n", "é" * 40000,
)  # fmt: skip


def _value(rng: random.Random, depth: int = 0):
  """A random JSON-able value of any type, the model's strings among them."""
  kind = rng.randrange(9 if depth < 2 else 6)
  if kind < 3:
    return rng.choice(_STRINGS)
  if kind == 3:
    return rng.choice([0, -1, 2**70, 3.5, float("nan")])
  if kind == 4:
    return rng.choice([True, False, None])
  if kind == 5:
    return "".join(chr(rng.randrange(0x110000)) for _ in range(8))
  if kind in (6, 7):
    return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]
  return {rng.choice(_STRINGS[:8]): _value(rng, depth + 1)}


def _text(rng: random.Random, tools: list[str]) -> str:
  """A model turn: calls of real tools with junk, in either form, or junk."""
  parts = []
  for _ in range(rng.randrange(1, 4)):
    name = rng.choice(tools + ["nope", ""])
    arguments = {
        rng.choice(["path", "command", "old", "new", "old_str", "new_str",
                    "file_text", "view_range", "message", "zzz"]):
        _value(rng)
        for _ in range(rng.randrange(4))
    }  # fmt: skip
    call = tool_calls.ToolCall(name, arguments)
    form = rng.randrange(3)
    if form == 0:
      parts.append(tool_calls.format_xml(call))
    elif form == 1:
      parts.append(tool_calls.format_json(call))
    else:
      text = tool_calls.format_xml(call)
      cut = rng.randrange(len(text) + 1)
      parts.append(text[:cut] + bytes(
          rng.randrange(256) for _ in range(rng.randrange(30))
      ).decode("utf-8", "replace"))  # fmt: skip
  return "".join(parts)


class ToolFuzzTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    sandbox.check_available()
    cls.directory = tempfile.mkdtemp()
    cls.inputs = tasks.TaskInputs(**tiny_benchmark_inputs.write(cls.directory))

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.directory)
    super().tearDownClass()

  def _fuzz(self, env, seed: int, turns: int):
    """`turns` junk turns through `env`; then its reward."""
    names = [tool["function"]["name"] for tool in env.tools]
    # A FIFO in the episode's scratch, as a tool would make it.
    scratch = env._box.scratch  # pylint: disable=protected-access
    os.mkfifo(os.path.join(scratch, "pipe"))
    rng = random.Random(seed)
    for _ in range(turns):
      text = _text(rng, names)
      reply = env.step(text)
      self.assertEqual(len(reply.messages), reply.tool_calls, text[:200])
      for message in reply.messages:
        message["content"].encode("utf-8")
      json.dumps(reply.messages)
    self.assertIn(env.reward(), (0.0, 1.0))

  def test_repair_tools(self):
    env = repair_task.RepairEnvironment(repair_task.problem(5), _SETTINGS)
    self.addCleanup(env.close)
    self._fuzz(env, seed=0, turns=150)

  def test_benchmark_tools(self):
    task = tasks.load("maxtext.env.benchmark_task:make_task", 2, 0, self.inputs)
    env = task.make_environment(task.train_records(0, 1)[0], _SETTINGS)
    self.addCleanup(env.close)
    self._fuzz(env, seed=1, turns=150)


if __name__ == "__main__":
  absltest.main()
