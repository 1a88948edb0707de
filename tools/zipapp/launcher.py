"""Starts the program packed in this file (`__main__.py` of a python_zipapp).

Run as `python3 FILE ARGS...` or `./FILE ARGS...`. FILE holds the payload
archive (the runfiles) before the small archive this module comes from; the
manifest says where. The first start unpacks the runfiles into
`$MAXTEXT_ZIPAPP_CACHE` (default `~/.cache/maxtext_zipapp`) under the file's
content id; later starts of the same file reuse them. The program then runs in
this very process, with only the packed code and packages on sys.path (the
host's site-packages are left out), so signals reach it directly.
"""

import io
import json
import os
import runpy
import shutil
import sys
import tempfile
import zipfile

_PYTHON = (3, 11)  # The packed wheels are built for this CPython.


def _fail(message):
  sys.stderr.write(f"{os.path.basename(sys.argv[0])}: error: {message}\n")
  sys.exit(2)


class _Window(io.RawIOBase):
  """A read-only view of bytes [offset, offset + length) of a file."""

  def __init__(self, path, offset, length):
    super().__init__()
    # Held open for the view's life; close() closes it.
    self._file = open(path, "rb")  # pylint: disable=consider-using-with
    self._offset, self._length, self._pos = offset, length, 0

  def readable(self):
    return True

  def seekable(self):
    return True

  def tell(self):
    return self._pos

  def seek(self, pos, whence=io.SEEK_SET):
    base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[
        whence
    ]
    self._pos = max(0, base + pos)
    return self._pos

  def readinto(self, buffer):
    count = max(0, min(len(buffer), self._length - self._pos))
    self._file.seek(self._offset + self._pos)
    data = self._file.read(count)
    buffer[: len(data)] = data
    self._pos += len(data)
    return len(data)

  def close(self):
    self._file.close()
    super().close()


def _unpack(archive_path, manifest):
  """Unpacks the payload into the cache unless there; returns its directory."""
  cache = os.environ.get("MAXTEXT_ZIPAPP_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "maxtext_zipapp"
  )
  target = os.path.join(cache, manifest["id"])
  if os.path.isfile(os.path.join(target, ".complete")):
    return target
  os.makedirs(cache, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=".unpack-", dir=cache)
  try:
    payload = _Window(
        archive_path, manifest["payload_offset"], manifest["payload_length"]
    )
    with payload, zipfile.ZipFile(payload) as archive:
      for info in archive.infolist():
        if not info.filename.startswith("runfiles/"):
          continue
        path = archive.extract(info, staging)
        mode = (info.external_attr >> 16) & 0o777
        if mode:
          os.chmod(path, mode)
    with open(os.path.join(staging, ".complete"), "w", encoding="utf-8"):
      pass  # An empty marker: the unpacking finished.
    try:
      os.rename(staging, target)
    except OSError:
      if not os.path.isfile(os.path.join(target, ".complete")):
        raise
      shutil.rmtree(staging, ignore_errors=True)  # Another start won the race.
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return target


def main():
  if sys.version_info[:2] != _PYTHON:
    _fail(
        f"needs Python {_PYTHON[0]}.{_PYTHON[1]} (the packed packages are "
        f"built for it); this is Python {sys.version.split()[0]} at "
        f"{sys.executable}"
    )
  archive_path = os.path.abspath(sys.argv[0])
  with zipfile.ZipFile(archive_path) as archive:
    manifest = json.loads(archive.read("zipapp_manifest.json"))
  root = os.path.join(_unpack(archive_path, manifest), "runfiles")
  packed = [os.path.join(root, p) for p in manifest["python_paths"]]
  # Keep the interpreter's standard library; drop the archive and host packages.
  host = [
      p
      for p in sys.path[1:]
      if p and "site-packages" not in p and "dist-packages" not in p
  ]
  sys.path[:] = packed + host
  os.environ["MAXTEXT_ZIPAPP"] = archive_path
  main_path = os.path.join(root, manifest["main"])
  sys.argv[0] = main_path
  runpy.run_path(main_path, run_name="__main__")


if __name__ == "__main__":
  main()
