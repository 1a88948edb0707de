"""Documents from text files, directories of them, and JSONL files.

A plain text file is one document. A `.jsonl` file holds one JSON object per
line; its `text_field` is one document. A directory contributes every file
under it (recursively, in sorted path order, hidden entries skipped).
Undecodable bytes are replaced by U+FFFD and counted, never dropped silently.
"""

import codecs
import dataclasses
import json
import os
from typing import Iterator, Optional, Sequence

JSONL_SUFFIXES = (".jsonl",)


@dataclasses.dataclass
class CorpusStats:
  """What reading the input found (updated while documents are read)."""

  files: int = 0
  documents: int = 0
  empty_documents: int = 0
  bytes: int = 0
  invalid_utf8_bytes: int = 0
  files_with_invalid_utf8: int = 0


def _readable_file(path: str) -> bool:
  """A regular file (or a link to one) this process may read."""
  return os.path.isfile(path) and os.access(path, os.R_OK)


def list_files(
    inputs: Sequence[str], skipped: Optional[list[str]] = None
) -> list[str]:
  """Every input file, in the order given (directories expanded, sorted).

  Under a directory, only regular files this process can read are taken
  (a FIFO would block the read, a broken link cannot be read); the others
  are appended to `skipped` when given.

  Raises:
    ValueError: no input, a path that does not exist, or one that is neither
      a file nor a directory.
  """
  if not inputs:
    raise ValueError(
        "input: at least one --input file or directory is required"
    )
  files = []
  for path in inputs:
    if os.path.isdir(path):
      found = []
      for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(
            os.path.join(root, n) for n in names if not n.startswith(".")
        )
      for name in sorted(found):
        if _readable_file(name):
          files.append(name)
        elif skipped is not None:
          skipped.append(name)
    elif os.path.isfile(path):
      files.append(path)
    elif os.path.exists(path):
      raise ValueError(f"input={path!r}: is neither a file nor a directory")
    else:
      raise ValueError(f"input={path!r}: does not exist")
  return files


def _decode(data: bytes, stats: CorpusStats) -> tuple[str, int]:
  """UTF-8 text of `data`, invalid bytes replaced; (text, invalid count)."""
  try:
    return data.decode("utf-8"), 0
  except UnicodeDecodeError:
    pass
  invalid = 0
  decoder = codecs.getincrementaldecoder("utf-8")("strict")
  out = []
  rest = data
  while rest:
    try:
      out.append(decoder.decode(rest, final=True))
      break
    except UnicodeDecodeError as e:
      out.append(rest[: e.start].decode("utf-8"))
      out.append("\ufffd")
      invalid += e.end - e.start
      rest = rest[e.end :]
      decoder.reset()
  stats.invalid_utf8_bytes += invalid
  return "".join(out), invalid


def _jsonl_documents(
    path: str, data: bytes, text_field: str, stats: CorpusStats
) -> Iterator[str]:
  """The `text_field` of each line of a JSONL file, in order."""
  for number, raw in enumerate(data.split(b"\n"), start=1):
    if not raw.strip():
      continue
    line, _ = _decode(raw, stats)
    try:
      record = json.loads(line)
    except ValueError as e:
      raise ValueError(f"{path}:{number}: not a JSON object: {e}") from None
    if not isinstance(record, dict) or text_field not in record:
      raise ValueError(
          f"{path}:{number}: has no field {text_field!r} " "(set --text_field)"
      )
    text = record[text_field]
    if not isinstance(text, str):
      raise ValueError(
          f"{path}:{number}: field {text_field!r} is "
          f"{type(text).__name__}, not a string"
      )
    yield text


def read_documents(
    files: Sequence[str], stats: CorpusStats, text_field: str = "text"
) -> Iterator[str]:
  """Yields the documents of `files` in order, counting into `stats`.

  Empty (whitespace-only) documents are counted and skipped.

  Raises:
    ValueError: an unreadable file, or a JSONL line that is not an object
      with a string `text_field`; the message names the file and line.
  """
  for path in files:
    try:
      with open(path, "rb") as f:
        data = f.read()
    except OSError as e:
      raise ValueError(
          f"input={path!r}: cannot be read: " f"{e.strerror or e}"
      ) from None
    stats.files += 1
    stats.bytes += len(data)
    before = stats.invalid_utf8_bytes
    if path.endswith(JSONL_SUFFIXES):
      docs = _jsonl_documents(path, data, text_field, stats)
    else:
      docs = iter([_decode(data, stats)[0]])
    for text in docs:
      if not text.strip():
        stats.empty_documents += 1
        continue
      stats.documents += 1
      yield text
    if stats.invalid_utf8_bytes > before:
      stats.files_with_invalid_utf8 += 1
