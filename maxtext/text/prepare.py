"""Tokenizes text into ArrayRecord shards plus `metadata.json`.

The library behind `tools/prepare_data`. Documents (see `corpus`) are
tokenized, each followed by the tokenizer's end-of-document id, and split by
a stated rule: document i (counting non-empty documents from 0, in input
order) goes to the eval split when i % eval_every == 0, else to train. Each
split is one token stream cut into records of `record_tokens` ids (see
`metadata` for the layout), written to shards of about `shard_tokens` ids.
"""

import json
import os
import shutil
from typing import Any, Callable, Optional, Sequence

from array_record.python import array_record_module
import numpy as np

from maxtext.core import checks
from maxtext.core import progress as progress_lib
from maxtext.text import corpus
from maxtext.text import metadata as metadata_lib
from maxtext.text import tokenizer as tokenizer_lib

_ENCODE_BATCH = 64


class _SplitWriter:
  """One split's stream of ids, written as records into rolling shards."""

  def __init__(
      self,
      output_dir: str,
      split: str,
      dtype: np.dtype,
      record_tokens: int,
      shard_tokens: int,
  ):
    self._dir = output_dir
    self._split = split
    self._dtype = dtype
    self._record = record_tokens
    self._shard_records = max(1, shard_tokens // record_tokens)
    self._pending: list[np.ndarray] = []
    self._pending_count = 0
    self._writer = None
    self._in_shard = 0
    self.shards: list[str] = []
    self.documents = 0
    self.tokens = 0
    self.records = 0

  def add(self, ids: np.ndarray) -> None:
    """Appends one document's ids (its end-of-document id included)."""
    self.documents += 1
    self.tokens += ids.size
    self._pending.append(ids.astype(self._dtype))
    self._pending_count += ids.size
    if self._pending_count >= self._record:
      stream = np.concatenate(self._pending)
      full = stream.size // self._record * self._record
      for start in range(0, full, self._record):
        self._write(stream[start : start + self._record])
      self._pending = [stream[full:]]
      self._pending_count = stream.size - full

  def _write(self, record: np.ndarray) -> None:
    """Writes one record, starting a new shard when this one is full."""
    if self._writer is None or self._in_shard == self._shard_records:
      if self._writer is not None:
        self._writer.close()
      name = f"{self._split}-{len(self.shards):05d}.array_record"
      self.shards.append(name)
      # group_size:1 keeps every record separately readable (random access).
      self._writer = array_record_module.ArrayRecordWriter(
          os.path.join(self._dir, name), "group_size:1"
      )
      self._in_shard = 0
    self._writer.write(record.tobytes())
    self._in_shard += 1
    self.records += 1

  def close(self) -> dict[str, Any]:
    if self._pending_count:
      self._write(np.concatenate(self._pending))
    if self._writer is not None:
      self._writer.close()
    return {
        "shards": self.shards,
        "documents": self.documents,
        "tokens": self.tokens,
        "records": self.records,
    }


def _token_dtype(name: str, vocab_size: int) -> np.dtype:
  """The id dtype `name` names; refuses one the vocabulary overflows."""
  if name == "auto":
    name = (
        "uint16"
        if vocab_size <= metadata_lib.TOKEN_DTYPES["uint16"]
        else "uint32"
    )
  if name not in metadata_lib.TOKEN_DTYPES:
    raise ValueError(
        f"token_dtype={name!r}: must be 'auto', 'uint16' or " "'uint32'"
    )
  if vocab_size > metadata_lib.TOKEN_DTYPES[name]:
    raise ValueError(
        f"token_dtype={name!r}: the tokenizer's vocabulary of "
        f"{vocab_size} ids does not fit {name}; use uint32"
    )
  return np.dtype(name)


def prepare(
    inputs: Sequence[str],
    output_dir: str,
    *,
    tokenizer_path: str = "",
    train_vocab_size: int = 0,
    text_field: str = "text",
    eval_every: int = 20,
    token_dtype: str = "auto",
    record_tokens: int = 4096,
    shard_tokens: int = 64 * 2**20,
    eod_token: Optional[str] = None,
    report: Callable[[str], None] = print,
    progress: progress_lib.Reporter = progress_lib.SILENT,
) -> dict[str, Any]:
  """Prepares a text data directory; returns its metadata.

  Args:
    inputs: text files, JSONL files, directories.
    output_dir: created if missing; must not hold a metadata.json already.
    tokenizer_path: a sentencepiece `.model` or a tokenizer.json; copied into
      output_dir. Exactly one of this and train_vocab_size.
    train_vocab_size: train a sentencepiece BPE tokenizer of this many ids on
      the input first (written to output_dir/tokenizer.model).
    text_field: the text field of JSONL records.
    eval_every: document i goes to eval when i % eval_every == 0 (>= 2).
    token_dtype: "auto" (uint16 when the vocabulary fits), "uint16",
      "uint32".
    record_tokens: ids per ArrayRecord record.
    shard_tokens: ids per shard (rounded to whole records).
    eod_token: the end-of-document token (see `tokenizer.load`).
    report: called with each warning line and the closing line.
    progress: where the tokenization's progress goes (input bytes read of
      the total, files, documents, tokens, tokens/s, ETA).

  Returns:
    The metadata written to `<output_dir>/metadata.json`.

  Raises:
    ValueError: a one-line message for every bad input (missing file, empty
      corpus, JSONL line without the field, vocabulary too large for the
      dtype, output directory already prepared, bad arguments).
  """
  if bool(tokenizer_path) == bool(train_vocab_size):
    raise ValueError(
        "give exactly one of --tokenizer and --train_tokenizer_vocab_size"
    )
  eval_every = checks.check_int("eval_every", eval_every, 2)
  record_tokens = checks.check_int("record_tokens", record_tokens, 1)
  shard_tokens = checks.check_int("shard_tokens", shard_tokens, 1)
  if not output_dir:
    raise ValueError("output_dir: required")
  if os.path.exists(metadata_lib.metadata_path(output_dir)):
    raise ValueError(
        f"output_dir={output_dir!r}: already holds a prepared "
        "data set; choose a new directory"
    )
  skipped = []
  files = corpus.list_files(inputs, skipped)
  if skipped:
    report(
        f"skipped {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} "
        f"that are not readable regular files: {', '.join(skipped)}"
    )
  if not files:
    raise ValueError(
        f"input={list(inputs)!r}: holds no readable regular file"
        + (f" (skipped: {', '.join(skipped)})" if skipped else "")
    )
  os.makedirs(output_dir, exist_ok=True)
  if train_vocab_size:
    checks.check_int("train_tokenizer_vocab_size", train_vocab_size, 1)
    source = os.path.join(output_dir, "tokenizer.model")
    stats = corpus.CorpusStats()
    report(
        f"Training a {train_vocab_size}-piece sentencepiece BPE tokenizer "
        f"on {len(files)} file(s)"
    )
    try:
      tokenizer_lib.train_sentencepiece(
          corpus.read_documents(files, stats, text_field),
          train_vocab_size,
          source,
      )
    except ValueError:
      _check_documents(inputs, stats)  # The real reason, if it is this.
      raise
    tokenizer_file = source
  else:
    source = tokenizer_path
    tokenizer_file = os.path.join(
        output_dir,
        "tokenizer."
        + (
            "model"
            if tokenizer_lib.kind_of(source) == "sentencepiece"
            else "json"
        ),
    )
  tok = tokenizer_lib.load(source, eod_token)
  dtype = _token_dtype(token_dtype, tok.vocab_size)
  if os.path.abspath(source) != os.path.abspath(tokenizer_file):
    shutil.copyfile(source, tokenizer_file)

  stats = corpus.CorpusStats()
  writers = {
      split: _SplitWriter(output_dir, split, dtype, record_tokens, shard_tokens)
      for split in metadata_lib.SPLITS
  }
  job = progress.start(
      "prepare_data",
      sum(os.path.getsize(f) for f in files),
      progress_lib.BYTES,
  )
  eod = np.asarray([tok.eod_id], np.int64)
  tokens = 0
  docs = corpus.read_documents(files, stats, text_field)
  index = 0
  while True:
    batch = [d for _, d in zip(range(_ENCODE_BATCH), docs)]
    if not batch:
      break
    for ids in tok.encode_batch(batch):
      ids = np.concatenate([np.asarray(ids, np.int64), eod])
      if ids.max() >= tok.vocab_size:
        raise ValueError(
            f"tokenizer={source!r}: produced id {ids.max()} "
            f">= its vocab_size {tok.vocab_size}"
        )
      split = "eval" if index % eval_every == 0 else "train"
      writers[split].add(ids)
      tokens += ids.size
      index += 1
    job.update(stats.bytes, _counts(job, stats, len(files), tokens))
  job.finish(_counts(job, stats, len(files), tokens))
  _check_documents(inputs, stats)
  if stats.invalid_utf8_bytes:
    report(
        f"WARNING: {stats.invalid_utf8_bytes} byte(s) of invalid UTF-8 in "
        f"{stats.files_with_invalid_utf8} file(s) were replaced by U+FFFD"
    )
  splits = {split: w.close() for split, w in writers.items()}
  meta = {
      "format": metadata_lib.FORMAT,
      "tokenizer": {
          "file": os.path.basename(tokenizer_file),
          "kind": tok.kind,
          "sha256": tokenizer_lib.file_sha256(tokenizer_file),
          "source": os.path.abspath(source),
          "trained": bool(train_vocab_size),
      },
      "vocab_size": tok.vocab_size,
      "eod_id": tok.eod_id,
      "token_dtype": dtype.name,
      "record_tokens": record_tokens,
      "eval_rule": f"document i (non-empty documents counted from 0 in input "
      f"order) is in eval when i % {eval_every} == 0",
      "splits": splits,
      "input": {
          "paths": [os.path.abspath(p) for p in inputs],
          "files": stats.files,
          "documents": stats.documents,
          "empty_documents": stats.empty_documents,
          "bytes": stats.bytes,
          "invalid_utf8_bytes": stats.invalid_utf8_bytes,
          "text_field": text_field,
      },
  }
  metadata_lib.check(meta, metadata_lib.metadata_path(output_dir))
  _write_json(metadata_lib.metadata_path(output_dir), meta)
  report(
      f"Wrote {splits['train']['tokens']} train and "
      f"{splits['eval']['tokens']} eval tokens ({stats.documents} "
      f"documents) to {output_dir}"
  )
  return meta


def _counts(
    job: progress_lib.Progress,
    stats: corpus.CorpusStats,
    total_files: int,
    tokens: int,
) -> str:
  """The progress line's detail: files, documents, tokens and tokens/s."""
  rate = tokens / max(job.elapsed_s(), 1e-9)
  return (
      f"files {stats.files}/{total_files}, documents {stats.documents:,}, "
      f"tokens {tokens:,} ({rate:,.0f} tokens/s)"
  )


def _check_documents(inputs: Sequence[str], stats: corpus.CorpusStats) -> None:
  if not stats.documents:
    raise ValueError(
        f"input={list(inputs)!r}: the corpus is empty (no "
        f"non-empty document in {stats.files} file(s))"
    )
  if stats.documents < 2:
    raise ValueError(
        f"input={list(inputs)!r}: one document cannot make "
        "both a train and an eval split; give at least two"
    )


def _write_json(path: str, value: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)  # Written last and whole: its presence means done.
