"""Block-scaled FP8 tensors: written as safetensors F8_E4M3, read back
dequantised, and bad scales refused with one line."""

import json
import os

from absl.testing import absltest
import ml_dtypes
import numpy as np

from maxtext.hf import fp8
from maxtext.hf import hf_directory
from maxtext.hf import safetensors_io


def _quantize(weight: np.ndarray, block):
  """(fp8 weight, scale_inv): each block scaled so its largest magnitude is
  the FP8 maximum (448), as DeepSeek-V3's checkpoint does."""
  rows, cols = weight.shape
  scale = np.ones(fp8.scale_shape(weight.shape, block), np.float32)
  quantized = np.zeros(weight.shape, np.float32)
  for i in range(scale.shape[0]):
    for j in range(scale.shape[1]):
      r = slice(i * block[0], min((i + 1) * block[0], rows))
      c = slice(j * block[1], min((j + 1) * block[1], cols))
      scale[i, j] = np.abs(weight[r, c]).max() / 448.0
      quantized[r, c] = weight[r, c] / scale[i, j]
  return quantized.astype(ml_dtypes.float8_e4m3fn), scale


class Fp8Test(absltest.TestCase):

  def _directory(self, tensors, block=(128, 128)):
    """An HfDirectory of one shard holding `tensors`, FP8 with `block`."""
    path = self.create_tempdir().full_path
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
      json.dump(
          {
              "quantization_config": {
                  "quant_method": "fp8",
                  "fmt": "e4m3",
                  "weight_block_size": list(block),
              }
          },
          f,
      )
    safetensors_io.write(os.path.join(path, "model.safetensors"), tensors)
    return hf_directory.HfDirectory(path)

  def test_dequantize_broadcasts_each_scale_over_its_block(self):
    weight = np.full((5, 7), 2.0, ml_dtypes.float8_e4m3fn)
    scale = np.array([[1.0, 10.0], [100.0, 1000.0]], np.float32)
    out = fp8.dequantize(weight, scale, (3, 4))
    self.assertEqual(out.dtype, np.float32)
    np.testing.assert_array_equal(out[:3, :4], 2.0)
    np.testing.assert_array_equal(out[:3, 4:], 20.0)
    np.testing.assert_array_equal(out[3:, :4], 200.0)
    np.testing.assert_array_equal(out[3:, 4:], 2000.0)

  def test_round_trip_through_safetensors(self):
    rng = np.random.default_rng(0)
    # Ragged edges: neither dimension a multiple of the block; the blocks'
    # magnitudes differ by orders of magnitude.
    weight = rng.normal(size=(300, 200)).astype(np.float32)
    weight[:128] *= 1e-3
    weight[:, 128:] *= 50.0
    quantized, scale = _quantize(weight, (128, 128))
    norm = np.ones(200, ml_dtypes.bfloat16)
    hf = self._directory(
        {
            "w.weight": quantized,
            "w.weight_scale_inv": scale,
            "norm.weight": norm,
        }
    )
    self.assertEqual(hf.dtype("w.weight"), fp8.FP8)
    fp8.check(hf, "w.weight")
    fp8.check(hf, "norm.weight")
    out = fp8.read(hf, "w.weight")
    self.assertEqual(out.dtype, np.float32)
    # e4m3 keeps 3 mantissa bits: relative error at most 2^-4 per element
    # (elements far below their block's maximum lose more; compare to it).
    for rows in (slice(0, 128), slice(128, 300)):
      for cols in (slice(0, 128), slice(128, 200)):
        block_max = np.abs(weight[rows, cols]).max()
        err = np.abs(out[rows, cols] - weight[rows, cols]).max()
        self.assertLessEqual(err, block_max / 16)
    # Exactly the stored value times its block's scale.
    np.testing.assert_array_equal(
        out[200, 150],
        np.float32(quantized[200, 150].astype(np.float32) * scale[1, 1]),
    )
    # A tensor that is not FP8 is read as stored.
    self.assertEqual(fp8.read(hf, "norm.weight").dtype, ml_dtypes.bfloat16)

  def test_missing_scale_is_one_line(self):
    quantized, _ = _quantize(np.ones((130, 10), np.float32), (128, 128))
    hf = self._directory({"w.weight": quantized})
    with self.assertRaisesRegex(
        fp8.Fp8Error,
        r"model.safetensors: tensor w.weight is FP8 but w.weight_scale_inv "
        r"is missing \(expected shape \(2, 1\)\)$",
    ):
      fp8.check(hf, "w.weight")

  def test_misshapen_scale_is_one_line(self):
    quantized, _ = _quantize(np.ones((130, 10), np.float32), (128, 128))
    hf = self._directory(
        {
            "w.weight": quantized,
            "w.weight_scale_inv": np.ones((1, 1), np.float32),
        }
    )
    with self.assertRaisesRegex(
        fp8.Fp8Error, r"w.weight_scale_inv has shape \(1, 1\), .* \(2, 1\)$"
    ):
      fp8.check(hf, "w.weight")


if __name__ == "__main__":
  absltest.main()
