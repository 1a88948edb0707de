"""chat.py renders, tokenizes and masks as transformers' apply_chat_template.

The tokenizer is a byte-level BPE trained here with `tokenizers` (its merges
run across the template's newlines and words, so token and message edges do
not line up), saved by transformers' `save_pretrained` with a chat template
written here; `chat.ChatTokenizer.load` reads what transformers wrote.
"""

import json
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tokenizers

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

from maxtext.text import chat

_BOS, _TURN, _END, _EOS = "<s>", "<|turn|>", "<|end|>", "</s>"

# A ChatML-like format: a default system line when the conversation has
# none, the role after the turn token, the reply ended by <|end|>.
_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] != 'system' %}"
    "<|turn|>system\nYou are terse.<|end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('role ' + message['role']) }}"
    "{% endif %}"
    "<|turn|>{{ message['role'] }}\n{{ message['content'] | trim }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|turn|>assistant\n{% endif %}"
)

# The same text, with the assistant's output (what follows the generation
# prompt) in {% generation %} blocks: transformers' own assistant mask.
_MARKED_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] != 'system' %}"
    "<|turn|>system\nYou are terse.<|end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "<|turn|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] | trim }}<|end|>\n"
    "{% endgeneration %}"
    "{% else %}{{ message['content'] | trim }}<|end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|turn|>assistant\n{% endif %}"
)

# Exercises what transformers gives templates: namespace, tojson (no HTML
# escaping), loop controls, dict, the eos_token variable; whitespace control
# under trim_blocks and lstrip_blocks.
_FEATURES_TEMPLATE = """{%- set ns = namespace(turns=0) -%}
{%- set meta = dict(kind="chat") -%}
{% for message in messages %}
  {% if message.role == 'system' %}
    {% continue %}
  {% endif %}
  {% set ns.turns = ns.turns + 1 %}
[{{ ns.turns }}] {{ message.role }} {{ message.content | tojson }} {{ meta | tojson }}
  {% if message.role == 'assistant' %}{{ eos_token }}
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}[{{ ns.turns + 1 }}] assistant {% endif %}"""

# Drops the content of every assistant turn but the last (as templates that
# strip earlier reasoning do): a prefix is not rendered as in the whole.
_REWRITING_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and not loop.last %}"
    "<|turn|>assistant\n<|end|>\n"
    "{% else %}"
    "<|turn|>{{ message['role'] }}\n{{ message['content'] }}<|end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|turn|>assistant\n{% endif %}"
)

_CONVERSATIONS = {
    "one_turn": [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5."},
    ],
    "system_and_two_turns": [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "Add 10 and 32."},
        {"role": "assistant", "content": "10 + 32 = 42."},
        {"role": "user", "content": "And 7 more? "},
        {"role": "assistant", "content": " 42 + 7 = 49.\n"},
    ],
    "tool_and_unicode": [
        {"role": "user", "content": "Weather in 東京? <b>&</b>"},
        {"role": "assistant", "content": "Let me look ✓"},
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "It is 21 °C."},
    ],
}


def _train_tokenizer() -> tokenizers.Tokenizer:
  """A byte-level BPE whose merges cross the template's words and lines."""
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False
  )
  tokenizer.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=400,
      special_tokens=[_BOS, _EOS, _TURN, _END],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  text = [
      f"system\nuser\nassistant\ntool\nWhat is {i} + {i + 3}? "
      f"{i} + {i + 3} = {2 * i + 3}.\nAdd numbers. You are terse.\n"
      for i in range(200)
  ]
  tokenizer.train_from_iterator(text, trainer=trainer)
  return tokenizer


def _save(
    tokenizer, template, directory, **extra
) -> transformers.PreTrainedTokenizerFast:
  """Saves the tokenizer with `template` as transformers does; returns the
  transformers tokenizer read back from that directory."""
  path = os.path.join(directory, "source_tokenizer.json")
  tokenizer.save(path)
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_file=path, bos_token=_BOS, eos_token=_END, **extra
  )
  fast.chat_template = template
  fast.save_pretrained(directory)
  os.remove(path)
  return transformers.AutoTokenizer.from_pretrained(directory)


class ChatTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tokenizer = _train_tokenizer()

  def _pair(self, template, **extra):
    directory = self.create_tempdir().full_path
    reference = _save(self.tokenizer, template, directory, **extra)
    return chat.ChatTokenizer.load(directory), reference

  def test_saved_files_hold_the_template(self):
    ours, _ = self._pair(_TEMPLATE)
    self.assertEqual(ours.template_source, _TEMPLATE)
    self.assertFalse(ours.has_generation_blocks)
    self.assertEqual(ours.special_tokens["bos_token"], _BOS)
    self.assertEqual(ours.end_of_turn_id, self.tokenizer.token_to_id(_END))

  @parameterized.named_parameters(
      (f"{name}_{kind}", name, template)
      for name in _CONVERSATIONS
      for kind, template in (
          ("plain", _TEMPLATE),
          ("marked", _MARKED_TEMPLATE),
          ("features", _FEATURES_TEMPLATE),
      )
  )
  def test_text_and_ids_are_transformers(self, name, template):
    ours, reference = self._pair(template)
    messages = _CONVERSATIONS[name]
    for prompt in (False, True):
      expected = reference.apply_chat_template(
          messages, tokenize=False, add_generation_prompt=prompt
      )
      self.assertEqual(ours.render(messages, prompt), expected)
    encoded = ours.encode(messages)
    expected_ids = reference.apply_chat_template(messages, tokenize=True)[
        "input_ids"
    ]
    np.testing.assert_array_equal(encoded.ids, expected_ids)
    self.assertEqual(
        ours.encode_prompt(messages[:-1]),
        reference.apply_chat_template(
            messages[:-1], tokenize=True, add_generation_prompt=True
        )["input_ids"],
    )

  @parameterized.named_parameters((name, name) for name in _CONVERSATIONS)
  def test_mask_is_transformers_generation_mask(self, name):
    messages = _CONVERSATIONS[name]
    marked, reference = self._pair(_MARKED_TEMPLATE)
    plain, _ = self._pair(_TEMPLATE)
    self.assertTrue(marked.has_generation_blocks)
    expected = reference.apply_chat_template(
        messages,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    # Marked: the template's own blocks, as transformers reads them.
    got = marked.encode(messages)
    np.testing.assert_array_equal(got.ids, expected["input_ids"])
    np.testing.assert_array_equal(
        got.assistant_mask, expected["assistant_masks"]
    )
    # Unmarked: prefix rendering finds the same tokens.
    got = plain.encode(messages)
    np.testing.assert_array_equal(got.ids, expected["input_ids"])
    np.testing.assert_array_equal(
        got.assistant_mask, expected["assistant_masks"]
    )

  def test_mask_covers_exactly_the_replies(self):
    ours, _ = self._pair(_TEMPLATE)
    messages = _CONVERSATIONS["system_and_two_turns"]
    encoded = ours.encode(messages)
    masked = ours.tokenizer.decode(
        encoded.ids[encoded.assistant_mask].tolist(), skip_special_tokens=False
    )
    self.assertEqual(masked, "10 + 32 = 42.<|end|>\n42 + 7 = 49.<|end|>\n")
    # Every token of the prompt side is unmasked: ends at the prompt's last.
    prompt = ours.encode_prompt(messages[:2])
    self.assertFalse(encoded.assistant_mask[: len(prompt)].any())
    self.assertTrue(encoded.assistant_mask[len(prompt)])

  def test_template_in_tokenizer_config(self):
    # Older checkpoints keep the template inside tokenizer_config.json.
    ours, _ = self._pair(_TEMPLATE)
    directory = self.create_tempdir().full_path
    self.tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(
        os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8"
    ) as f:
      json.dump(
          {
              "bos_token": {"content": _BOS, "special": True},
              "eos_token": _END,
              "chat_template": [
                  {
                      "name": "tool_use",
                      "template": "{{ raise_exception('no') }}",
                  },
                  {"name": "default", "template": _TEMPLATE},
              ],
          },
          f,
      )
    with open(
        os.path.join(directory, "generation_config.json"), "w", encoding="utf-8"
    ) as f:
      json.dump({"eos_token_id": [self.tokenizer.token_to_id(_EOS)]}, f)
    loaded = chat.ChatTokenizer.load(directory)
    messages = _CONVERSATIONS["one_turn"]
    np.testing.assert_array_equal(
        loaded.encode(messages).ids, ours.encode(messages).ids
    )
    self.assertEqual(
        loaded.stop_ids,
        (self.tokenizer.token_to_id(_END), self.tokenizer.token_to_id(_EOS)),
    )
    # The fingerprint follows the template (and the tokenizer's bytes).
    self.assertEqual(
        chat.ChatTokenizer.load(directory).fingerprint, loaded.fingerprint
    )
    with open(
        os.path.join(directory, "chat_template.jinja"), "w", encoding="utf-8"
    ) as f:
      f.write(_TEMPLATE + " ")
    self.assertNotEqual(
        chat.ChatTokenizer.load(directory).fingerprint, loaded.fingerprint
    )

  @parameterized.named_parameters(
      ("not_a_list", {"role": "user"}, "non-empty list"),
      ("empty", [], "non-empty list"),
      ("not_an_object", ["hi"], "message 0 is not an object"),
      (
          "unknown_role",
          [{"role": "narrator", "content": "x"}],
          "message 0: role 'narrator' is not one of",
      ),
      (
          "content_not_string",
          [{"role": "user", "content": ["x"]}],
          'message 0 \\(user\\): "content" must be a string',
      ),
      (
          "no_assistant",
          [{"role": "user", "content": "x"}],
          "no assistant message",
      ),
  )
  def test_bad_conversations(self, messages, pattern):
    ours, _ = self._pair(_TEMPLATE)
    with self.assertRaisesRegex(ValueError, pattern):
      ours.encode(messages)

  def test_template_errors_are_one_line(self):
    ours, _ = self._pair(_TEMPLATE)
    # raise_exception reaches the caller as a ValueError with its message:
    # the template refuses a role that check_messages lets through here.
    with self.assertRaisesRegex(ValueError, "refused it: role narrator"):
      ours.render([{"role": "narrator", "content": "x"}])
    with self.assertRaisesRegex(ValueError, "chat template: line 1: "):
      chat.compile_template("{% if %}")

  def test_sandbox_refuses_private_attributes(self):
    template = chat.compile_template("{{ messages.__class__.__mro__ }}")
    with self.assertRaises(Exception):
      template.render(messages=[])
    ns = chat.compile_template("{% set ns = namespace(_x=1) %}{{ ns }}")
    with self.assertRaisesRegex(Exception, "underscore"):
      ns.render()

  def test_prefix_inconsistent_template_is_refused(self):
    ours, _ = self._pair(_REWRITING_TEMPLATE)
    with self.assertRaisesRegex(
        ValueError, "message 2 \\(assistant\\).*generation %\\} markers"
    ):
      ours.encode(_CONVERSATIONS["system_and_two_turns"])

  def test_empty_reply_is_refused(self):
    ours, _ = self._pair(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    with self.assertRaisesRegex(ValueError, "no assistant token"):
      ours.encode(
          [
              {"role": "user", "content": "x"},
              {"role": "assistant", "content": ""},
          ]
      )

  def test_missing_files(self):
    directory = self.create_tempdir().full_path
    with self.assertRaisesRegex(ValueError, "no tokenizer.json"):
      chat.ChatTokenizer.load(directory)
    self.tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with self.assertRaisesRegex(ValueError, "no chat template"):
      chat.ChatTokenizer.load(directory)


if __name__ == "__main__":
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  tempfile.tempdir = os.environ.get("TEST_TMPDIR", tempfile.gettempdir())
  absltest.main()
