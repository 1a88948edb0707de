"""Tool environments: arguments typed by the tools' declarations, and every
call, however it fails, answered as a tool message."""

from typing import Optional

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.env import environment
from maxtext.env import tool_calls


class _Tools(environment.ToolEnvironment):
  """Tools of every declarable type, and one that fails as tools do."""

  def __init__(self):
    super().__init__("test")
    self.seen = []
    self.add_tool("typed", self.typed, "All types.", max_chars={"s": 5})
    self.add_tool("crash", self.crash, "Raises.")

  def start(self):
    return []

  def typed(
      self,
      s: str = "",
      n: int = 0,
      x: float = 0.0,
      b: bool = False,
      items: Optional[list[int]] = None,
      d: Optional[dict] = None,
  ) -> str:
    """Records what it was given."""
    self.seen.append((s, n, x, b, items, d))
    return "ok"

  def crash(self, path: str) -> str:
    return open(path, encoding="utf-8").read()  # NUL: ValueError.


def _xml(name, **arguments) -> str:
  return tool_calls.format_xml(tool_calls.ToolCall(name, arguments))


def _json(name, arguments) -> str:
  return tool_calls.format_json(tool_calls.ToolCall(name, arguments))


class EnvironmentTest(parameterized.TestCase):

  def test_the_schema_declares_types_and_sizes(self):
    typed = _Tools().tools[0]
    properties = typed["function"]["parameters"]["properties"]
    self.assertEqual(
        {k: v["type"] for k, v in properties.items()},
        {"s": "string", "n": "integer", "x": "number", "b": "boolean",
         "items": "array", "d": "object"},
    )  # fmt: skip
    self.assertEqual(properties["s"]["maxLength"], 5)
    self.assertEqual(properties["items"]["items"], {"type": "integer"})

  def test_text_arguments_convert_by_the_declared_type(self):
    env = _Tools()
    reply = env.step(
        _xml("typed", s="hi", n=" -3", x="2.5", b="True", items="[1, 2]",
             d='{"k": null}')
        + _xml("typed", items="null", d="null")
        + _json("typed", {"n": 4.0, "x": 1, "b": False, "items": [3]})
    )  # fmt: skip
    self.assertEqual(reply.tool_errors, 0, reply.messages)
    self.assertEqual(
        env.seen,
        [
            ("hi", -3, 2.5, True, [1, 2], {"k": None}),
            ("", 0, 0.0, False, None, None),
            ("", 4, 1.0, False, [3], None),
        ],
    )

  @parameterized.named_parameters(
      ("number_for_string", {"s": 3}, "'s': must be string"),
      ("list_for_string", {"s": ["a"]}, "'s': must be string"),
      ("too_long", {"s": "abcdef"}, "'s': longer than 5"),
      ("fraction_for_integer", {"n": 2.5}, "'n': must be integer"),
      ("bool_for_integer", {"n": True}, "'n': must be integer"),
      ("text_for_integer", {"n": "three"}, "'n': must be integer"),
      ("huge_integer_text", {"n": "9" * 5000}, "'n': must be integer"),
      ("infinite_number", {"x": "inf"}, "'x': must be number"),
      ("word_for_boolean", {"b": "yes"}, "'b': must be boolean"),
      ("wrong_items", {"items": '["a"]'}, "'items': must be integer"),
      ("deep_list", {"items": "[" * 100000}, "'items': must be array"),
      ("null_for_required_type", {"n": None}, "'n': must be integer"),
      ("unknown_argument", {"zzz": 1}, "unexpected keyword"),
  )
  def test_other_values_are_an_error_message(self, arguments, expected):
    env = _Tools()
    reply = env.step(_json("typed", arguments))
    self.assertEqual(reply.tool_errors, 1)
    (message,) = reply.messages
    self.assertStartsWith(message["content"], "Error: typed: ")
    self.assertIn(expected, message["content"])
    self.assertEqual(env.seen, [])

  def test_a_tool_that_raises_is_an_error_message(self):
    env = _Tools()
    with self.assertLogs(level="WARNING") as logs:
      reply = env.step(_json("crash", {"path": "a\0b"}) + _xml("crash"))
    self.assertFalse(reply.done)
    self.assertEqual(reply.tool_errors, 2)
    first, second = [m["content"] for m in reply.messages]
    self.assertIn("Error: crash failed: ValueError: embedded null byte", first)
    self.assertIn("missing a required argument: 'path'", second)
    self.assertIn("Traceback", "\n".join(logs.output))

  def test_tool_messages_are_valid_text(self):
    env = _Tools()
    reply = env.step(_json("nope\ud800", {}) + _json("typed", {"s": "\udcff"}))
    for message in reply.messages:
      message["content"].encode("utf-8")  # Would raise on a lone surrogate.
    self.assertEqual(reply.tool_errors, 1)


if __name__ == "__main__":
  absltest.main()
