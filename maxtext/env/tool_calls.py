"""Tool calls read from a model's text: the `qwen3_xml` and Hermes JSON forms.

A model asks for a tool inside `<tool_call>...</tool_call>`. Two bodies are
read, whichever the block holds:

* `qwen3_xml` (Qwen3-Coder, and Qwen3.5 with its XML tool parser):

      <tool_call>
      <function=edit_file>
      <parameter=path>
      pkg/core.py
      </parameter>
      <parameter=old>
      a - b
      </parameter>
      </function>
      </tool_call>

  Every value is text; the one newline after `<parameter=...>` and the one
  before `</parameter>` belong to the markup, not to the value.
* Hermes JSON: `<tool_call>{"name": "view_file", "arguments": {...}}`
  `</tool_call>` (`arguments` an object, or a string holding one).

`parse` never raises on the model's text: a block that does not read (an
unclosed tag, bad JSON, no function name, a parameter given twice) is a
`Malformed` entry in order with the good calls, which the environment
answers as a tool error.
"""

import dataclasses
import json
import re
from typing import Any, Union

OPEN, CLOSE = "<tool_call>", "</tool_call>"

_FUNCTION = re.compile(r"^<function=([^>\s]+)>(.*)</function>$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One well-formed call: the tool's name and its arguments."""

  name: str
  arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Malformed:
  """A block that does not read as a call, and why (one line)."""

  text: str
  reason: str


Parsed = Union[ToolCall, Malformed]


def _strip_one_newline(value: str) -> str:
  """The value without the markup's newline on each side."""
  if value.startswith("\n"):
    value = value[1:]
  if value.endswith("\n"):
    value = value[:-1]
  return value


def _xml(body: str) -> Parsed:
  """A `qwen3_xml` call's body, read."""
  match = _FUNCTION.match(body)
  if not match:
    return Malformed(body, "no <function=NAME>...</function> in the call")
  name, inner = match.groups()
  arguments = {}
  for key, value in _PARAMETER.findall(inner):
    if key in arguments:
      return Malformed(body, f"parameter {key!r} given twice")
    arguments[key] = _strip_one_newline(value)
  rest = _PARAMETER.sub("", inner).strip()
  if rest:
    return Malformed(body, f"text outside a <parameter=...> block: {rest:.60}")
  return ToolCall(name, arguments)


def _json(body: str) -> Parsed:
  """A Hermes JSON call's body, read."""
  try:
    value = json.loads(body)
  except json.JSONDecodeError as e:
    return Malformed(body, f"not JSON: {e}")
  if not isinstance(value, dict) or not isinstance(value.get("name"), str):
    return Malformed(body, 'a JSON call is {"name": str, "arguments": {...}}')
  arguments = value.get("arguments", {})
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments)
    except json.JSONDecodeError as e:
      return Malformed(body, f"arguments are not JSON: {e}")
  if not isinstance(arguments, dict):
    return Malformed(body, "arguments must be a JSON object")
  return ToolCall(value["name"], arguments)


def parse(text: str) -> list[Parsed]:
  """Every `<tool_call>` block of `text`, in order; never raises."""
  out: list[Parsed] = []
  position = 0
  while True:
    start = text.find(OPEN, position)
    if start < 0:
      return out
    end = text.find(CLOSE, start + len(OPEN))
    if end < 0:
      out.append(Malformed(text[start:], f"{OPEN} without {CLOSE}"))
      return out
    body = text[start + len(OPEN) : end].strip()
    if body.startswith("<function="):
      out.append(_xml(body))
    elif body.startswith("{"):
      out.append(_json(body))
    else:
      out.append(Malformed(body, "neither <function=...> nor a JSON object"))
    position = end + len(CLOSE)


def format_xml(call: ToolCall) -> str:
  """The call in the `qwen3_xml` form (demonstrations write it)."""
  parts = [OPEN, f"<function={call.name}>"]
  for key, value in call.arguments.items():
    parts += [f"<parameter={key}>", str(value), "</parameter>"]
  parts += ["</function>", CLOSE]
  return "\n".join(parts)
