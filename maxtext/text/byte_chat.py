"""A byte-level tokenizer with a ChatML template, for tiny models.

Text tasks need a tokenizer and a chat template; a pretrained checkpoint
brings its own (the files `tools/import_checkpoint` copies). A model trained
from scratch here (the tiny configs) has none, so `write(directory)` writes
one in the Hugging Face layout that `chat.ChatTokenizer.load` (and
transformers) read:

* `tokenizer.json`: every byte is one token (ids 0-255, GPT-2's byte-level
  alphabet, no merges), then the special tokens `<|endoftext|>`,
  `<|im_start|>` and `<|im_end|>` (ids 256-258): a vocabulary of 259 that
  any model with `vocab_size >= 259` covers;
* `tokenizer_config.json`: `eos_token` `<|im_end|>` (the end of turn, where
  generation stops) and the chat template: Qwen's ChatML layout, with the
  tools (their names and parameters, one line each) in the system message
  and tool results as `<tool_response>` blocks in a user turn, as Qwen's
  templates write them.

The files are a function of nothing: every call writes the same bytes.
"""

import json
import os

import tokenizers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
END_OF_TURN = "<|im_end|>"
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n"
    "{% endif %}"
    "Tools:\n"
    "{% for tool in tools %}{{ tool.function.name }}("
    "{{ tool.function.parameters.properties | list | join(', ') }})\n"
    "{% endfor %}"
    "Call: <tool_call>\n<function=NAME>\n<parameter=NAME>\nVALUE\n"
    "</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n"
    "{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer() -> tokenizers.Tokenizer:
  """The byte-level tokenizer (module docstring)."""
  alphabet = sorted(
      tokenizers.pre_tokenizers.ByteLevel.alphabet(),
      key=_byte_of,
  )
  vocab = {c: i for i, c in enumerate(alphabet)}
  model = tokenizers.models.BPE(vocab=vocab, merges=[])
  out = tokenizers.Tokenizer(model)
  out.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False, use_regex=False
  )
  out.decoder = tokenizers.decoders.ByteLevel()
  out.add_special_tokens(list(SPECIAL_TOKENS))
  return out


def _byte_of(char: str) -> int:
  """The byte GPT-2's byte-level alphabet maps to `char`."""
  code = ord(char)
  printable = (
      list(range(ord("!"), ord("~") + 1))
      + list(range(ord("¡"), ord("¬") + 1))
      + list(range(ord("®"), ord("ÿ") + 1))
  )
  if code in printable:
    return code
  others = [b for b in range(256) if b not in printable]
  return others[code - 256]


def write(directory: str) -> str:
  """Writes tokenizer.json and tokenizer_config.json; returns `directory`."""
  os.makedirs(directory, exist_ok=True)
  tokenizer().save(os.path.join(directory, "tokenizer.json"))
  config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "eos_token": END_OF_TURN,
      "pad_token": "<|endoftext|>",
      "chat_template": TEMPLATE,
  }
  with open(
      os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8"
  ) as f:
    json.dump(config, f, indent=1, sort_keys=True)
  return directory
