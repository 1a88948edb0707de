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
    with self.assertRaisesRegex(safetensors_io.FormatError, "header of"):
      safetensors_io.SafetensorsFile(path)


if __name__ == "__main__":
  absltest.main()
