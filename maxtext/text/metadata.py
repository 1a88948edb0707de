"""The metadata JSON of a prepared text data directory.

`tools/prepare_data` writes, into its output directory, ArrayRecord shards of
token ids and one `metadata.json` that says what they hold:

  {
    "format": "maxtext.text/1",
    "tokenizer": {"file": "tokenizer.model", "kind": "sentencepiece",
                  "sha256": "...", "source": "/path/given", "trained": false},
    "vocab_size": 512,          # ids are in [0, vocab_size)
    "eod_id": 2,                # end-of-document id, after every document
    "token_dtype": "uint16",    # dtype of the ids in each record
    "record_tokens": 4096,      # tokens per record (the last may be shorter)
    "eval_rule": "...",         # which documents went to the eval split
    "splits": {
      "train": {"shards": ["train-00000-of-00001.array_record"],
                "documents": 90, "tokens": 123456, "records": 31},
      "eval": {...}
    },
    "input": {"files": 12, "documents": 100, "invalid_utf8_bytes": 0, ...}
  }

Each split is one stream: its documents, each followed by `eod_id`,
concatenated in input order and cut into records of `record_tokens` ids, so
token t of a split is id t % record_tokens of record t // record_tokens. This
module reads and checks that file without importing Grain or a tokenizer, so
config checks can use it.
"""

import json
import os
from typing import Any

FORMAT = "maxtext.text/1"
METADATA_FILE = "metadata.json"
SPLITS = ("train", "eval")
TOKEN_DTYPES = {"uint16": 2**16, "uint32": 2**32}


def _fail(path: str, problem: str) -> ValueError:
  return ValueError(f"{path}: {problem}")


def metadata_path(data_dir: str) -> str:
  """The metadata file of a prepared data directory."""
  return os.path.join(data_dir, METADATA_FILE)


def _require(meta: dict[str, Any], key: str, kind: type, path: str) -> Any:
  value = meta.get(key)
  if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
    raise _fail(
        path,
        f"field {key!r} must be a {kind.__name__}, got "
        f"{value!r}; rerun tools/prepare_data",
    )
  return value


def check(meta: Any, path: str) -> dict[str, Any]:
  """Checks the structure of a parsed metadata object.

  Args:
    meta: the parsed JSON.
    path: where it came from, for messages.

  Returns:
    `meta`, checked.

  Raises:
    ValueError: `<path>: <problem>` for a missing or mistyped field.
  """
  if not isinstance(meta, dict):
    raise _fail(path, "is not a JSON object")
  if meta.get("format") != FORMAT:
    raise _fail(
        path,
        f"format is {meta.get('format')!r}, expected "
        f"{FORMAT!r}; rerun tools/prepare_data",
    )
  vocab = _require(meta, "vocab_size", int, path)
  eod = _require(meta, "eod_id", int, path)
  if not 0 <= eod < vocab:
    raise _fail(path, f"eod_id {eod} is outside [0, vocab_size={vocab})")
  dtype = _require(meta, "token_dtype", str, path)
  if dtype not in TOKEN_DTYPES or vocab > TOKEN_DTYPES[dtype]:
    raise _fail(path, f"token_dtype {dtype!r} cannot hold vocab_size {vocab}")
  if _require(meta, "record_tokens", int, path) < 1:
    raise _fail(path, "record_tokens must be >= 1")
  tokenizer = _require(meta, "tokenizer", dict, path)
  for key in ("file", "kind", "sha256"):
    _require(tokenizer, key, str, path)
  splits = _require(meta, "splits", dict, path)
  for split in SPLITS:
    entry = splits.get(split)
    if not isinstance(entry, dict):
      raise _fail(path, f"has no {split!r} split")
    shards = _require(entry, "shards", list, path)
    if not shards or not all(isinstance(s, str) for s in shards):
      raise _fail(path, f"split {split!r} lists no shards")
    for key in ("documents", "tokens", "records"):
      _require(entry, key, int, path)
  return meta


def load(data_dir: str, field: str = "train_data_path") -> dict[str, Any]:
  """Reads and checks `<data_dir>/metadata.json`.

  Args:
    data_dir: a directory `tools/prepare_data` wrote.
    field: the config field that names it, for messages.

  Returns:
    The metadata dict.

  Raises:
    ValueError: `config.<field>=<dir>: <problem>` when the directory or its
      metadata is missing, unreadable or malformed.
  """
  where = f"config.{field}={data_dir!r}"
  if not data_dir:
    raise ValueError(
        f"{where}: a prepared data directory is required "
        "(tools/prepare_data --output_dir)"
    )
  if not os.path.isdir(data_dir):
    raise ValueError(f"{where}: is not a directory")
  path = metadata_path(data_dir)
  try:
    with open(path, encoding="utf-8") as f:
      meta = json.load(f)
  except FileNotFoundError:
    raise ValueError(
        f"{where}: has no {METADATA_FILE}; is it a directory "
        "written by tools/prepare_data?"
    ) from None
  except (OSError, ValueError) as e:
    raise ValueError(f"{where}: cannot read {METADATA_FILE}: {e}") from None
  try:
    return check(meta, path)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None


def windows(meta: dict[str, Any], split: str, sequence_length: int) -> int:
  """Sequences of `sequence_length` + 1 tokens that a split holds.

  Windows start every `sequence_length` tokens, so neighbours share one
  boundary token and every token but the first is a target once.
  """
  tokens = meta["splits"][split]["tokens"]
  return max(0, (tokens - 1) // sequence_length)


def provenance(meta: dict[str, Any], data_dir: str) -> dict[str, Any]:
  """What `config.json` records about a run's data: enough to tell whether a
  resumed run reads the same tokens with the same tokenizer."""
  return {
      "data_dir": os.path.abspath(data_dir),
      "tokenizer_sha256": meta["tokenizer"]["sha256"],
      "tokenizer_kind": meta["tokenizer"]["kind"],
      "vocab_size": meta["vocab_size"],
      "eod_id": meta["eod_id"],
      "splits": {
          split: {
              "shards": list(meta["splits"][split]["shards"]),
              "documents": meta["splits"][split]["documents"],
              "tokens": meta["splits"][split]["tokens"],
          }
          for split in SPLITS
      },
  }


def check_resume(recorded: Any, current: dict[str, Any]) -> None:
  """Refuses to resume a run on data with another tokenizer.

  Args:
    recorded: the `data` provenance an earlier attempt recorded (None or
      absent for runs without it: nothing to compare).
    current: `provenance(...)` of this attempt's data.

  Raises:
    ValueError: the tokenizer hash differs.
  """
  if not isinstance(recorded, dict) or "tokenizer_sha256" not in recorded:
    return
  if recorded["tokenizer_sha256"] != current["tokenizer_sha256"]:
    raise ValueError(
        f"config.train_data_path={current['data_dir']!r}: its tokenizer "
        f"(sha256 {current['tokenizer_sha256'][:12]}...) differs from the "
        f"one the run recorded (sha256 "
        f"{recorded['tokenizer_sha256'][:12]}...); token ids would change "
        "meaning. Resume with the original data, or start a new run_name"
    )


def check_config(
    train_data_path: str,
    eval_data_path: str,
    vocab_size: int,
    max_sequence_length: int,
) -> tuple[dict[str, Any], dict[str, Any], str]:
  """Checks a grain run's data fields against the prepared data.

  Args:
    train_data_path: the prepared directory (its train split is read).
    eval_data_path: another prepared directory for eval, or "" for the
      train directory's eval split.
    vocab_size: the model's vocabulary.
    max_sequence_length: S; each split needs S + 1 tokens.

  Returns:
    (train metadata, eval metadata, eval directory).

  Raises:
    ValueError: naming the config field: no metadata, a vocabulary larger
      than vocab_size, eval data with another tokenizer, or a split too
      short for one sequence.
  """
  train_meta = load(train_data_path, "train_data_path")
  eval_dir = eval_data_path or train_data_path
  eval_field = "eval_data_path" if eval_data_path else "train_data_path"
  eval_meta = load(eval_dir, eval_field) if eval_data_path else train_meta
  for field, path, meta in (
      ("train_data_path", train_data_path, train_meta),
      (eval_field, eval_dir, eval_meta),
  ):
    if meta["vocab_size"] > vocab_size:
      raise ValueError(
          f"config.vocab_size={vocab_size}: smaller than the vocabulary of "
          f"{field}={path!r} ({meta['vocab_size']} ids); set vocab_size >= "
          f"{meta['vocab_size']}"
      )
  if eval_meta["tokenizer"]["sha256"] != train_meta["tokenizer"]["sha256"]:
    raise ValueError(
        f"config.eval_data_path={eval_dir!r}: prepared with "
        "another tokenizer than train_data_path"
    )
  for field, path, meta, split in (
      ("train_data_path", train_data_path, train_meta, "train"),
      (eval_field, eval_dir, eval_meta, "eval"),
  ):
    if windows(meta, split, max_sequence_length) < 1:
      raise ValueError(
          f"config.{field}={path!r}: its {split} split holds "
          f"{meta['splits'][split]['tokens']} tokens; one sequence needs "
          f"max_sequence_length + 1 = {max_sequence_length + 1}"
      )
  return train_meta, eval_meta, eval_dir
