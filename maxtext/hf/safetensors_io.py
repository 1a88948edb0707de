"""The safetensors file format, read lazily and written, without torch.

A safetensors file is an 8-byte little-endian header length N, N bytes of
JSON header, then the tensors' raw bytes. The header maps each tensor name
to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the bytes
after the header), plus an optional "__metadata__" of strings. Tensors are
stored C-contiguous, little-endian.

`SafetensorsFile` reads the header only; `array(name)` is a read-only
`np.memmap` view, so a tensor's bytes are read from disk when used (and
peak memory stays at what the caller copies). bfloat16 and float8_e4m3fn
come from ml_dtypes. `write` writes a file tensor by tensor.
"""

import json
import math
import os
import struct
from collections.abc import Mapping
from typing import Any, Callable

import ml_dtypes
import numpy as np

# safetensors dtype names <-> NumPy dtypes.
DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
    # DeepSeek-V3's block-scaled weights (maxtext.hf.fp8).
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# Larger headers are refused as damage rather than read.
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class FormatError(ValueError):
  """A file that is not a complete safetensors file; one line naming it."""


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _check_entry(path: str, name: str, entry: Any) -> tuple:
  """(dtype, shape, begin, end) of header entry `name`, its types checked."""
  where = f"{path}: tensor {name}"
  if not isinstance(entry, dict):
    raise FormatError(f"{where}: header entry is a {type(entry).__name__}")
  for key in ("dtype", "shape", "data_offsets"):
    if key not in entry:
      raise FormatError(f"{where}: header entry has no {key!r}")
  dtype_name = entry["dtype"]
  dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
  if dtype is None:
    raise FormatError(f"{where}: unsupported dtype {dtype_name!r}")
  shape = entry["shape"]
  if not isinstance(shape, list) or not all(
      _is_int(d) and d >= 0 for d in shape
  ):
    raise FormatError(
        f"{where}: shape {shape!r} is not a list of non-negative integers"
    )
  offsets = entry["data_offsets"]
  if (
      not isinstance(offsets, list)
      or len(offsets) != 2
      or not all(_is_int(o) for o in offsets)
      or not 0 <= offsets[0] <= offsets[1]
  ):
    raise FormatError(
        f"{where}: data_offsets {offsets!r} are not [begin, end] with "
        "0 <= begin <= end"
    )
  begin, end = offsets
  if end - begin != math.prod(shape) * dtype.itemsize:
    raise FormatError(
        f"{where}: {end - begin} bytes for shape {tuple(shape)} of {dtype_name}"
    )
  return dtype, tuple(shape), begin, end


class SafetensorsFile:
  """The header of one safetensors file, and memory-mapped tensor views.

  The header is checked as the format states it before any tensor is read:
  a JSON object of entries with a known dtype, a shape of non-negative
  integers and data offsets that match it; the entries' bytes tile the data
  after the header exactly (from 0, no gap, no overlap, to the end of the
  file), so no tensor reads the header or another tensor's bytes.
  """

  def __init__(self, path: str):
    self.path = path
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      head = f.read(8)
      if len(head) < 8:
        raise FormatError(f"{path}: truncated: no header length")
      (length,) = struct.unpack("<Q", head)
      if length > min(size - 8, _MAX_HEADER_BYTES):
        # The length is not printed: in a file that is not safetensors
        # they are its first 8 bytes.
        raise FormatError(
            f"{path}: truncated or not safetensors: its header length runs "
            f"past the end of the {size}-byte file"
        )
      try:
        header = json.loads(f.read(length))
      except ValueError:
        raise FormatError(
            f"{path}: truncated or not safetensors: the header is not JSON"
        ) from None
    if not isinstance(header, dict):
      raise FormatError(
          f"{path}: the header is a JSON {type(header).__name__}, not an object"
      )
    self._start = 8 + length
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(v, str) for v in metadata.values()
    ):
      raise FormatError(f"{path}: __metadata__ is not an object of strings")
    self.metadata = metadata
    self._entries = {}
    spans = []
    for name, entry in header.items():
      dtype, shape, begin, end = _check_entry(path, name, entry)
      if self._start + end > size:
        raise FormatError(
            f"{path}: truncated: tensor {name} ends at byte "
            f"{self._start + end} of a {size}-byte file"
        )
      self._entries[name] = (dtype, shape, begin)
      spans.append((begin, end, name))
    _check_tiling(path, sorted(spans), size - self._start)

  def names(self) -> list[str]:
    return sorted(self._entries)

  def shape(self, name: str) -> tuple[int, ...]:
    return self._entries[name][1]

  def dtype(self, name: str) -> np.dtype:
    return self._entries[name][0]

  def array(self, name: str) -> np.ndarray:
    """A read-only memory-mapped view of tensor `name`."""
    dtype, shape, begin = self._entries[name]
    if not math.prod(shape):
      return np.zeros(shape, dtype)
    return np.memmap(
        self.path,
        dtype=dtype,
        mode="r",
        offset=self._start + begin,
        shape=shape,
    )


def _check_tiling(path: str, spans: list, data_bytes: int) -> None:
  """Requires sorted (begin, end, name) spans to cover [0, data_bytes)
  exactly once."""
  position, previous = 0, None
  for begin, end, name in spans:
    if begin < position:
      raise FormatError(
          f"{path}: tensor {name} (bytes {begin}-{end}) overlaps tensor "
          f"{previous}"
      )
    if begin > position:
      raise FormatError(
          f"{path}: tensor {name} starts at byte {begin}, leaving bytes "
          f"{position}-{begin} of the data unused (the format has no gaps)"
      )
    position, previous = end, name
  if position != data_bytes:
    raise FormatError(
        f"{path}: the tensors end at byte {position} of {data_bytes} bytes of "
        "data (trailing bytes)"
    )


def write(
    path: str,
    tensors: Mapping[str, Any],
    metadata: Mapping[str, str] | None = None,
    written: Callable[[str, int], None] = lambda name, nbytes: None,
) -> None:
  """Writes `tensors` (name -> array) as one safetensors file at `path`.

  A tensor may be any object with `shape`, `dtype` and `__array__`: it is
  turned into an array only when its bytes are written, one at a time, in
  name order, each then told to `written` (its name and bytes). The header
  is padded with spaces to a multiple of 8 bytes, so every tensor starts
  8-byte aligned.
  """
  header = {}
  if metadata:
    header["__metadata__"] = dict(metadata)
  offset = 0
  for name in sorted(tensors):
    array = tensors[name]
    dtype = np.dtype(array.dtype)
    if dtype not in _NAMES:
      raise ValueError(f"tensor {name}: dtype {dtype} has no safetensors name")
    nbytes = math.prod(array.shape) * dtype.itemsize
    header[name] = {
        "dtype": _NAMES[dtype],
        "shape": list(array.shape),
        "data_offsets": [offset, offset + nbytes],
    }
    offset += nbytes
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for name in sorted(tensors):
      # Little-endian hosts only (x86, ARM): the bytes are written as held.
      array = np.ascontiguousarray(np.asarray(tensors[name]))
      if array.shape != tuple(header[name]["shape"]):
        raise ValueError(f"tensor {name}: shape {array.shape} changed")
      array.tofile(f)
      written(name, array.nbytes)
