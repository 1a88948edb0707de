"""The Megatron .idx/.bin format: every dtype code, the stream, bad files."""

import os
import struct

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.text import megatron_index

_DOCS = [[[5, 6, 7]], [[8, 9], [10]], [[11, 12, 13, 14]]]
_STREAM = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


def _header(
    code=4, sequences=0, documents=1, magic=megatron_index.MAGIC, version=1
):
  return struct.pack("<9sQBQQ", magic, version, code, sequences, documents)


class MegatronIndexTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path
    self.prefix = os.path.join(self.dir, "c4")

  @parameterized.named_parameters(
      (dtype.name, code, dtype) for code, dtype in megatron_index.DTYPES.items()
  )
  def test_every_dtype_code_reads_back(self, code, dtype):
    megatron_index.write(self.prefix, _DOCS, dtype)
    with open(self.prefix + ".idx", "rb") as f:
      self.assertEqual(f.read(9), b"MMIDIDX\x00\x00")
      self.assertEqual(struct.unpack("<Q", f.read(8))[0], 1)
      self.assertEqual(f.read(1)[0], code)
    tokens = megatron_index.open_prefix(self.prefix)
    self.assertEqual(tokens.dtype, dtype)
    self.assertEqual(tokens.num_sequences, 4)
    self.assertEqual(tokens.num_documents, 3)
    self.assertEqual(list(tokens.document_index), [0, 1, 3, 4])
    self.assertEqual(list(tokens.sizes), [3, 2, 1, 4])
    self.assertTrue(tokens.contiguous)
    self.assertEqual(tokens.stream(0, 10).tolist(), _STREAM)
    self.assertEqual(tokens.stream(2, 7).tolist(), _STREAM[2:7])
    self.assertEqual(os.path.getsize(self.prefix + ".bin"), 10 * dtype.itemsize)

  def test_sequences_out_of_order_in_the_bin_read_in_index_order(self):
    # The .bin holds sequence 1 first; the index points at each.
    second, first = np.asarray([20, 21, 22], "<i4"), np.asarray([1, 2], "<i4")
    with open(self.prefix + ".bin", "wb") as f:
      f.write(second.tobytes() + b"\0\0\0\0" + first.tobytes())
    with open(self.prefix + ".idx", "wb") as f:
      f.write(_header(4, 2, 3))
      f.write(np.asarray([2, 3], "<i4").tobytes())
      f.write(np.asarray([16, 0], "<i8").tobytes())
      f.write(np.asarray([0, 1, 2], "<i8").tobytes())
    tokens = megatron_index.open_prefix(self.prefix)
    self.assertFalse(tokens.contiguous)
    self.assertEqual(tokens.stream(0, 5).tolist(), [1, 2, 20, 21, 22])
    self.assertEqual(tokens.stream(1, 4).tolist(), [2, 20, 21])

  def test_checked_in_chunks_as_at_once(self):
    megatron_index.write(self.prefix, _DOCS * 3, np.uint16)
    whole = megatron_index.open_prefix(self.prefix)
    for chunk in (1, 2, 5):
      part = megatron_index.open_prefix(self.prefix, chunk=chunk)
      self.assertTrue(part.contiguous)
      self.assertEqual(part.num_tokens, whole.num_tokens)
      self.assertEqual(part.stream(0, 30).tolist(), _STREAM * 3)
    # A sequence out of place in the third chunk of two entries.
    with open(self.prefix + ".idx", "r+b") as f:
      f.seek(megatron_index.HEADER_BYTES + 4 * 12 + 8 * 5)
      f.write(np.asarray([0], "<i8").tobytes())
    moved = megatron_index.open_prefix(self.prefix, chunk=2)
    self.assertFalse(moved.contiguous)
    # Sequence 5 (stream tokens 13, 14) now reads bytes 0..3: ids 5, 6.
    self.assertEqual(moved.stream(10, 16).tolist(), [5, 6, 7, 5, 6, 10])
    with open(self.prefix + ".bin", "r+b") as f:
      f.truncate(58)
    with self.assertRaisesRegex(
        megatron_index.FormatError, "byte 60, the file has 58"
    ):
      megatron_index.open_prefix(self.prefix, chunk=2)

  def test_first_token_outside_the_vocabulary_in_any_chunk(self):
    megatron_index.write(self.prefix, _DOCS, np.int32)
    tokens = megatron_index.open_prefix(self.prefix)
    for chunk in (1, 3, 100):
      self.assertIsNone(megatron_index.first_outside_vocab(tokens, 15, chunk))
      # Ids 12, 13 and 14 are at stream positions 7, 8 and 9.
      self.assertEqual(
          megatron_index.first_outside_vocab(tokens, 12, chunk), (7, 12)
      )
    megatron_index.write(self.prefix, [[[3, -2, 99]]], np.int8)
    tokens = megatron_index.open_prefix(self.prefix)
    self.assertEqual(megatron_index.first_outside_vocab(tokens, 50), (1, -2))

  def test_a_stream_out_of_order_is_checked_in_index_order(self):
    # The .bin holds sequence 1 (ids 20..22) first; the stream reads
    # sequence 0 (ids 1, 2) first.
    second, first = np.asarray([20, 21, 22], "<i4"), np.asarray([1, 2], "<i4")
    with open(self.prefix + ".bin", "wb") as f:
      f.write(second.tobytes() + np.asarray([77], "<i4").tobytes())
      f.write(first.tobytes())
    with open(self.prefix + ".idx", "wb") as f:
      f.write(_header(4, 2, 3))
      f.write(np.asarray([2, 3], "<i4").tobytes())
      f.write(np.asarray([16, 0], "<i8").tobytes())
      f.write(np.asarray([0, 1, 2], "<i8").tobytes())
    tokens = megatron_index.open_prefix(self.prefix)
    self.assertFalse(tokens.contiguous)
    # 77 lies between the sequences, in no sequence: never read.
    for chunk in (1, 2, 10):
      self.assertIsNone(megatron_index.first_outside_vocab(tokens, 23, chunk))
      self.assertEqual(
          megatron_index.first_outside_vocab(tokens, 21, chunk), (3, 21)
      )

  def test_float_tokens_must_be_whole_ids(self):
    megatron_index.write(self.prefix, [[[1.0, 2.0, 2.5, np.nan]]], np.float32)
    tokens = megatron_index.open_prefix(self.prefix)
    self.assertEqual(megatron_index.first_outside_vocab(tokens, 9), (2, 2.5))
    bad = megatron_index.ids_outside(np.asarray([1.0, np.nan, np.inf]), 9)
    self.assertEqual(bad.tolist(), [False, True, True])

  def test_uint16_ids_against_vocabularies_either_side_of_their_range(self):
    megatron_index.write(self.prefix, [[[65535, 0]]], np.uint16)
    tokens = megatron_index.open_prefix(self.prefix)
    self.assertIsNone(megatron_index.first_outside_vocab(tokens, 65536))
    self.assertEqual(
        megatron_index.first_outside_vocab(tokens, 65535), (0, 65535)
    )

  def test_writer_refuses_a_dtype_without_a_code(self):
    with self.assertRaisesRegex(
        ValueError, "dtype uint32: the Megatron format"
    ):
      megatron_index.write(self.prefix, _DOCS, np.uint32)

  def _broken(self, data: bytes, bin_bytes: bytes = b"\0" * 64):
    with open(self.prefix + ".idx", "wb") as f:
      f.write(data)
    with open(self.prefix + ".bin", "wb") as f:
      f.write(bin_bytes)

  def _assert_one_line(self, path_suffix, pattern):
    with self.assertRaises(megatron_index.FormatError) as caught:
      megatron_index.open_prefix(self.prefix)
    message = str(caught.exception)
    self.assertNotIn("\n", message)
    self.assertTrue(
        message.startswith(self.prefix + path_suffix + ": "), message
    )
    self.assertRegex(message, pattern)

  def test_missing_index(self):
    self._assert_one_line(".idx", "Megatron index .* does not exist")

  def test_missing_bin(self):
    megatron_index.write(self.prefix, _DOCS)
    os.remove(self.prefix + ".bin")
    self._assert_one_line(".bin", "token file .* does not exist")

  def test_not_an_index(self):
    self._broken(b"NOTANIDX" + b"\0" * 40)
    self._assert_one_line(".idx", "not a Megatron index")

  def test_header_cut_short(self):
    self._broken(_header()[:20])
    self._assert_one_line(".idx", "truncated Megatron index: 20 bytes")

  def test_arrays_cut_short(self):
    megatron_index.write(self.prefix, _DOCS)
    with open(self.prefix + ".idx", "rb") as f:
      data = f.read()
    self._broken(data[:-5], b"\0" * 40)
    self._assert_one_line(
        ".idx", "truncated Megatron index: its header says 4 sequences"
    )

  def test_unknown_dtype_code(self):
    self._broken(_header(code=9) + np.asarray([0], "<i8").tobytes())
    self._assert_one_line(".idx", "unknown dtype code 9 .*8 uint16")

  def test_unknown_version(self):
    self._broken(_header(version=2) + np.asarray([0], "<i8").tobytes())
    self._assert_one_line(".idx", "version 2")

  def test_document_index_not_ending_at_the_sequence_count(self):
    megatron_index.write(self.prefix, _DOCS)
    with open(self.prefix + ".idx", "r+b") as f:
      f.seek(-8, os.SEEK_END)
      f.write(np.asarray([3], "<i8").tobytes())
    self._assert_one_line(".idx", "document index must rise from 0")

  def test_bin_shorter_than_the_index_says(self):
    megatron_index.write(self.prefix, _DOCS, np.uint16)
    with open(self.prefix + ".bin", "r+b") as f:
      f.truncate(18)
    self._assert_one_line(
        ".bin", "shorter than its index says: .*byte 20, the file has 18"
    )


if __name__ == "__main__":
  absltest.main()
