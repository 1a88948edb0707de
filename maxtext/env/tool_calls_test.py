"""Tool calls read from text: both forms, and malformed blocks never raise."""

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
      ("unclosed", "<tool_call><function=a></function>", "without"),
      ("bad_json", "<tool_call>{name: 1}</tool_call>", "not JSON"),
      ("json_no_name", '<tool_call>{"arguments": {}}</tool_call>', "name"),
      (
          "json_args_list",
          '<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
          "object",
      ),
      ("neither", "<tool_call>view_file a.py</tool_call>", "neither"),
      (
          "no_function_close",
          "<tool_call><function=a><parameter=p>1</parameter></tool_call>",
          "function",
      ),
      (
          "twice",
          "<tool_call><function=a><parameter=p>1</parameter>"
          "<parameter=p>2</parameter></function></tool_call>",
          "twice",
      ),
      (
          "stray_text",
          "<tool_call><function=a>junk<parameter=p>1</parameter></function>"
          "</tool_call>",
          "outside",
      ),
  )
  def test_malformed(self, text, reason):
    parsed = tool_calls.parse(text)
    self.assertLen(parsed, 1)
    parsed = parsed[0]
    self.assertIsInstance(parsed, tool_calls.Malformed)
    self.assertIn(reason, parsed.reason)

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
