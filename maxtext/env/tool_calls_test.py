"""Tool calls read from text: both forms, and malformed blocks never raise."""

import random

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.env import tool_calls

XML = """I will look.
<tool_call>
<function=edit_file>
<parameter=path>
pkg/core.py
</parameter>
<parameter=old>
  return a - b

</parameter>
</function>
</tool_call>"""


class ToolCallsTest(parameterized.TestCase):

  def test_qwen3_xml(self):
    calls = tool_calls.parse(XML)
    self.assertEqual(
        calls,
        [
            tool_calls.ToolCall(
                "edit_file", {"path": "pkg/core.py", "old": "  return a - b\n"}
            )
        ],
    )

  def test_xml_round_trip(self):
    call = tool_calls.ToolCall("view_file", {"path": "a.py", "n": "3"})
    self.assertEqual(tool_calls.parse(tool_calls.format_xml(call)), [call])

  def test_hermes_json_and_order(self):
    text = (
        '<tool_call>{"name": "run_tests", "arguments": {}}</tool_call> then '
        '<tool_call>\n{"name": "view_file", "arguments": "{\\"path\\": '
        '\\"x\\"}"}\n</tool_call>'
    )
    self.assertEqual(
        tool_calls.parse(text),
        [
            tool_calls.ToolCall("run_tests", {}),
            tool_calls.ToolCall("view_file", {"path": "x"}),
        ],
    )

  def test_no_calls(self):
    self.assertEqual(tool_calls.parse("The answer is 4."), [])

  @parameterized.named_parameters(
      ("bad_json", "<tool_call>{name: 1}</tool_call>", "not JSON"),
      ("deep_json", '<tool_call>{"a": ' + "[" * 100000, "not JSON"),
      (
          "huge_integer",
          '<tool_call>{"name": "a", "arguments": {"n": ' + "9" * 5000 + "}}",
          "not JSON",
      ),
      ("no_name", "<tool_call><function=>1</function></tool_call>", "NAME"),
      (
          "parameter_without_name",
          "<function=a><parameter=>1</parameter></function>",
          "name",
      ),
      ("json_no_name", '<tool_call>{"arguments": {}}</tool_call>', "name"),
      (
          "json_args_list",
          '<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
          "object",
      ),
      ("neither", "<tool_call>view_file a.py</tool_call>", "neither"),
      (
          "twice",
          "<tool_call><function=a><parameter=p>1</parameter>"
          "<parameter=p>2</parameter></function></tool_call>",
          "twice",
      ),
  )
  def test_malformed(self, text, reason):
    parsed = tool_calls.parse(text)
    self.assertLen(parsed, 1)
    parsed = parsed[0]
    self.assertIsInstance(parsed, tool_calls.Malformed)
    self.assertIn(reason, parsed.reason)

  @parameterized.named_parameters(
      ("no_wrapper",
       "Now: <function=a>\n<parameter=p>\n1\n</parameter>\n</function>"),
      ("unclosed_call",
       "<tool_call>\n<function=a>\n<parameter=p>\n1\n</parameter>"),
      ("no_function_close",
       "<tool_call><function=a><parameter=p>1</parameter></tool_call>"),
      ("no_parameter_close",
       "<tool_call><function=a><parameter=p>\n1\n</function>"),
      ("stray_text",
       "<tool_call><function=a>junk<parameter=p>1</parameter>more</function>"
       "</tool_call>"),
      ("text_before_function", "<tool_call>I call <function=a><parameter=p>1"),
      ("after_reasoning", "<think>maybe <function=b></function></think>"
       "<function=a><parameter=p>1</parameter></function>"),
  )  # fmt: skip
  def test_lenient_like_the_reference(self, text):
    self.assertEqual(
        tool_calls.parse(text), [tool_calls.ToolCall("a", {"p": "1"})]
    )

  def test_unclosed_blocks_end_where_the_next_begins(self):
    text = (
        "<tool_call><function=a><parameter=p>1<parameter=q>2"
        "<tool_call><function=b></function></tool_call><function=c>"
    )
    self.assertEqual(
        tool_calls.parse(text),
        [
            tool_calls.ToolCall("a", {"p": "1", "q": "2"}),
            tool_calls.ToolCall("b", {}),
            tool_calls.ToolCall("c", {}),
        ],
    )

  def test_reasoning_is_not_read(self):
    call = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    self.assertEqual(tool_calls.parse(f"<think>{call}</think>"), [])
    self.assertEqual(tool_calls.parse(f"{call}</think>done"), [])
    self.assertEqual(tool_calls.parse(f"ok <think>{call}"), [])
    self.assertLen(tool_calls.parse(f"x</think>{call}"), 1)

  @parameterized.named_parameters(
      ("unclosed_parameters", "<tool_call><function=a>", "<parameter=p"),
      ("open_parameters", "<tool_call><function=a>", "<parameter=p>x"),
      ("unclosed_calls", "", "<tool_call>"),
      ("bare_functions", "", "<function="),
      ("unclosed_reasoning_after", "", "<think><tool_call>"),
  )
  def test_linear_in_the_text(self, head, unit):
    # Unclosed tags repeated: each scanned character is counted, and the
    # count stays a small multiple of the text's length at every size.
    for count in (1000, 8000, 32000):
      text = head + unit * count
      _, scanned = tool_calls.scan(text)
      self.assertLessEqual(scanned, 8 * len(text), count)

  def test_random_text_never_raises(self):
    rng = random.Random(0)
    pieces = [
        "<tool_call>", "</tool_call>", "<function=", "</function>",
        "<parameter=", "</parameter>", "<think>", "</think>", ">", "<",
        "{", "}", "[", "]", '"', ":", ",", "name", "arguments", "\\u0000",
        "\\ud800", "\n", " ", "a", "1", "1e999", "null", "\x00", "\udcff",
    ]  # fmt: skip
    for _ in range(3000):
      text = "".join(rng.choice(pieces) for _ in range(rng.randrange(40)))
      if rng.random() < 0.3:
        text += bytes(rng.randrange(256) for _ in range(20)).decode(
            "utf-8", "surrogateescape"
        )
      for parsed in tool_calls.parse(text):
        self.assertIsInstance(
            parsed, (tool_calls.ToolCall, tool_calls.Malformed)
        )

  def test_malformed_beside_good_calls(self):
    text = (
        "<tool_call>{bad}</tool_call>"
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
    )
    parsed = tool_calls.parse(text)
    self.assertLen(parsed, 2)
    bad, good = parsed[0], parsed[1]
    self.assertIsInstance(bad, tool_calls.Malformed)
    self.assertEqual(good, tool_calls.ToolCall("submit", {}))


if __name__ == "__main__":
  absltest.main()
