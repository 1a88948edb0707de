"""The byte-level ChatML tokenizer, read by transformers and chat.py alike."""

from absl.testing import absltest

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

from maxtext.text import byte_chat
from maxtext.text import chat

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "view_file",
            "description": "Shows a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
            },
        },
    }
]
_MESSAGES = [
    {"role": "system", "content": "Fix the bug."},
    {"role": "user", "content": "Tests fail: größe ✓"},
    {"role": "assistant", "content": "<tool_call>\n<function=view_file>"},
    {"role": "tool", "content": "def f():\n  return 1"},
]


class ByteChatTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.directory = byte_chat.write(self.create_tempdir().full_path)
    self.ours = chat.ChatTokenizer.load(self.directory)
    self.reference = transformers.AutoTokenizer.from_pretrained(self.directory)

  def test_every_byte_is_one_token_and_decodes_back(self):
    text = "größe ✓ <|im_end|>\n\t"
    ids = self.ours.tokenizer.encode(text, add_special_tokens=False).ids
    self.assertEqual(len(ids), len(text.encode()) - len("<|im_end|>") + 1)
    self.assertEqual(
        self.ours.tokenizer.decode(ids, skip_special_tokens=False), text
    )
    self.assertEqual(self.ours.vocab_size, byte_chat.VOCAB_SIZE)
    self.assertEqual(
        self.ours.end_of_turn_id,
        self.ours.tokenizer.token_to_id(byte_chat.END_OF_TURN),
    )

  def test_renders_as_transformers(self):
    for tools in (None, _TOOLS):
      for messages in (_MESSAGES, _MESSAGES[1:]):
        want = self.reference.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        self.assertEqual(
            self.ours.render(messages, add_generation_prompt=True, tools=tools),
            want,
        )
        self.assertEqual(
            self.ours.encode_prompt(messages, tools=tools),
            self.reference.encode(want, add_special_tokens=False),
        )
    self.assertIn("view_file(path)", self.ours.render(_MESSAGES, tools=_TOOLS))

  def test_same_bytes_every_time(self):
    other = byte_chat.write(self.create_tempdir().full_path)
    self.assertEqual(
        chat.ChatTokenizer.load(other).fingerprint, self.ours.fingerprint
    )


if __name__ == "__main__":
  absltest.main()
