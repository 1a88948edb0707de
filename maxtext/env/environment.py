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
the episode.

A tool declares its parameters by its Python signature: each annotated
`str`, `int`, `float`, `bool`, `list` (or `list[int]`...), `dict`, or
`Optional` of one, and each string at most `max_chars` characters (its
schema's `maxLength`). An argument is converted to its parameter's type
when it converts exactly (the `qwen3_xml` form gives text: "3" for an
integer, "true" for a boolean, JSON text for a list or an object, "null"
for an optional one), as the reference's parser does by the tool's
schema; anything else is an error. Every tool call ends as a tool message:
a malformed call, an unknown tool, a missing, unknown or ill-typed
argument, a tool that raises `ToolError`, and any other exception a tool
raises (logged with its traceback) are answered as `Error: ...`; the
episode goes on. Tool messages are valid UTF-8 text (what cannot be
encoded is replaced).

`deadline` is the `time.monotonic()` by which the episode must end (the
episode runner sets it); tools bound their commands by it.
"""

import abc
import dataclasses
import inspect
import json
import logging
import math
import re
import types
import typing
from typing import Any, Callable, Mapping, Optional

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
  deadline: Optional[float] = None

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


# The most characters a string argument may have unless its tool says.
MAX_CHARS = 1 << 20
_JSON_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}
_INTEGER = re.compile(r"^\s*[+-]?\d{1,30}\s*$")


def _declared(annotation) -> tuple[type, Optional[type], bool]:
  """(the base type, a list's item type, whether None is allowed)."""
  optional = False
  if typing.get_origin(annotation) is typing.Union:
    members = [
        a for a in typing.get_args(annotation) if a is not types.NoneType
    ]
    optional = len(members) < len(typing.get_args(annotation))
    annotation = members[0] if len(members) == 1 else annotation
  item = None
  if typing.get_origin(annotation) is list:
    (item,) = typing.get_args(annotation)
    annotation = list
  if annotation not in _JSON_TYPES or item not in (None, *_JSON_TYPES):
    raise TypeError(f"tool parameter type {annotation!r}: not declarable")
  return annotation, item, optional


def _scalar(value: Any, kind: type) -> Any:
  """`value` as `kind` when it converts exactly; ValueError otherwise."""
  if kind is str:
    if isinstance(value, str):
      return value
  elif kind is bool:
    if isinstance(value, bool):
      return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
      return value.strip().lower() == "true"
  elif kind is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
    if isinstance(value, float) and value.is_integer():
      return int(value)
    if isinstance(value, str) and _INTEGER.match(value):
      return int(value)
  elif kind is float:
    if isinstance(value, str):
      try:
        value = float(value)
      except ValueError:
        pass
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      if math.isfinite(value):
        return float(value)
  else:  # list, dict: the value, or JSON text of one.
    if isinstance(value, str):
      try:
        value = json.loads(value)
      except (ValueError, RecursionError):
        pass
    if isinstance(value, kind):
      return value
  raise ValueError(f"must be {_JSON_TYPES[kind]}")


def convert(value: Any, annotation, max_chars: int = MAX_CHARS) -> Any:
  """An argument as its parameter's declared type (module docstring).

  Raises:
    ValueError: one line: it does not convert exactly, or it is too long.
  """
  kind, item, optional = _declared(annotation)
  if optional and (
      value is None or isinstance(value, str) and value.strip() == "null"
  ):
    return None
  value = _scalar(value, kind)
  if item is not None:
    value = [_scalar(v, item) for v in value]
  if isinstance(value, str) and len(value) > max_chars:
    raise ValueError(f"longer than {max_chars} characters")
  return value


def _schema(
    name: str,
    fn: Callable[..., str],
    description: str,
    max_chars: Mapping[str, int],
) -> dict:
  """A tool's JSON schema from its signature's declared types."""
  parameters = inspect.signature(fn).parameters
  hints = typing.get_type_hints(fn)
  properties = {}
  for p in parameters:
    kind, item, _ = _declared(hints.get(p, str))
    properties[p] = {"type": _JSON_TYPES[kind]}
    if item is not None:
      properties[p]["items"] = {"type": _JSON_TYPES[item]}
    if kind is str:
      properties[p]["maxLength"] = max_chars.get(p, MAX_CHARS)
  return {
      "type": "function",
      "function": {
          "name": name,
          "description": description,
          "parameters": {
              "type": "object",
              "properties": properties,
              "required": [
                  p
                  for p, v in parameters.items()
                  if v.default is inspect.Parameter.empty
              ],
          },
      },
  }


def _text(content: str) -> str:
  """`content` as valid UTF-8 text (lone surrogates replaced)."""
  return content.encode("utf-8", "replace").decode("utf-8")


# `start` stays abstract: each tool environment says its first messages.
class ToolEnvironment(Environment):  # pylint: disable=abstract-method
  """An environment whose model turns call tools.

  A subclass registers its tools with `add_tool(name, fn, description)`
  (`fn(**arguments) -> str`, its parameters declared by their annotations:
  module docstring) and may call `finish()` from a tool (a "submit") to
  end the episode after the turn.
  """

  def __init__(self, kind: str):
    self.kind = kind
    self._tools: dict[str, Callable[..., str]] = {}
    self._max_chars: dict[str, Mapping[str, int]] = {}
    self.tools = []
    self._finished = False

  def add_tool(
      self,
      name: str,
      fn: Callable[..., str],
      description: str,
      max_chars: Optional[Mapping[str, int]] = None,
  ):
    """Registers a tool; `max_chars`: parameter -> its longest string
    (MAX_CHARS unless given)."""
    self._max_chars[name] = dict(max_chars or {})
    self._tools[name] = fn
    self.tools.append(_schema(name, fn, description, self._max_chars[name]))

  def _arguments(self, name: str, fn, arguments: dict) -> dict[str, Any]:
    """The call's arguments bound and converted (ToolError: why not)."""
    try:
      inspect.signature(fn).bind(**arguments)
    except TypeError as e:
      raise ToolError(f"{name}: {e}") from None
    hints = typing.get_type_hints(fn)
    out = {}
    for key, value in arguments.items():
      try:
        out[key] = convert(
            value,
            hints.get(key, str),
            self._max_chars[name].get(key, MAX_CHARS),
        )
      except ValueError as e:
        raise ToolError(f"{name}: argument {key!r}: {e}") from None
    return out

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
      return str(fn(**self._arguments(call.name, fn, call.arguments))), False
    except ToolError as e:
      return f"Error: {e}", True
    # Whatever a tool raises is the model's call failing, not the run's.
    except Exception as e:  # pylint: disable=broad-exception-caught
      logging.warning(
          "%s episode: tool %s raised", self.kind, call.name, exc_info=True
      )
      return f"Error: {call.name} failed: {type(e).__name__}: {e}"[:2000], True

  def step(self, text: str) -> Reply:
    calls = tool_calls.parse(text)
    if not calls:
      return Reply([], done=True)
    messages, errors = [], 0
    for call in calls:
      content, error = self._call(call)
      errors += error
      messages.append({"role": "tool", "content": _text(content)})
    return Reply(messages, self._finished, len(calls), errors)
