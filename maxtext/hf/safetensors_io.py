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
from typing import Any

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


class SafetensorsFile:
  """The header of one safetensors file, and memory-mapped tensor views."""

  def __init__(self, path: str):
    self.path = path
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      head = f.read(8)
      if len(head) < 8:
        raise FormatError(f"{path}: truncated: no header length")
      (length,) = struct.unpack("<Q", head)
      if length > min(size - 8, _MAX_HEADER_BYTES):
        raise FormatError(
            f"{path}: truncated or not safetensors: header of {length} "
            f"bytes in a file of {size}"
        )
      try:
        header = json.loads(f.read(length))
      except ValueError as e:
        raise FormatError(f"{path}: unreadable header: {e}") from None
    self._start = 8 + length
    self.metadata = header.pop("__metadata__", None) or {}
    self._entries = {}
    for name, entry in header.items():
      dtype = DTYPES.get(entry.get("dtype"))
      if dtype is None:
        raise FormatError(
            f"{path}: tensor {name}: unsupported dtype {entry.get('dtype')!r}"
        )
      shape = tuple(int(d) for d in entry["shape"])
      begin, end = (int(o) for o in entry["data_offsets"])
      if end - begin != math.prod(shape) * dtype.itemsize:
        raise FormatError(
            f"{path}: tensor {name}: {end - begin} bytes for shape {shape} "
            f"of {entry['dtype']}"
        )
      if self._start + end > size:
        raise FormatError(
            f"{path}: truncated: tensor {name} ends at byte "
            f"{self._start + end} of a {size}-byte file"
        )
      self._entries[name] = (dtype, shape, begin)

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


def write(
    path: str,
    tensors: Mapping[str, Any],
    metadata: Mapping[str, str] | None = None,
) -> None:
  """Writes `tensors` (name -> array) as one safetensors file at `path`.

  A tensor may be any object with `shape`, `dtype` and `__array__`: it is
  turned into an array only when its bytes are written, one at a time, in
  name order. The header is padded with spaces to a multiple of 8 bytes,
  so every tensor starts 8-byte aligned.
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
