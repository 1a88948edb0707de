"""Block-scaled FP8 weights, as DeepSeek-V3's published checkpoint stores them.

A quantised matrix `W` [out, in] is stored as float8_e4m3fn (safetensors
"F8_E4M3") beside `W_scale_inv` (float32 [ceil(out/B), ceil(in/B)], B = 128,
config.json's `quantization_config.weight_block_size`): the real weight of
element (i, j) is W[i, j] * W_scale_inv[i // B, j // B]. Any other tensor
(norms, the router, the embeddings) is stored in its own dtype.

`read(hf, name)` returns a tensor in float32 when it is FP8 (dequantised),
else as stored; `check(hf, name)` finds a missing or misshapen scale before
anything is converted.
"""

import math

import ml_dtypes
import numpy as np

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
SCALE_SUFFIX = "_scale_inv"
DEFAULT_BLOCK = (128, 128)


class Fp8Error(ValueError):
  """An FP8 tensor without a usable scale; one line naming it."""


def block_size(hf_config) -> tuple[int, int]:
  """(rows, columns) of a scale block, from config.json."""
  quantization = hf_config.get("quantization_config") or {}
  size = quantization.get("weight_block_size") or DEFAULT_BLOCK
  return int(size[0]), int(size[1])


def scale_shape(shape, block) -> tuple[int, int]:
  return (math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))


def dequantize(
    weight: np.ndarray, scale_inv: np.ndarray, block=DEFAULT_BLOCK
) -> np.ndarray:
  """float32 weight * scale_inv, each scale broadcast over its block."""
  rows, cols = weight.shape
  scale = np.asarray(scale_inv, np.float32)
  full = np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)
  return np.asarray(weight).astype(np.float32) * full[:rows, :cols]


def is_fp8(hf, name: str) -> bool:
  return hf.dtype(name) == FP8


def check(hf, name: str) -> None:
  """Raises Fp8Error if FP8 tensor `name` has no scale of the right shape."""
  if not is_fp8(hf, name):
    return
  shape = tuple(hf.shape(name))
  scale = name + SCALE_SUFFIX
  if len(shape) != 2:
    raise Fp8Error(
        f"{hf.file_of(name)}: tensor {name}: FP8 with shape {shape}; only "
        "matrices are block-scaled"
    )
  wanted = scale_shape(shape, block_size(hf.config))
  if not hf.has(scale):
    raise Fp8Error(
        f"{hf.file_of(name)}: tensor {name} is FP8 but {scale} is missing "
        f"(expected shape {wanted})"
    )
  if tuple(hf.shape(scale)) != wanted:
    raise Fp8Error(
        f"{hf.file_of(scale)}: tensor {scale} has shape "
        f"{tuple(hf.shape(scale))}, {name} {shape} needs {wanted}"
    )


def read(hf, name: str) -> np.ndarray:
  """Tensor `name`: dequantised to float32 if FP8, else memory-mapped."""
  array = hf.array(name)
  if array.dtype != FP8:
    return array
  return dequantize(array, hf.array(name + SCALE_SUFFIX), block_size(hf.config))
