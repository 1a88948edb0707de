"""Chat templates: messages -> ids and the assistant's tokens, as transformers.

A Hugging Face checkpoint carries its chat format as a Jinja template
(`chat_template.jinja`, or `chat_template` in `tokenizer_config.json`) beside
its `tokenizer.json`. `ChatTokenizer.load(directory)` reads those files and
renders conversations the way transformers' `apply_chat_template` does: the
template runs in Jinja's immutable sandbox with `trim_blocks` and
`lstrip_blocks`, the loop-control extension, a `tojson` filter that does not
escape HTML, the globals `raise_exception`, `strftime_now`, `dict` and
`namespace`, and the tokenizer's special tokens (`bos_token`, `eos_token`,
...) as variables; the rendered text is then tokenized whole, without
special tokens added (the template writes them). `chat_test` checks the text,
the ids and the mask against transformers on tokenizers built in the test.

Which tokens are the assistant's (the only ones a fine-tuning loss counts):

* A template that marks them with `{% generation %}...{% endgeneration %}`
  says so itself: the characters inside those blocks are the assistant's,
  exactly as transformers' `return_assistant_tokens_mask` reads them.
* Most published templates have no such markers. Then each assistant
  message's characters are found by rendering prefixes: the conversation
  up to the message with the generation prompt (`add_generation_prompt`)
  and the conversation through the message. What the second adds to the
  first is what the model must write after the generation prompt: the
  message, the end-of-turn token, and whatever the template puts after it
  (a newline). Both renderings must be prefixes of the whole conversation's
  rendering; a template that rewrites earlier turns (one that drops the
  reasoning of past turns, say) fails this and the conversation is refused
  with a line saying so, never masked wrongly. Prefix rendering needs no
  cooperation from the template, which is why it is the default; the
  markers win where a template has them because they are its author's word.

A token is the assistant's when its characters overlap an assistant span
(a token that straddles a span's edge counts, as in transformers).

The stop ids of generation are the tokenizer's `eos_token` and the model's
`generation_config.json` `eos_token_id`s; `stop_ids[0]` is the end of turn.
"""

import contextvars
import dataclasses
import datetime
import hashlib
import json
import os
import re
from typing import Any, Optional, Sequence

import jinja2
from jinja2 import ext as jinja2_ext
from jinja2 import nodes as jinja2_nodes
from jinja2 import sandbox as jinja2_sandbox
import numpy as np
import tokenizers

# The roles a message may have.
ROLES = ("system", "user", "assistant", "tool")
ASSISTANT = "assistant"

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
GENERATION_CONFIG_FILE = "generation_config.json"

# The special-token variables a template sees (those the tokenizer sets).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")

# (rendered chunks so far, generation spans) while a render tracks spans.
_TRACKING: contextvars.ContextVar[Optional[tuple[list[str], list]]] = (
    contextvars.ContextVar("chat_generation_tracking", default=None)
)


class _GenerationBlocks(jinja2_ext.Extension):
  """`{% generation %}...{% endgeneration %}`: renders its body and, while a
  render tracks spans, records the body's character span in the output."""

  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2_nodes.CallBlock(
        self.call_method("_track"), [], [], body
    ).set_lineno(lineno)

  def _track(self, caller) -> str:
    text = caller()
    tracking = _TRACKING.get()
    if tracking is not None:
      chunks, spans = tracking
      # Jinja's generator has handed every chunk before this block to the
      # tracking render (it runs lazily), so their length is the offset.
      start = sum(len(c) for c in chunks)
      spans.append((start, start + len(text)))
    return text


def _raise_exception(message):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value, ensure_ascii=False, indent=None, separators=None, sort_keys=False
):
  # Jinja's own tojson escapes <, >, & and ' for HTML; a chat template wants
  # the JSON as it is.
  return json.dumps(
      value,
      ensure_ascii=ensure_ascii,
      indent=indent,
      separators=separators,
      sort_keys=sort_keys,
  )


def _strftime_now(format_string):
  return datetime.datetime.now().strftime(format_string)


class _DictFactory:
  """`dict(...)` and `dict.fromkeys(...)` for templates, and nothing else of
  the type (no attribute of `dict` itself reaches the sandbox)."""

  def __call__(self, *args, **kwargs):
    return dict(*args, **kwargs)

  def fromkeys(self, *args, **kwargs):
    return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
  """Jinja's `namespace` that refuses underscore-prefixed names, so a
  template cannot store or reach private attributes through it."""

  # Jinja's own signature, so that namespace(self=...) is a value too.
  # pylint: disable-next=no-self-argument
  def __init__(*args, **kwargs):
    values = dict(*args[1:], **kwargs)
    for name in values:
      _Namespace._check(name)
    jinja2.utils.Namespace.__init__(args[0], values)

  def __setitem__(self, name, value):
    _Namespace._check(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check(name):
    if isinstance(name, str) and name.startswith("_"):
      raise jinja2.exceptions.SecurityError(
          f"a chat template may not store {name!r} on a namespace "
          "(underscore-prefixed)"
      )


def compile_template(source: str) -> jinja2.Template:
  """A chat template compiled in the sandboxed environment described above.

  Raises:
    ValueError: the template is not valid Jinja (one line, with its line).
  """
  environment = jinja2_sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True,
      lstrip_blocks=True,
      extensions=[_GenerationBlocks, jinja2_ext.loopcontrols],
  )
  environment.filters["tojson"] = _tojson
  environment.globals["raise_exception"] = _raise_exception
  environment.globals["strftime_now"] = _strftime_now
  environment.globals["dict"] = _DictFactory()
  environment.globals["namespace"] = _Namespace
  try:
    return environment.from_string(source)
  except jinja2.exceptions.TemplateSyntaxError as e:
    raise ValueError(f"chat template: line {e.lineno}: {e.message}") from None


def check_messages(messages: Any) -> list[dict[str, Any]]:
  """Checks a conversation and returns it as the template sees it.

  A conversation is a non-empty list of messages, each a dict with a `role`
  in ROLES and a string `content` (an assistant message with `tool_calls`
  may have none); keys whose value is None are dropped, as transformers
  drops them. At least one message is the assistant's.

  Raises:
    ValueError: the first problem, one line naming the message's index.
  """
  if not isinstance(messages, list) or not messages:
    raise ValueError(
        '"messages" must be a non-empty list of messages, got '
        f"{_short(messages)}"
    )
  checked = []
  for i, message in enumerate(messages):
    if not isinstance(message, dict):
      raise ValueError(f"message {i} is not an object: {_short(message)}")
    message = {k: v for k, v in message.items() if v is not None}
    role = message.get("role")
    if role not in ROLES:
      raise ValueError(
          f"message {i}: role {_short(role)} is not one of "
          f"{', '.join(ROLES)}"
      )
    content = message.get("content")
    if not isinstance(content, str) and not (
        content is None and role == ASSISTANT and message.get("tool_calls")
    ):
      raise ValueError(
          f'message {i} ({role}): "content" must be a string, got '
          f"{_short(content)}"
      )
    checked.append(message)
  if not any(m["role"] == ASSISTANT for m in checked):
    raise ValueError("no assistant message: nothing to train on")
  return checked


def check_tools(tools: Any) -> Optional[list[dict[str, Any]]]:
  """Checks a conversation's tools: None, or a list of objects (each tool's
  JSON schema, as transformers' `apply_chat_template(tools=...)` takes).

  Raises:
    ValueError: one line naming the entry that is not an object.
  """
  if tools is None:
    return None
  if not isinstance(tools, list):
    raise ValueError(
        f'"tools" must be a list of tool schemas, got {_short(tools)}'
    )
  for i, tool in enumerate(tools):
    if not isinstance(tool, dict):
      raise ValueError(f"tool {i} is not an object: {_short(tool)}")
  return tools


def _short(value: Any, limit: int = 60) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class Encoded:
  """One rendered conversation.

  Attributes:
    text: the rendered text.
    ids: int32 [n], its token ids.
    assistant_mask: bool [n], True on the assistant's tokens.
  """

  text: str
  ids: np.ndarray
  assistant_mask: np.ndarray


def _token_mask(offsets: Sequence[tuple[int, int]], spans) -> np.ndarray:
  """True for each token whose [start, end) characters overlap a span."""
  mask = np.zeros(len(offsets), bool)
  for start, end in spans:
    if end <= start:
      continue
    for t, (token_start, token_end) in enumerate(offsets):
      if token_end > start and token_start < end:
        mask[t] = True
  return mask


def _read_json(path: str) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: cannot be read as JSON: {e}") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path}: not a JSON object")
  return value


def _token_text(value: Any) -> Optional[str]:
  """A special token as tokenizer_config.json writes it: a string or an
  AddedToken dict with its "content"."""
  if isinstance(value, str):
    return value
  if isinstance(value, dict) and isinstance(value.get("content"), str):
    return value["content"]
  return None


def _template_source(directory: str, tokenizer_config: dict[str, Any]) -> str:
  """chat_template.jinja, else tokenizer_config.json's chat_template (a
  string, or a list of named templates of which "default" is used)."""
  path = os.path.join(directory, TEMPLATE_FILE)
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      return f.read()
  template = tokenizer_config.get("chat_template")
  if isinstance(template, list):
    named = {
        t.get("name"): t.get("template")
        for t in template
        if isinstance(t, dict)
    }
    template = named.get("default")
  if not isinstance(template, str) or not template:
    raise ValueError(
        f"{directory}: no chat template (neither {TEMPLATE_FILE} nor a "
        f"chat_template in {CONFIG_FILE})"
    )
  return template


class ChatTokenizer:
  """A tokenizer and its chat template; `load` reads one from a directory."""

  def __init__(
      self,
      tokenizer: tokenizers.Tokenizer,
      template_source: str,
      special_tokens: dict[str, str],
      stop_ids: Sequence[int],
      fingerprint: str,
      directory: str = "",
  ):
    """Args:
    tokenizer: the `tokenizers` tokenizer.
    template_source: the Jinja chat template.
    special_tokens: template variable (e.g. "eos_token") -> token text.
    stop_ids: ids that end an assistant turn, the end of turn first.
    fingerprint: hex SHA-256 of everything that decides the ids.
    directory: where the files came from ("" when built in memory).
    """
    self.tokenizer = tokenizer
    self.template_source = template_source
    self.template = compile_template(template_source)
    self.special_tokens = dict(special_tokens)
    self.stop_ids = tuple(int(i) for i in stop_ids)
    self.fingerprint = fingerprint
    self.directory = directory
    self.has_generation_blocks = bool(_GENERATION_TAG.search(template_source))

  @classmethod
  def load(cls, directory: str) -> "ChatTokenizer":
    """Reads tokenizer.json, the chat template and the special tokens.

    Args:
      directory: a Hugging Face tokenizer directory (what `save_pretrained`
        writes, and what `tools/import_checkpoint` copies beside a
        checkpoint).

    Raises:
      ValueError: a missing or unreadable file, no chat template, a template
        that does not compile, an eos_token the tokenizer does not know.
    """
    tokenizer_path = os.path.join(directory, TOKENIZER_FILE)
    if not os.path.isfile(tokenizer_path):
      raise ValueError(f"{directory}: no {TOKENIZER_FILE}")
    try:
      tokenizer = tokenizers.Tokenizer.from_file(tokenizer_path)
    except Exception as e:  # The library raises bare Exceptions.
      raise ValueError(
          f"{tokenizer_path}: not a Hugging Face tokenizer: "
          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
      ) from None
    config_path = os.path.join(directory, CONFIG_FILE)
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    source = _template_source(directory, config)
    special = {}
    map_path = os.path.join(directory, SPECIAL_TOKENS_FILE)
    token_map = _read_json(map_path) if os.path.isfile(map_path) else {}
    for name in SPECIAL_TOKEN_NAMES:
      text = _token_text(config.get(name))
      if text is None:
        text = _token_text(token_map.get(name))
      if text is not None:
        special[name] = text
    stop_ids = []
    if "eos_token" in special:
      eos = tokenizer.token_to_id(special["eos_token"])
      if eos is None:
        raise ValueError(
            f"{config_path}: eos_token {special['eos_token']!r} is not in "
            f"{TOKENIZER_FILE}"
        )
      stop_ids.append(eos)
    generation_path = os.path.join(directory, GENERATION_CONFIG_FILE)
    if os.path.isfile(generation_path):
      eos_ids = _read_json(generation_path).get("eos_token_id")
      if isinstance(eos_ids, int):
        eos_ids = [eos_ids]
      for i in eos_ids if isinstance(eos_ids, list) else []:
        if isinstance(i, int) and i not in stop_ids:
          stop_ids.append(i)
    digest = hashlib.sha256()
    with open(tokenizer_path, "rb") as f:
      digest.update(hashlib.sha256(f.read()).digest())
    digest.update(hashlib.sha256(source.encode()).digest())
    digest.update(json.dumps(special, sort_keys=True).encode())
    return cls(
        tokenizer, source, special, stop_ids, digest.hexdigest(), directory
    )

  @property
  def vocab_size(self) -> int:
    """Ids the tokenizer can produce (added tokens included)."""
    return self.tokenizer.get_vocab_size(with_added_tokens=True)

  @property
  def end_of_turn_id(self) -> Optional[int]:
    """The id that ends an assistant turn (generation stops on it)."""
    return self.stop_ids[0] if self.stop_ids else None

  def _context(
      self, messages, add_generation_prompt: bool, tools=None
  ) -> dict[str, Any]:
    return dict(
        self.special_tokens,
        messages=messages,
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
    )

  def render(
      self,
      messages: Sequence[dict[str, Any]],
      add_generation_prompt=False,
      tools: Optional[Sequence[dict[str, Any]]] = None,
  ) -> str:
    """The template's text of `messages` (checked by `check_messages` first
    when they come from users), with the tools' JSON schemas (`tools`, as
    transformers passes them) where the template writes them.

    Raises:
      ValueError: the template raised (its message, one line).
    """
    try:
      return self.template.render(
          **self._context(list(messages), add_generation_prompt, tools)
      )
    except jinja2.exceptions.TemplateError as e:
      raise ValueError(f"the chat template refused it: {e}") from None

  def _render_tracked(
      self, messages, tools=None
  ) -> tuple[str, list[tuple[int, int]]]:
    """The text and the character spans of its {% generation %} blocks."""
    chunks: list[str] = []
    spans: list[tuple[int, int]] = []
    token = _TRACKING.set((chunks, spans))
    try:
      for chunk in self.template.generate(
          **self._context(messages, False, tools)
      ):
        chunks.append(chunk)
    except jinja2.exceptions.TemplateError as e:
      raise ValueError(f"the chat template refused it: {e}") from None
    finally:
      _TRACKING.reset(token)
    return "".join(chunks), spans

  def assistant_spans(
      self,
      messages: Sequence[dict[str, Any]],
      tools: Optional[Sequence[dict[str, Any]]] = None,
  ) -> tuple[str, list[tuple[int, int]]]:
    """(rendered text, character spans of the assistant's output), the
    conversation rendered with `tools` as `render` does.

    Raises:
      ValueError: the template raised, or renders a prefix of the
        conversation inconsistently (the module doc).
    """
    messages = list(messages)
    if self.has_generation_blocks:
      return self._render_tracked(messages, tools)
    text = self.render(messages, tools=tools)
    spans = []
    for i, message in enumerate(messages):
      if message["role"] != ASSISTANT:
        continue
      before = self.render(
          messages[:i], add_generation_prompt=True, tools=tools
      )
      through = self.render(messages[: i + 1], tools=tools)
      if not through.startswith(before) or not text.startswith(through):
        raise ValueError(
            f"message {i} (assistant): the chat template does not render "
            "the conversation up to it as a prefix of the whole, so its "
            "tokens cannot be found; add {% generation %} markers to the "
            "template"
        )
      spans.append((len(before), len(through)))
    return text, spans

  def encode(
      self,
      messages: Sequence[dict[str, Any]],
      tools: Optional[Sequence[dict[str, Any]]] = None,
  ) -> Encoded:
    """Token ids of the conversation and the assistant's tokens, rendered
    with `tools` (the tools' JSON schemas) as an episode's prompt is
    (`encode_prompt`).

    Raises:
      ValueError: as `check_messages` and `assistant_spans`, or no token is
        the assistant's.
    """
    messages = check_messages(messages)
    text, spans = self.assistant_spans(messages, check_tools(tools))
    encoding = self.tokenizer.encode(text, add_special_tokens=False)
    mask = _token_mask(encoding.offsets, spans)
    if not mask.any():
      raise ValueError(
          "the chat template writes no assistant token (an empty reply?)"
      )
    return Encoded(text, np.asarray(encoding.ids, np.int32), mask)

  def encode_prompt(
      self,
      messages: Sequence[dict[str, Any]],
      tools: Optional[Sequence[dict[str, Any]]] = None,
  ) -> list[int]:
    """Ids of `messages` followed by the generation prompt: what a model
    continues with the assistant's next turn."""
    text = self.render(list(messages), add_generation_prompt=True, tools=tools)
    return self.tokenizer.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    """Text of ids, special tokens left out."""
    return self.tokenizer.decode(
        [int(i) for i in ids], skip_special_tokens=True
    )
