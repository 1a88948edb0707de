"""A TensorBoard event file, written synchronously by the loop's thread.

An event file is a sequence of TFRecords, each holding one serialized
`Event` protocol buffer: the record's length (uint64, little-endian), the
masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the
data. The first event names the file version. TensorBoard reads every file
named `events.out.tfevents.*` in a directory.

Writing in the caller's thread means a write error, such as a full disk, is
raised to the caller with the file's name, and nothing is left that would try
again at exit. tensorboardX's `FileWriter` (already a dependency, for its
`Event` protocol buffers) writes on a background thread and does not keep that
guarantee: on a full disk (tried with tensorboardX 2.6.5 on a full tmpfs and on
`/dev/full`) the thread dies of the `OSError`, which only
`threading.excepthook` sees, and once its queue of 10 events is full the
caller's `add_event` blocks forever. Hence this file instead of that writer.
Writes are buffered; `flush` syncs them to the disk.
"""

import os
import socket
import struct
import time
from typing import Optional

import google_crc32c


def _masked_crc(data: bytes) -> bytes:
  """TFRecord's masked CRC-32C (rotated right by 15 bits, plus a constant)."""
  crc = google_crc32c.value(data)
  masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
  return struct.pack("<I", masked)


def encode_record(data: bytes) -> bytes:
  """One TFRecord holding `data`."""
  header = struct.pack("<Q", len(data))
  return header + _masked_crc(header) + data + _masked_crc(data)


class EventFile:
  """Appends serialized `Event`s to a new event file in a directory."""

  def __init__(
      self, directory: str, version_event: bytes, now: Optional[float] = None
  ):
    """Creates `<directory>/events.out.tfevents.<time>.<host>`.

    Args:
      directory: the TensorBoard log directory (created if missing).
      version_event: the serialized first `Event` (its `file_version` set).
      now: the creation time in seconds since the epoch (default: now).

    Raises:
      OSError: the file cannot be created or written, naming its path.
    """
    os.makedirs(directory, exist_ok=True)
    stamp = int(time.time() if now is None else now)
    self.path = os.path.join(
        directory, f"events.out.tfevents.{stamp}.{socket.gethostname()}"
    )
    # The file stays open for the EventFile's life; close() closes it.
    self._file = open(self.path, "ab")  # pylint: disable=consider-using-with
    self.write(version_event)

  def write(self, event: bytes) -> None:
    """Appends one serialized `Event` (buffered)."""
    try:
      self._file.write(encode_record(event))
    except OSError as e:
      raise OSError(e.errno, e.strerror, self.path) from e

  def flush(self) -> None:
    """Writes the buffered events and syncs the file to the disk."""
    try:
      self._file.flush()
      os.fsync(self._file.fileno())
    except OSError as e:
      raise OSError(e.errno, e.strerror, self.path) from e

  def close(self) -> None:
    """Flushes and closes the file; closed even when the flush fails."""
    if self._file.closed:
      return
    try:
      self.flush()
    finally:
      try:
        self._file.close()
      except OSError:
        pass  # The flush above raised the same error, naming the file.
