"""Tests of the safetensors reader and writer against the format's layout."""

import json
import os
import struct

from absl.testing import absltest
import ml_dtypes
import numpy as np

from maxtext.hf import safetensors_io


class SafetensorsTest(absltest.TestCase):

  def _write(self, tensors):
    path = os.path.join(self.create_tempdir().full_path, "m.safetensors")
    safetensors_io.write(path, tensors, metadata={"format": "pt"})
    return path

  def test_round_trip_keeps_dtypes_shapes_and_values(self):
    rng = np.random.default_rng(0)
    tensors = {
        "b": rng.standard_normal((3, 5)).astype(np.float32),
        "a": rng.standard_normal((7,)).astype(ml_dtypes.bfloat16),
        "c": np.arange(6, dtype=np.int64).reshape(2, 3),
    }
    f = safetensors_io.SafetensorsFile(self._write(tensors))
    self.assertEqual(f.names(), ["a", "b", "c"])
    self.assertEqual(f.metadata, {"format": "pt"})
    for name, array in tensors.items():
      self.assertEqual(f.shape(name), array.shape)
      self.assertEqual(f.dtype(name), array.dtype)
      np.testing.assert_array_equal(np.asarray(f.array(name)), array)

  def test_layout_is_the_formats(self):
    path = self._write({"x": np.array([1.0, 2.0], np.float32)})
    with open(path, "rb") as f:
      data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    self.assertEqual(length % 8, 0)
    header = json.loads(data[8 : 8 + length])
    self.assertEqual(
        header["x"], {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    )
    self.assertEqual(
        np.frombuffer(data[8 + length :], "<f4").tolist(), [1.0, 2.0]
    )

  def test_truncated_file_names_the_tensor(self):
    path = self._write(
        {
            "first": np.zeros((4,), np.float32),
            "last": np.zeros((4,), np.float32),
        }
    )
    os.truncate(path, os.path.getsize(path) - 4)
    with self.assertRaisesRegex(
        safetensors_io.FormatError, f"{path}: truncated: tensor last ends"
    ):
      safetensors_io.SafetensorsFile(path)

  def test_cut_header_is_an_error(self):
    path = self._write({"x": np.zeros((4,), np.float32)})
    os.truncate(path, 12)
    with self.assertRaisesRegex(
        safetensors_io.FormatError, "header length runs past the end"
    ):
      safetensors_io.SafetensorsFile(path)

  def _raw(self, header, data: bytes) -> str:
    """A file of `header` (any JSON value) and `data`, as the format lays
    them out."""
    path = os.path.join(self.create_tempdir().full_path, "m.safetensors")
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
      f.write(struct.pack("<Q", len(text)) + text + data)
    return path

  def test_header_problems_are_one_line_naming_the_file_and_tensor(self):

    def f32(begin, end, shape=(4,)):
      return {
          "dtype": "F32",
          "shape": list(shape),
          "data_offsets": [begin, end],
      }

    data = bytes(range(32))
    cases = {
        # Before any check of its own, a negative begin read header bytes.
        "negative offset": (
            {"a": f32(-16, 0), "b": f32(0, 16), "c": f32(16, 32)},
            "tensor a: data_offsets [-16, 0] are not [begin, end] with 0 <= "
            "begin <= end",
        ),
        "same bytes twice": (
            {"a": f32(0, 16), "b": f32(0, 16), "c": f32(16, 32)},
            "tensor b (bytes 0-16) overlaps tensor a",
        ),
        "a gap": (
            {"a": f32(0, 8, (2,)), "b": f32(16, 32)},
            "tensor b starts at byte 16, leaving bytes 8-16 of the data unused",
        ),
        "trailing bytes": (
            {"a": f32(0, 16)},
            "the tensors end at byte 16 of 32 bytes of data (trailing bytes)",
        ),
        "a list header": ([1, 2], "the header is a JSON list, not an object"),
        "a list entry": ({"a": [0, 32]}, "tensor a: header entry is a list"),
        "an int dtype": (
            {"a": {"dtype": 5, "shape": [8], "data_offsets": [0, 32]}},
            "tensor a: unsupported dtype 5",
        ),
        "a list dtype": (
            {"a": {"dtype": ["F32"], "shape": [8], "data_offsets": [0, 32]}},
            "tensor a: unsupported dtype ['F32']",
        ),
        "no shape": (
            {"a": {"dtype": "F32", "data_offsets": [0, 32]}},
            "tensor a: header entry has no 'shape'",
        ),
        "a string shape": (
            {"a": {"dtype": "F32", "shape": "8", "data_offsets": [0, 32]}},
            "tensor a: shape '8' is not a list of non-negative integers",
        ),
        "float offsets": (
            {"a": {"dtype": "F32", "shape": [8], "data_offsets": [0.0, 32]}},
            "tensor a: data_offsets [0.0, 32] are not [begin, end]",
        ),
        "metadata of numbers": (
            {"__metadata__": {"n": 1}, "a": f32(0, 32, (8,))},
            "__metadata__ is not an object of strings",
        ),
    }
    for name, (header, expected) in cases.items():
      with self.subTest(name):
        path = self._raw(header, data)
        with self.assertRaises(safetensors_io.FormatError) as caught:
          safetensors_io.SafetensorsFile(path)
        message = str(caught.exception)
        self.assertNotIn("\n", message)
        self.assertIn(f"{path}: {expected}", message)

  def test_a_file_that_is_not_safetensors_does_not_print_its_bytes(self):
    path = os.path.join(self.create_tempdir().full_path, "passwd")
    with open(path, "w", encoding="utf-8") as f:
      f.write("root:x:0:0:root:/root:/bin/bash\n")
    with self.assertRaises(safetensors_io.FormatError) as caught:
      safetensors_io.SafetensorsFile(path)
    message = str(caught.exception)
    self.assertNotIn("root", message.replace(path, ""))
    (length,) = struct.unpack("<Q", b"root:x:0")
    self.assertNotIn(str(length), message)


if __name__ == "__main__":
  absltest.main()
