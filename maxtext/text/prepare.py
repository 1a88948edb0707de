"""Tokenizes text into ArrayRecord shards plus `metadata.json`.

The library behind `tools/prepare_data`. Documents (see `corpus`) are
tokenized, each followed by the tokenizer's end-of-document id, and split by
a stated rule: document i (counting non-empty documents from 0, in input
order) goes to the eval split when i % eval_every == 0, else to train. Each
split is one token stream cut into records of `record_tokens` ids (see
`metadata` for the layout), written to shards of about `shard_tokens` ids.
"""

import dataclasses
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
  opts = _checked(
      _Options(
          output_dir=output_dir,
          tokenizer_path=tokenizer_path,
          train_vocab_size=train_vocab_size,
          text_field=text_field,
          eval_every=eval_every,
          token_dtype=token_dtype,
          record_tokens=record_tokens,
          shard_tokens=shard_tokens,
          eod_token=eod_token,
      )
  )
  files = _input_files(inputs, report)
  os.makedirs(output_dir, exist_ok=True)
  tok, dtype, source, tokenizer_file = _tokenizer(opts, inputs, files, report)
  splits, stats = _tokenize_splits(
      opts, inputs, files, tok, source, dtype, report, progress
  )
  meta = _metadata(opts, tok, source, tokenizer_file, dtype, splits)
  meta["input"] = _input_metadata(inputs, stats, text_field)
  metadata_lib.check(meta, metadata_lib.metadata_path(output_dir))
  _write_json(metadata_lib.metadata_path(output_dir), meta)
  report(
      f"Wrote {splits['train']['tokens']} train and "
      f"{splits['eval']['tokens']} eval tokens ({stats.documents} "
      f"documents) to {output_dir}"
  )
  return meta


@dataclasses.dataclass(frozen=True)
class _Options:
  """`prepare`'s settings (its docstring says what each is)."""

  output_dir: str
  tokenizer_path: str
  train_vocab_size: int
  text_field: str
  eval_every: int
  token_dtype: str
  record_tokens: int
  shard_tokens: int
  eod_token: Optional[str]


def _checked(opts: _Options) -> _Options:
  """`opts`, checked before any work.

  Raises:
    ValueError: naming the bad argument, or an output directory that
      already holds a prepared data set.
  """
  if bool(opts.tokenizer_path) == bool(opts.train_vocab_size):
    raise ValueError(
        "give exactly one of --tokenizer and --train_tokenizer_vocab_size"
    )
  eval_every = checks.check_int("eval_every", opts.eval_every, 2)
  record_tokens = checks.check_int("record_tokens", opts.record_tokens, 1)
  shard_tokens = checks.check_int("shard_tokens", opts.shard_tokens, 1)
  if not opts.output_dir:
    raise ValueError("output_dir: required")
  if os.path.exists(metadata_lib.metadata_path(opts.output_dir)):
    raise ValueError(
        f"output_dir={opts.output_dir!r}: already holds a prepared "
        "data set; choose a new directory"
    )
  return dataclasses.replace(
      opts,
      eval_every=eval_every,
      record_tokens=record_tokens,
      shard_tokens=shard_tokens,
  )


def _metadata(
    opts: _Options,
    tok: tokenizer_lib.Tokenizer,
    source: str,
    tokenizer_file: str,
    dtype: np.dtype,
    splits: dict[str, Any],
) -> dict[str, Any]:
  """The data directory's metadata.json contents but for "input"."""
  return {
      "format": metadata_lib.FORMAT,
      "tokenizer": {
          "file": os.path.basename(tokenizer_file),
          "kind": tok.kind,
          "sha256": tokenizer_lib.file_sha256(tokenizer_file),
          "source": os.path.abspath(source),
          "trained": bool(opts.train_vocab_size),
      },
      "vocab_size": tok.vocab_size,
      "eod_id": tok.eod_id,
      "token_dtype": dtype.name,
      "record_tokens": opts.record_tokens,
      "eval_rule": f"document i (non-empty documents counted from 0 in input "
      f"order) is in eval when i % {opts.eval_every} == 0",
      "splits": splits,
  }


def _input_files(
    inputs: Sequence[str], report: Callable[[str], None]
) -> list[str]:
  """The readable regular files of `inputs`; reports the entries skipped.

  Raises:
    ValueError: when no readable regular file is left.
  """
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
  return files


def _tokenizer(
    opts: _Options,
    inputs: Sequence[str],
    files: Sequence[str],
    report: Callable[[str], None],
) -> tuple[tokenizer_lib.Tokenizer, np.dtype, str, str]:
  """The tokenizer, loaded, its ids' dtype, and its copy in the output.

  Returns:
    (tokenizer, token dtype, the path it was loaded from, its path inside
    the output directory, where it is copied when it is not there yet).
  """
  source, tokenizer_file = _tokenizer_source(
      inputs,
      files,
      opts.output_dir,
      opts.tokenizer_path,
      opts.train_vocab_size,
      opts.text_field,
      report,
  )
  tok = tokenizer_lib.load(source, opts.eod_token)
  dtype = _token_dtype(opts.token_dtype, tok.vocab_size)
  if os.path.abspath(source) != os.path.abspath(tokenizer_file):
    shutil.copyfile(source, tokenizer_file)
  return tok, dtype, source, tokenizer_file


def _tokenize_splits(
    opts: _Options,
    inputs: Sequence[str],
    files: Sequence[str],
    tok: tokenizer_lib.Tokenizer,
    source: str,
    dtype: np.dtype,
    report: Callable[[str], None],
    progress: progress_lib.Reporter,
) -> tuple[dict[str, Any], corpus.CorpusStats]:
  """Writes the train and eval splits of the input's documents.

  Returns:
    ({split: its metadata}, what was read).

  Raises:
    ValueError: for a corpus without documents (`_check_documents`) or a
      tokenizer that produces an id outside its vocabulary.
  """
  stats = corpus.CorpusStats()
  writers = {
      split: _SplitWriter(
          opts.output_dir, split, dtype, opts.record_tokens, opts.shard_tokens
      )
      for split in metadata_lib.SPLITS
  }
  _write_documents(
      files,
      tok,
      source,
      writers,
      opts.eval_every,
      opts.text_field,
      stats,
      progress,
  )
  _check_documents(inputs, stats)
  if stats.invalid_utf8_bytes:
    report(
        f"WARNING: {stats.invalid_utf8_bytes} byte(s) of invalid UTF-8 in "
        f"{stats.files_with_invalid_utf8} file(s) were replaced by U+FFFD"
    )
  splits = {split: w.close() for split, w in writers.items()}
  return splits, stats


def _tokenizer_source(
    inputs: Sequence[str],
    files: Sequence[str],
    output_dir: str,
    tokenizer_path: str,
    train_vocab_size: int,
    text_field: str,
    report: Callable[[str], None],
) -> tuple[str, str]:
  """The tokenizer to load and the file the data directory keeps it in.

  With `train_vocab_size`, trains a sentencepiece BPE tokenizer on the
  input's documents straight into `output_dir`; otherwise the given
  tokenizer, kept as tokenizer.model or tokenizer.json by its kind.

  Returns:
    (the path to load it from, its path inside `output_dir`).
  """
  if not train_vocab_size:
    kind = tokenizer_lib.kind_of(tokenizer_path)
    suffix = "model" if kind == "sentencepiece" else "json"
    return tokenizer_path, os.path.join(output_dir, "tokenizer." + suffix)
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
  return source, source


def _write_documents(
    files: Sequence[str],
    tok: tokenizer_lib.Tokenizer,
    source: str,
    writers: dict[str, _SplitWriter],
    eval_every: int,
    text_field: str,
    stats: corpus.CorpusStats,
    progress: progress_lib.Reporter,
) -> None:
  """Tokenizes every document of `files` into its split's writer.

  Each document's ids end with the end-of-document id; document i goes to
  eval when i % eval_every == 0. Documents are encoded `_ENCODE_BATCH` at a
  time, the progress updated after each batch.

  Raises:
    ValueError: when the tokenizer (loaded from `source`) produces an id
      outside its vocabulary.
  """
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


def _input_metadata(
    inputs: Sequence[str], stats: corpus.CorpusStats, text_field: str
) -> dict[str, Any]:
  """The metadata's "input" section: what was read and how much of it."""
  return {
      "paths": [os.path.abspath(p) for p in inputs],
      "files": stats.files,
      "documents": stats.documents,
      "empty_documents": stats.empty_documents,
      "bytes": stats.bytes,
      "invalid_utf8_bytes": stats.invalid_utf8_bytes,
      "text_field": text_field,
  }


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
