"""Tests for maxtext.storage.checksums on real files in a temp dir."""

import json
import os

from absl.testing import absltest
import google_crc32c

from maxtext.core import progress
from maxtext.storage import checksums


def _write(path: str, data: bytes) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(data)


class ChecksumsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.step = self.create_tempdir().full_path
    _write(os.path.join(self.step, "state", "d", "a"), os.urandom(100_000))
    _write(os.path.join(self.step, "state", "_METADATA"), b'{"tree": 1}')
    _write(os.path.join(self.step, "metadata", "metadata"), b'{"n": 64}')
    # Outside the items: not covered.
    _write(os.path.join(self.step, "_CHECKPOINT_METADATA"), b"{}")

  def verify(self, items=("state", "metadata")):
    return checksums.verify(self.step, items, "checkpoint step 8")

  def test_crc32c_is_the_castagnoli_checksum(self):
    path = os.path.join(self.step, "state", "d", "a")
    with open(path, "rb") as f:
      expected = google_crc32c.value(f.read())
    self.assertEqual(checksums.file_crc32c(path), f"{expected:08x}")
    # The check value of CRC-32C ("123456789" -> e3069283).
    _write(os.path.join(self.step, "check"), b"123456789")
    self.assertEqual(
        checksums.file_crc32c(os.path.join(self.step, "check")), "e3069283"
    )

  def test_written_manifest_verifies_and_covers_the_items_only(self):
    size = checksums.write(self.step, ("state", "metadata"))
    self.assertEqual(size, 100_000 + 11 + 9)
    with open(
        os.path.join(self.step, checksums.MANIFEST), encoding="utf-8"
    ) as f:
      manifest = json.load(f)
    self.assertEqual(
        sorted(manifest["files"]),
        ["metadata/metadata", "state/_METADATA", "state/d/a"],
    )
    self.assertEqual(self.verify(), checksums.VERIFIED)
    # Files outside the items may change (orbax rewrites its own).
    _write(os.path.join(self.step, "_CHECKPOINT_METADATA"), b'{"t": 2}')
    self.assertEqual(self.verify(), checksums.VERIFIED)

  def test_progress_counts_files_and_bytes_and_is_quiet_when_short(self):
    lines = []
    ticks = iter(range(0, 1000, 20))  # Each reading of the clock 20 s on.
    reporter = progress.Reporter(
        progress.Lines(lines.append),
        interval_s=30.0,
        clock=lambda: float(next(ticks)),
    )
    checksums.write(self.step, ("state", "metadata"), reporter, "step 8")
    # Files in sorted order: metadata/metadata (9 bytes) at 20 s, then
    # state/_METADATA (11) at 40 s: a line; state/d/a at 60 s: none (20 s
    # after the line); the last line at 80 s.
    self.assertEqual(
        lines,
        [
            "step 8: 20 B of 100.0 kB (0%), 0 B/s, 40 s elapsed, ETA 55h"
            " 33m; files 2/3",
            "step 8: done, 100.0 kB in 1m 20s (1.3 kB/s); files 3/3",
        ],
    )
    del lines[:]
    self.assertEqual(
        checksums.verify(self.step, ("state",), "step 8", reporter),
        checksums.VERIFIED,
    )
    self.assertEqual(
        lines,
        [
            "step 8: verifying: 100.0 kB of 100.0 kB (100%), 2.5 kB/s, 40 s"
            " elapsed, ETA 0 s; files 2/2",
            "step 8: verifying: done, 100.0 kB in 1m 00s (1.7 kB/s); files"
            " 2/2",
        ],
    )
    # Short (a clock that does not move): nothing at all.
    del lines[:]
    still = progress.Reporter(progress.Lines(lines.append), clock=lambda: 0.0)
    checksums.write(self.step, ("state", "metadata"), still, "step 8")
    self.assertEqual(self.verify(), checksums.VERIFIED)
    self.assertEqual(lines, [])

  def test_no_manifest_is_unverified(self):
    self.assertEqual(self.verify(), checksums.UNVERIFIED)

  def test_each_damage_is_one_line_naming_the_file(self):
    cases = [
        (
            "flipped bytes",
            lambda data: self._flip(data, 4096),
            "{data} is damaged (crc32c ",
        ),
        (
            "truncated",
            lambda data: os.truncate(data, 50_000),
            "{data} has 50000 bytes, 100000 recorded at save",
        ),
        (
            "missing",
            os.remove,
            "{data} is missing (listed in checksums.json)",
        ),
        (
            "added",
            lambda data: _write(data + "2", b"x"),
            "{data}2 is not in its checksums.json",
        ),
        (
            "manifest not JSON",
            lambda data: _write(
                os.path.join(self.step, checksums.MANIFEST), b"{not json"
            ),
            "checksums.json is unreadable",
        ),
    ]
    for name, damage, expected in cases:
      with self.subTest(name):
        self.step = self.create_tempdir().full_path
        data = os.path.join(self.step, "state", "d", "a")
        _write(data, os.urandom(100_000))
        checksums.write(self.step, ("state", "metadata"))
        self.assertEqual(self.verify(), checksums.VERIFIED)
        damage(data)
        with self.assertRaises(checksums.ChecksumError) as caught:
          self.verify()
        message = str(caught.exception)
        self.assertNotIn("\n", message)
        self.assertStartsWith(message, "checkpoint step 8: ")
        self.assertIn(expected.format(data=data), message)

  def test_a_reader_verifies_only_its_items(self):
    checksums.write(self.step, ("state", "metadata"))
    self._flip(os.path.join(self.step, "metadata", "metadata"), 1)
    self.assertEqual(self.verify(("state",)), checksums.VERIFIED)
    with self.assertRaisesRegex(checksums.ChecksumError, "metadata/metadata"):
      self.verify(("metadata",))

  def _flip(self, path: str, every: int) -> None:
    with open(path, "r+b") as f:
      data = bytearray(f.read())
      for i in range(0, len(data), every):
        data[i] ^= 0xFF
      f.seek(0)
      f.write(data)


if __name__ == "__main__":
  absltest.main()
