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

  Every value is text (the environment converts it to the type its tool
  declares); the one newline after `<parameter=...>` and the one before
  `</parameter>` belong to the markup, not to the value.
* Hermes JSON: `<tool_call>{"name": "view_file", "arguments": {...}}`
  `</tool_call>` (`arguments` an object, or a string holding one).

The `qwen3_xml` form is read as leniently as the reference's parser reads
it: a `<function=NAME>` block without the `<tool_call>` wrapper is a call;
a missing `</parameter>`, `</function>` or `</tool_call>` ends where the
next parameter, function or call begins, or at the end of the text; text
between parameters is ignored. A reasoning block is not read: everything
before the last `</think>` is dropped, and an unclosed `<think>` drops the
rest of the text.

`parse` never raises on the model's text and reads it in time linear in
its length (each tag is searched for once per position it can be at): a
block that does not read (bad JSON, no function name, a parameter given
twice) is a `Malformed` entry in order with the good calls, which the
environment answers as a tool error.
"""

import dataclasses
import json
from typing import Any, Union

OPEN, CLOSE = "<tool_call>", "</tool_call>"

FUNCTION, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER, PARAMETER_CLOSE = "<parameter=", "</parameter>"
THINK, THINK_CLOSE = "<think>", "</think>"


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


class _Finder:
  """`text.find` for callers whose start positions never decrease: each
  needle's last answer is kept while it still holds, so every character is
  scanned at most once per needle (`scanned` counts them)."""

  def __init__(self, text: str):
    self.text = text
    self.scanned = 0
    self._last: dict[str, tuple[int, int]] = {}  # needle -> (from, found)

  def find(self, needle: str, start: int) -> int:
    """`self.text.find(needle, start)`; `start` never below an earlier one."""
    searched_from, found = self._last.get(needle, (-1, -2))
    if 0 <= searched_from <= start and (found < 0 or found >= start):
      return found
    found = self.text.find(needle, start)
    self.scanned += (len(self.text) if found < 0 else found) - start
    self._last[needle] = (start, found)
    return found

  def first(self, needles, start: int) -> tuple[int, str]:
    """The earliest of `needles` at or after `start`: (position, needle),
    (-1, "") when none is there."""
    best, which = -1, ""
    for needle in needles:
      at = self.find(needle, start)
      if at >= 0 and (best < 0 or at < best):
        best, which = at, needle
    return best, which


def _xml(body: str, counter: list[int]) -> Parsed:
  """A `qwen3_xml` function block (`<function=NAME>...`), read leniently."""
  closed = body.find(FUNCTION_CLOSE)
  body = body if closed < 0 else body[:closed]
  counter[0] += len(body)
  name_end = body.find(">")
  name = body[len(FUNCTION) : name_end].strip() if name_end >= 0 else ""
  if not name or any(c.isspace() for c in name):
    return Malformed(body[:200], "no <function=NAME> in the call")
  inner = _Finder(body)
  arguments = {}
  position = name_end + 1
  while True:
    start = inner.find(PARAMETER, position)
    if start < 0:
      break
    key_end = inner.find(">", start)
    key = body[start + len(PARAMETER) : key_end].strip() if key_end > 0 else ""
    if not key or any(c.isspace() for c in key):
      counter[0] += inner.scanned
      return Malformed(body[:200], "a <parameter=NAME> without its name")
    end, which = inner.first((PARAMETER_CLOSE, PARAMETER), key_end + 1)
    end = len(body) if end < 0 else end
    if key in arguments:
      counter[0] += inner.scanned
      return Malformed(body[:200], f"parameter {key!r} given twice")
    arguments[key] = _strip_one_newline(body[key_end + 1 : end])
    position = end + (len(PARAMETER_CLOSE) if which == PARAMETER_CLOSE else 0)
  counter[0] += inner.scanned
  return ToolCall(name, arguments)


def _json(body: str) -> Parsed:
  """A Hermes JSON call's body, read."""
  try:
    value = json.loads(body)
    arguments = value.get("arguments", {}) if isinstance(value, dict) else {}
    if isinstance(arguments, str):
      arguments = json.loads(arguments)
  # ValueError: bad JSON, or an integer past Python's digit limit;
  # RecursionError: nesting deeper than the decoder's stack.
  except (ValueError, RecursionError) as e:
    return Malformed(body[:200], f"not JSON: {str(e)[:200]}")
  if not isinstance(value, dict) or not isinstance(value.get("name"), str):
    return Malformed(
        body[:200], 'a JSON call is {"name": str, "arguments": {...}}'
    )
  if not isinstance(arguments, dict):
    return Malformed(body[:200], "arguments must be a JSON object")
  return ToolCall(value["name"], arguments)


def _without_reasoning(text: str) -> str:
  """The text after the last `</think>`; before an unclosed `<think>`."""
  closed = text.rfind(THINK_CLOSE)
  if closed >= 0:
    return text[closed + len(THINK_CLOSE) :]
  opened = text.find(THINK)
  return text if opened < 0 else text[:opened]


def _block(finder: _Finder, start: int, opener: str) -> tuple[str, int]:
  """The block that starts at `start` with `opener` (a call or a bare
  function): (its body, where reading goes on). It ends at its closing tag,
  or, without one, where the next call or function begins, or at the end."""
  text = finder.text
  closer = CLOSE if opener == OPEN else FUNCTION_CLOSE
  after = start + len(opener)
  # A call's own function tag is inside it, not the next block.
  ends = (closer, OPEN) if opener == OPEN else (closer, OPEN, FUNCTION)
  end, which = finder.first(ends, after)
  if end < 0:
    return text[after:], len(text)
  resume = end + (len(closer) if which == closer else 0)
  return text[after:end], resume


def scan(text: str) -> tuple[list[Parsed], int]:
  """`parse`'s calls and the characters it scanned (linear in the text)."""
  text = _without_reasoning(text)
  finder = _Finder(text)
  counter = [0]
  out: list[Parsed] = []
  position = 0
  while True:
    start, opener = finder.first((OPEN, FUNCTION), position)
    if start < 0:
      return out, finder.scanned + counter[0]
    body, position = _block(finder, start, opener)
    if opener == FUNCTION:
      out.append(_xml(FUNCTION + body, counter))
      continue
    body = body.strip()
    function = body.find(FUNCTION)
    counter[0] += len(body)
    if body.startswith("{"):
      out.append(_json(body))
    elif function >= 0:
      out.append(_xml(body[function:], counter))
    else:
      out.append(
          Malformed(body[:200], "neither <function=...> nor a JSON object")
      )


def parse(text: str) -> list[Parsed]:
  """Every tool call of `text`, in order (module docstring); never raises."""
  return scan(text)[0]


def format_xml(call: ToolCall) -> str:
  """The call in the `qwen3_xml` form (demonstrations write it)."""
  parts = [OPEN, f"<function={call.name}>"]
  for key, value in call.arguments.items():
    parts += [f"<parameter={key}>", str(value), "</parameter>"]
  parts += ["</function>", CLOSE]
  return "\n".join(parts)


def format_json(call: ToolCall) -> str:
  """The call in the Hermes JSON form."""
  body = json.dumps({"name": call.name, "arguments": call.arguments})
  return f"{OPEN}{body}{CLOSE}"
