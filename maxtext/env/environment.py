"""The environment interface of GRPO episodes, and its two common shapes.

An episode is a conversation between the policy and an environment made
for one task record (a dict: the task's fields, with "kind" naming the
task):

    env = make_environment(task)        # one per episode
    messages = env.start()              # the first messages (chat form)
    reply = env.step(model_text)        # each model turn: tool results or
                                        # the end (`Reply`)
    env.reward()                        # the verifier's reward, or None
    env.close()

The episode runner (`episodes.run`) renders the messages with the policy's
chat template, generates the model's turns and enforces the limits (turns,
tokens, wall time); an environment only answers turns. `SingleTurn` is a
task of one turn (the run's reward functions score its text);
`ToolEnvironment` answers the tool calls in a model turn (read by
`tool_calls.parse`), one tool message each, and a turn without a call ends
the episode. A malformed call, an unknown tool, bad arguments or a tool that
raises `ToolError` is answered as a tool error message; the episode goes on.
"""

import abc
import dataclasses
import inspect
from typing import Any, Callable, Optional

from maxtext.env import tool_calls


class ToolError(Exception):
  """A tool's answer that is an error (shown to the model as such)."""


@dataclasses.dataclass
class Reply:
  """The environment's answer to one model turn.

  Attributes:
    messages: appended to the conversation (role "tool" or "user").
    done: the episode ended.
    tool_calls: calls in the turn (malformed ones included).
    tool_errors: calls answered with an error.
  """

  messages: list[dict[str, Any]]
  done: bool
  tool_calls: int = 0
  tool_errors: int = 0


class Environment(abc.ABC):
  """One episode's environment.

  Attributes:
    kind: the task's kind (metrics report reward per kind).
    tools: the tools' JSON schemas, given to the chat template as `tools`
      (None: no tools).
  """

  kind: str = "task"
  tools: Optional[list[dict[str, Any]]] = None

  @abc.abstractmethod
  def start(self) -> list[dict[str, Any]]:
    """The first messages (chat form: {"role", "content"} dicts)."""

  @abc.abstractmethod
  def step(self, text: str) -> Reply:
    """Answers the model's turn `text` (its own tokens, decoded)."""

  def reward(self) -> Optional[float]:
    """The episode's reward from its verifier; None: the run's reward
    functions alone score it. Called once, when the episode ends (it may
    have been cut by a limit)."""
    return None

  def timed_out_reward(self) -> Optional[float]:
    """The reward of an episode its time limit ended (called instead of
    `reward`): 0, as MLPerf qwen35_397b_grpo's reference scores an agent
    that ran out of time. The episode stays a sample of its group."""
    return 0.0

  def close(self) -> None:
    """Frees what the episode holds (a sandbox)."""


def first_messages(task: dict[str, Any]) -> list[dict[str, Any]]:
  """A task's "messages", or its "prompt" text as one user message."""
  if "messages" in task:
    messages = task["messages"]
    if not isinstance(messages, list) or not messages:
      raise ValueError(f"task {task.get('id', '?')}: messages must be a list")
    return [dict(m) for m in messages]
  prompt = task.get("prompt")
  if not isinstance(prompt, str):
    raise ValueError(
        f"task {task.get('id', '?')}: give a 'prompt' text or 'messages'"
    )
  return [{"role": "user", "content": prompt}]


class SingleTurn(Environment):
  """A task of one model turn: the prompt, then the end."""

  def __init__(self, task: dict[str, Any]):
    self.kind = str(task.get("kind", "task"))
    self._messages = first_messages(task)

  def start(self) -> list[dict[str, Any]]:
    return list(self._messages)

  def step(self, text: str) -> Reply:
    del text  # The run's reward functions read it.
    return Reply([], done=True)


def _schema(name: str, fn: Callable[..., str], description: str) -> dict:
  """A tool's JSON schema from its signature: every parameter a string."""
  parameters = inspect.signature(fn).parameters
  return {
      "type": "function",
      "function": {
          "name": name,
          "description": description,
          "parameters": {
              "type": "object",
              "properties": {p: {"type": "string"} for p in parameters},
              "required": [
                  p
                  for p, v in parameters.items()
                  if v.default is inspect.Parameter.empty
              ],
          },
      },
  }


# `start` stays abstract: each tool environment says its first messages.
class ToolEnvironment(Environment):  # pylint: disable=abstract-method
  """An environment whose model turns call tools.

  A subclass registers its tools with `add_tool(name, fn, description)`
  (`fn(**arguments) -> str`, its parameters strings) and may call
  `finish()` from a tool (a "submit") to end the episode after the turn.
  """

  def __init__(self, kind: str):
    self.kind = kind
    self._tools: dict[str, Callable[..., str]] = {}
    self.tools = []
    self._finished = False

  def add_tool(self, name: str, fn: Callable[..., str], description: str):
    self._tools[name] = fn
    self.tools.append(_schema(name, fn, description))

  def finish(self) -> None:
    """Ends the episode after the current turn."""
    self._finished = True

  def _call(self, call: tool_calls.Parsed) -> tuple[str, bool]:
    """(the tool message's text, whether it is an error)."""
    if isinstance(call, tool_calls.Malformed):
      return f"Error: malformed tool call: {call.reason}", True
    fn = self._tools.get(call.name)
    if fn is None:
      return (
          f"Error: no tool {call.name!r}; tools: {', '.join(self._tools)}",
          True,
      )
    try:
      inspect.signature(fn).bind(**call.arguments)
    except TypeError as e:
      return f"Error: {call.name}: {e}", True
    try:
      return str(fn(**call.arguments)), False
    except ToolError as e:
      return f"Error: {e}", True

  def step(self, text: str) -> Reply:
    calls = tool_calls.parse(text)
    if not calls:
      return Reply([], done=True)
    messages, errors = [], 0
    for call in calls:
      content, error = self._call(call)
      errors += error
      messages.append({"role": "tool", "content": content})
    return Reply(messages, self._finished, len(calls), errors)
