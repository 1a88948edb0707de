"""Megatron indexed datasets on disk: a `.idx` index beside a `.bin` of tokens.

The format of Megatron-LM's `IndexedDataset` (megatron/core/datasets/
indexed_dataset.py, the "MMIDIDX" index of core_r0.x; earlier releases call
it `MMapIndexedDataset`), the MLPerf LLM references' tokenized C4. A dataset
is a path prefix P naming two files:

  P.idx  little-endian, no padding:
           9 bytes   magic b"MMIDIDX\\x00\\x00"
           u64       version, 1
           u8        dtype code of the tokens (DTYPES)
           u64       sequence count S
           u64       document-index count D
           int32[S]  sequence lengths, in tokens
           int64[S]  byte offset of each sequence in P.bin
           int64[D]  document index: document d is sequences
                     [doc[d], doc[d + 1]); doc[0] = 0, doc[D - 1] = S
         (a multimodal index adds int8[S] sequence modes after these; they
         are accepted and not read.)
  P.bin  the tokens of every sequence, in the dtype the index names.

`open_prefix` reads an index and memory-maps its `.bin`, checking every fact
the reader relies on; any problem is one line naming the file.
`first_outside_vocab` reads every token once to find the first that is no
id of a vocabulary (`ids_outside` is that test, for any array). `write` is
the small writer of the same format that the tests and
`//tools/benchmarks:data_bench` build their files with.
"""

import dataclasses
import errno
import os
import stat
import struct
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from maxtext.core import checks

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# magic, version (u64), dtype code (u8), sequence count (u64), document
# index count (u64).
_HEADER = struct.Struct("<9sQBQQ")
HEADER_BYTES = _HEADER.size

# The dtype codes of Megatron-LM core's `DType` enum.
DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    6: np.dtype("<f8"),
    7: np.dtype("<f4"),
    8: np.dtype("<u2"),
}
CODES: dict[np.dtype, int] = {dtype: code for code, dtype in DTYPES.items()}
# Index entries checked per pass when a prefix is opened.
CHECK_CHUNK = 1 << 22
# Tokens read per pass when a prefix's ids are checked against a
# vocabulary (64 MiB of int32 tokens).
SCAN_CHUNK = 1 << 24


class FormatError(ValueError):
  """A Megatron index or token file that cannot be read: one line."""


def _fail(path: str, problem: str) -> FormatError:
  return FormatError(f"{path}: {problem}")


@dataclasses.dataclass(frozen=True)
class IndexedTokens:
  """One prefix's index and its memory-mapped tokens.

  Attributes:
    prefix: the path prefix (P of P.idx, P.bin).
    dtype: the tokens' dtype (DTYPES).
    sizes: int32 [S] tokens per sequence.
    pointers: int64 [S] byte offset of each sequence in the .bin.
    document_index: int64 [D], D - 1 documents.
    tokens: the .bin mapped read-only as `dtype`, 1-D.
    contiguous: the sequences lie back to back from pointers[0] in index
      order, so the stream of all sequences is one slice of `tokens`.
    total_tokens: tokens of all sequences together.
    starts: None when contiguous, else int64 [S + 1] each sequence's first
      token in the stream of all sequences, in index order, and the
      stream's length last.
  """

  prefix: str
  dtype: np.dtype
  sizes: np.ndarray
  pointers: np.ndarray
  document_index: np.ndarray
  tokens: np.ndarray
  contiguous: bool
  total_tokens: int
  starts: Optional[np.ndarray]

  @property
  def idx_path(self) -> str:
    return self.prefix + ".idx"

  @property
  def bin_path(self) -> str:
    return self.prefix + ".bin"

  @property
  def num_tokens(self) -> int:
    """Tokens of all sequences together."""
    return self.total_tokens

  @property
  def num_sequences(self) -> int:
    return int(self.sizes.shape[0])

  @property
  def num_documents(self) -> int:
    return int(self.document_index.shape[0]) - 1

  def stream(self, start: int, stop: int) -> np.ndarray:
    """Tokens [start, stop) of the stream of all sequences in index order.

    Raises:
      ValueError: the span is not inside the stream.
    """
    if not 0 <= start <= stop <= self.num_tokens:
      raise ValueError(
          f"{self.bin_path}: tokens [{start}, {stop}) are outside its "
          f"{self.num_tokens} tokens"
      )
    if self.contiguous:
      base = 0
      if self.num_sequences:
        base = int(self.pointers[0]) // self.dtype.itemsize
      return np.asarray(self.tokens[base + start : base + stop])
    pieces = []
    seq = int(np.searchsorted(self.starts, start, side="right")) - 1
    pos = start
    while pos < stop:
      seq_start = int(self.starts[seq])
      end = min(stop, int(self.starts[seq + 1]))
      if end > pos:
        first = int(self.pointers[seq]) // self.dtype.itemsize
        first += pos - seq_start
        pieces.append(np.asarray(self.tokens[first : first + end - pos]))
      pos = end
      seq += 1
    if not pieces:
      return np.zeros((0,), self.dtype)
    return np.concatenate(pieces)


def _stat_file(path: str, what: str) -> int:
  """The size of a regular file, or a one-line FormatError."""
  try:
    info = os.stat(path)
  except OSError as e:
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
      raise _fail(path, f"{what} does not exist") from None
    raise _fail(path, f"cannot be read: {e.strerror}") from None
  if not stat.S_ISREG(info.st_mode):
    raise _fail(path, f"is {checks.file_kind(info.st_mode)}, not a {what}")
  return info.st_size


def read_index(idx_path: str):
  """Reads and checks a .idx file.

  Returns:
    (dtype, sizes int32 [S], pointers int64 [S], document index int64 [D]),
    the arrays memory-mapped read-only.

  Raises:
    FormatError: `<idx_path>: <problem>` for a missing, truncated or
      malformed index, or an unknown dtype code.
  """
  size = _stat_file(idx_path, "Megatron index (.idx)")
  code, sequences, documents = _read_header(idx_path, size)
  sizes, pointers, doc = _map_arrays(idx_path, sequences, documents)
  return DTYPES[code], sizes, pointers, doc


def _read_header(idx_path: str, size: int) -> tuple[int, int, int]:
  """The dtype code and the sequence and document index counts of the .idx
  file at `idx_path` of `size` bytes, its header and size checked.

  Raises:
    FormatError: as `read_index`.
  """
  if size < HEADER_BYTES:
    raise _fail(
        idx_path,
        f"truncated Megatron index: {size} bytes, the header alone is "
        f"{HEADER_BYTES}",
    )
  try:
    with open(idx_path, "rb") as f:
      header = f.read(HEADER_BYTES)
  except OSError as e:
    raise _fail(idx_path, f"cannot be read: {e.strerror or e}") from None
  magic, version, code, sequences, documents = _HEADER.unpack(header)
  if magic != MAGIC:
    raise _fail(
        idx_path,
        f"not a Megatron index: it starts with {magic!r}, not {MAGIC!r}",
    )
  if version != VERSION:
    raise _fail(
        idx_path,
        f"Megatron index version {version}; this reader knows {VERSION}",
    )
  if code not in DTYPES:
    known = ", ".join(f"{c} {d.name}" for c, d in DTYPES.items())
    raise _fail(idx_path, f"unknown dtype code {code} (known: {known})")
  needed = HEADER_BYTES + 12 * sequences + 8 * documents
  # A multimodal index carries one int8 mode per sequence after the arrays.
  if size not in (needed, needed + sequences):
    raise _fail(
        idx_path,
        f"{'truncated' if size < needed else 'malformed'} Megatron index: "
        f"its header says {sequences} sequences and {documents} document "
        f"index entries ({needed} bytes), the file has {size} bytes",
    )
  if documents < 1:
    raise _fail(idx_path, "malformed Megatron index: no document index entry")
  return code, sequences, documents


def _map_arrays(
    idx_path: str, sequences: int, documents: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The sizes, pointers and document index of the .idx file at
  `idx_path`, memory-mapped read-only after its header; the lengths and
  the document index checked.

  Raises:
    FormatError: a negative sequence length, or a document index that does
      not rise from 0 to `sequences`.
  """
  offset = HEADER_BYTES
  sizes = pointers = np.zeros((0,), np.int64)
  if sequences:
    sizes = np.memmap(idx_path, "<i4", "r", offset, (sequences,))
    pointers = np.memmap(
        idx_path, "<i8", "r", offset + 4 * sequences, (sequences,)
    )
  doc = np.memmap(idx_path, "<i8", "r", offset + 12 * sequences, (documents,))
  if sequences and int(sizes.min()) < 0:
    raise _fail(
        idx_path, "malformed Megatron index: a negative sequence length"
    )
  if (
      int(doc[0]) != 0
      or int(doc[-1]) != sequences
      or (documents > 1 and bool(np.any(np.diff(doc) < 0)))
  ):
    raise _fail(
        idx_path,
        "malformed Megatron index: the document index must rise from 0 to "
        f"the sequence count {sequences}",
    )
  return sizes, pointers, doc


def open_prefix(prefix: str, chunk: int = CHECK_CHUNK) -> IndexedTokens:
  """Opens `prefix`.idx and memory-maps `prefix`.bin, both checked.

  Args:
    prefix: the path prefix.
    chunk: index entries checked per pass (bounds the temporaries).

  Raises:
    FormatError: one line naming the file: as `read_index`, a missing or
      unreadable .bin, a .bin shorter than its index says, or one whose
      sequences do not start on a token boundary.
  """
  idx_path, bin_path = prefix + ".idx", prefix + ".bin"
  dtype, sizes, pointers, doc = read_index(idx_path)
  bin_size = _stat_file(bin_path, "Megatron token file (.bin)")
  itemsize = dtype.itemsize
  layout = _scan_layout(sizes, pointers, itemsize, chunk)
  if layout.lowest < 0 or layout.highest > bin_size:
    raise _fail(
        bin_path,
        f"shorter than its index says: {prefix}.idx places tokens up to "
        f"byte {layout.highest}, the file has {bin_size} bytes",
    )
  if layout.misaligned:
    raise _fail(
        idx_path,
        f"malformed Megatron index: a sequence offset is not a multiple "
        f"of the {dtype.name} token size {itemsize}",
    )
  starts = None
  if not layout.contiguous:
    # Where each sequence begins in the stream, to find a span's pieces.
    starts = np.zeros((sizes.shape[0] + 1,), np.int64)
    np.cumsum(sizes, dtype=np.int64, out=starts[1:])
  return IndexedTokens(
      prefix=prefix,
      dtype=dtype,
      sizes=sizes,
      pointers=pointers,
      document_index=doc,
      tokens=_map_tokens(bin_path, dtype, bin_size),
      contiguous=layout.contiguous,
      total_tokens=layout.total,
      starts=starts,
  )


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Where an index places its sequences in the .bin file.

  Attributes:
    total: the tokens of all sequences.
    lowest: the lowest byte offset of a sequence (0 when there is none).
    highest: the highest byte a sequence ends at (0 when there is none).
    contiguous: the sequences follow each other in index order, without
      gaps, from the first one's offset.
    misaligned: a sequence offset is not a multiple of the token size.
  """

  total: int
  lowest: int
  highest: int
  contiguous: bool
  misaligned: bool


def _scan_layout(
    sizes: np.ndarray, pointers: np.ndarray, itemsize: int, chunk: int
) -> _Layout:
  """The layout of the sequences of `sizes` (tokens) at `pointers` (bytes)
  with tokens of `itemsize` bytes, read `chunk` index entries at a time."""
  count = sizes.shape[0]
  first = int(pointers[0]) if count else 0
  total, lowest, highest = 0, 0, 0
  contiguous, misaligned = True, False
  # In chunks: an index of tens of millions of sequences is checked with
  # temporaries of a few tens of MB.
  for lo in range(0, count, chunk):
    lengths = np.asarray(sizes[lo : lo + chunk], np.int64)
    offsets = np.asarray(pointers[lo : lo + chunk], np.int64)
    ends = offsets + lengths * itemsize
    lowest = min(lowest, int(offsets.min()))
    highest = max(highest, int(ends.max()))
    misaligned = misaligned or bool(np.any(offsets % itemsize))
    if contiguous:
      starts = total + np.cumsum(lengths) - lengths
      contiguous = bool(np.array_equal(offsets, first + starts * itemsize))
    total += int(lengths.sum())
  return _Layout(total, lowest, highest, contiguous, misaligned)


def _map_tokens(bin_path: str, dtype: np.dtype, bin_size: int) -> np.ndarray:
  """The whole tokens of the .bin file at `bin_path` (of `bin_size` bytes),
  memory-mapped read-only; a trailing partial token is left out."""
  usable = bin_size - bin_size % dtype.itemsize
  if usable:
    return np.memmap(bin_path, dtype, "r", 0, (usable // dtype.itemsize,))
  return np.zeros((0,), dtype)  # mmap cannot map zero bytes.


def ids_outside(values: np.ndarray, vocab_size: int) -> np.ndarray:
  """Where `values` (tokens of any of DTYPES) are no id of a vocabulary of
  `vocab_size`: negative, at or above it, or (float tokens) not a whole
  number. bool, the shape of `values`."""
  bad = (values < 0) | (values >= vocab_size)
  if values.dtype.kind == "f":
    bad |= ~np.isfinite(values) | (values != np.floor(values))
  return bad


def first_outside_vocab(
    tokens: IndexedTokens, vocab_size: int, chunk: int = SCAN_CHUNK
) -> Optional[tuple[int, Union[int, float]]]:
  """The first token of the stream that is no id below `vocab_size`
  (`ids_outside`): (its position in the stream, its value), or None.

  Reads every token of the stream once, `chunk` tokens at a time (an
  integer chunk's minimum and maximum first: the mask is made only for a
  chunk that holds such a token). Nothing is read when the dtype cannot
  hold one (uint16 tokens and a vocabulary of 65,536 or more).
  """
  dtype = tokens.dtype
  if dtype.kind == "u" and np.iinfo(dtype).max < vocab_size:
    return None
  for start in range(0, tokens.num_tokens, chunk):
    values = tokens.stream(start, min(start + chunk, tokens.num_tokens))
    if dtype.kind != "f" and 0 <= values.min() and values.max() < vocab_size:
      continue
    bad = ids_outside(values, vocab_size)
    if bad.any():
      at = int(np.argmax(bad))
      return start + at, values[at].item()
  return None


def write(
    prefix: str,
    documents: Iterable[Sequence[Sequence[int]]],
    dtype=np.int32,
) -> None:
  """Writes `prefix`.bin and `prefix`.idx in the format above.

  Args:
    prefix: the path prefix; its directory must exist.
    documents: each document a list of sequences, each a list of token
      ids (Megatron's preprocessing writes one sequence per document, its
      end-of-document id included when asked to append one).
    dtype: the tokens' dtype, one of DTYPES' values.

  Raises:
    ValueError: a dtype the format has no code for.
  """
  dtype = np.dtype(dtype)
  if dtype not in CODES:
    raise ValueError(
        f"dtype {dtype}: the Megatron format has codes for "
        f"{[d.name for d in DTYPES.values()]}"
    )
  sizes, pointers, doc = [], [], [0]
  offset = 0
  with open(prefix + ".bin", "wb") as f:
    for document in documents:
      for sequence in document:
        array = np.asarray(sequence, dtype)
        f.write(array.tobytes())
        sizes.append(array.shape[0])
        pointers.append(offset)
        offset += array.nbytes
      doc.append(len(sizes))
  with open(prefix + ".idx", "wb") as f:
    f.write(_HEADER.pack(MAGIC, VERSION, CODES[dtype], len(sizes), len(doc)))
    f.write(np.asarray(sizes, "<i4").tobytes())
    f.write(np.asarray(pointers, "<i8").tobytes())
    f.write(np.asarray(doc, "<i8").tobytes())
