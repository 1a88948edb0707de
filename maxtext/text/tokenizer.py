"""Tokenizers: sentencepiece `.model` and Hugging Face `tokenizer.json` files.

One small interface (`Tokenizer`: encode, decode, vocab_size, eod_id) over the
two libraries, the file's content hash, and offline training of a
sentencepiece BPE tokenizer for users who have text but no tokenizer.
"""

import hashlib
import io
import os
from typing import Iterable, Iterator, Optional

import sentencepiece
import tokenizers

# Tokens tried, in order, as the end-of-document id of a tokenizer.json that
# does not say which one it uses.
_HF_EOD_CANDIDATES = (
    "<|endoftext|>",
    "</s>",
    "<eos>",
    "<|end_of_text|>",
    "[SEP]",
)

SENTENCEPIECE = "sentencepiece"
HUGGINGFACE = "huggingface"


def file_sha256(path: str) -> str:
  """Hex SHA-256 of a file's bytes."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def kind_of(path: str) -> str:
  """ "sentencepiece" for `.model` files, "huggingface" for `.json` files.

  Raises:
    ValueError: any other suffix.
  """
  if path.endswith(".model"):
    return SENTENCEPIECE
  if path.endswith(".json"):
    return HUGGINGFACE
  raise ValueError(
      f"tokenizer={path!r}: expected a sentencepiece .model "
      "file or a Hugging Face tokenizer.json"
  )


class Tokenizer:
  """A loaded tokenizer; `load` makes one."""

  def __init__(self, path: str, kind: str, impl, eod_id: int, vocab_size: int):
    self.path = path
    self.kind = kind
    self._impl = impl
    self.eod_id = eod_id
    self.vocab_size = vocab_size

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without any special token added."""
    if self.kind == SENTENCEPIECE:
      return self._impl.encode(text)
    return self._impl.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    """`encode` of each text (the libraries run batches in native threads)."""
    if self.kind == SENTENCEPIECE:
      return self._impl.encode(texts)
    return [
        e.ids for e in self._impl.encode_batch(texts, add_special_tokens=False)
    ]

  def decode(self, ids: Iterable[int]) -> str:
    """Text of token ids; the end-of-document id decodes to nothing."""
    ids = [int(i) for i in ids]
    if self.kind == SENTENCEPIECE:
      return self._impl.decode(ids)
    return self._impl.decode(ids, skip_special_tokens=True)


def load(path: str, eod_token: Optional[str] = None) -> Tokenizer:
  """Loads a sentencepiece `.model` or a Hugging Face `tokenizer.json`.

  Args:
    path: the tokenizer file.
    eod_token: the end-of-document token; None = the sentencepiece model's
      eos piece, or the first of <|endoftext|>, </s>, <eos>, <|end_of_text|>,
      [SEP] that a tokenizer.json knows.

  Returns:
    The tokenizer.

  Raises:
    ValueError: a missing or unreadable file, or no end-of-document token.
  """
  kind = kind_of(path)
  if not os.path.isfile(path):
    raise ValueError(f"tokenizer={path!r}: does not exist")
  if kind == SENTENCEPIECE:
    impl = sentencepiece.SentencePieceProcessor()
    try:
      impl.Load(path)
    except (OSError, RuntimeError) as e:
      raise ValueError(
          f"tokenizer={path!r}: not a sentencepiece model: " f"{e}"
      ) from None
    vocab = impl.GetPieceSize()
    eod = impl.eos_id() if eod_token is None else impl.PieceToId(eod_token)
    if eod_token is not None and impl.IdToPiece(eod) != eod_token:
      eod = -1
  else:
    try:
      impl = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # The library raises bare Exceptions here.
      raise ValueError(
          f"tokenizer={path!r}: not a Hugging Face tokenizer."
          f"json: {str(e).splitlines()[0]}"
      ) from None
    vocab = impl.get_vocab_size(with_added_tokens=True)
    candidates = (eod_token,) if eod_token is not None else (_HF_EOD_CANDIDATES)
    eod = next(
        (
            impl.token_to_id(t)
            for t in candidates
            if impl.token_to_id(t) is not None
        ),
        -1,
    )
  if eod is None or eod < 0:
    raise ValueError(
        f"tokenizer={path!r}: has no end-of-document token"
        + (f" {eod_token!r}" if eod_token else "")
        + "; name one with "
        "--eod_token"
    )
  return Tokenizer(path, kind, impl, int(eod), int(vocab))


# The sentencepiece trainer's settings of every model `train_sentencepiece`
# trains: byte-fallback BPE that keeps text exactly, ids 0 <unk>, 1 <s>,
# 2 </s>, no padding id; a shuffled sample of the lines; errors only.
_TRAINER_SETTINGS = dict(
    model_type="bpe",
    byte_fallback=True,
    character_coverage=0.9995,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=False,
    allow_whitespace_only_pieces=True,
    split_digits=True,
    unk_id=0,
    bos_id=1,
    eos_id=2,
    pad_id=-1,
    shuffle_input_sentence=True,
    minloglevel=2,
)


def _training_lines(texts: Iterable[str]) -> Iterator[str]:
  """The lines of `texts` that hold more than whitespace, in order."""
  for text in texts:
    for line in text.splitlines():
      if line.strip():
        yield line


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    output_path: str,
    *,
    max_sentences: int = 2_000_000,
    num_threads: int = 0,
) -> None:
  """Trains a byte-fallback BPE sentencepiece model offline.

  The model keeps text exactly (identity normalisation, whitespace kept, no
  dummy prefix), so code and prose decode to what was encoded; bytes outside
  its pieces fall back to byte tokens, so nothing encodes to "unknown".
  Ids: 0 <unk>, 1 <s>, 2 </s> (the end of document), then 256 byte pieces.

  Args:
    texts: the documents; each line is a training sentence.
    vocab_size: pieces in the model (>= 260 for the byte fallback).
    output_path: where the `.model` file goes.
    max_sentences: at most this many lines are sampled for training.
    num_threads: trainer threads; 0 = os.cpu_count().

  Raises:
    ValueError: vocab_size too small, or the text too small for it.
  """
  if vocab_size < 260:
    raise ValueError(
        f"train_tokenizer_vocab_size={vocab_size}: must be >= "
        "260 (3 special ids + 256 byte pieces + 1)"
    )
  model = io.BytesIO()
  try:
    sentencepiece.SentencePieceTrainer.Train(
        sentence_iterator=_training_lines(texts),
        model_writer=model,
        vocab_size=vocab_size,
        input_sentence_size=max_sentences,
        num_threads=num_threads or os.cpu_count() or 1,
        **_TRAINER_SETTINGS,
    )
  except RuntimeError as e:
    raise ValueError(
        f"train_tokenizer_vocab_size={vocab_size}: sentencepiece "
        f"training failed: {str(e).strip()}"
    ) from None
  with open(output_path, "wb") as f:
    f.write(model.getvalue())
