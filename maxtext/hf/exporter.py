"""Exports a run's checkpoint as a Hugging Face Llama model directory.

`export_checkpoint(run, output_dir, dtype)` writes `config.json`
(`llama.hf_config`) and `model.safetensors` (with this package's writer, no
torch), loadable by `transformers.AutoModelForCausalLM.from_pretrained`.
Each tensor is converted to Hugging Face's layout when the file is
written, one at a time, so the process holds the parameters and one
tensor more. Tied embeddings write no `lm_head.weight`.
"""

import json
import os
import shutil
import tempfile
from typing import Any

import jax
import numpy as np

from maxtext.hf import llama
from maxtext.hf import safetensors_io

DTYPES = ("bfloat16", "float32")


class _Converted:
  """One Hugging Face tensor, converted when the writer asks for it."""

  def __init__(self, leaf: Any, tensor: llama.Tensor, dtype: np.dtype):
    self._leaf, self._tensor = leaf, tensor
    self.dtype = dtype
    shape = leaf.shape[1:] if tensor.layer is not None else leaf.shape
    self.shape = tuple(tensor.layout.hf_shape(tuple(shape)))
    self.size = int(np.prod(self.shape))

  def __array__(self, dtype=None, copy=None):
    del dtype, copy
    leaf = self._leaf
    if self._tensor.layer is not None:
      leaf = leaf[self._tensor.layer]
    return np.ascontiguousarray(
        self._tensor.layout.to_hf(np.asarray(jax.device_get(leaf))),
        dtype=self.dtype,
    )


def export_checkpoint(config, params, output_dir: str, dtype: str) -> None:
  """Writes `params` of the dense model `config` as a Hugging Face model.

  Args:
    config: the run's config (a dense grouped-query model).
    params: its parameters (`transformer.init_params`' structure).
    output_dir: absent or empty directory to write.
    dtype: "bfloat16" or "float32".

  Raises:
    ValueError: a bad dtype, a model Llama cannot hold, or a non-empty
      `output_dir`; one line.
  """
  if dtype not in DTYPES:
    raise ValueError(f"--dtype={dtype!r}: must be one of {list(DTYPES)}")
  if config.num_experts or config.attention_type != "gqa":
    raise ValueError(
        "only dense grouped-query models export as Llama; this run has "
        f"attention_type={config.attention_type!r}, "
        f"num_experts={config.num_experts}"
    )
  output_dir = os.path.abspath(output_dir)
  if os.path.exists(output_dir) and (
      not os.path.isdir(output_dir) or os.listdir(output_dir)
  ):
    raise ValueError(f"--output_dir {output_dir}: exists and is not empty")
  np_dtype = safetensors_io.DTYPES["BF16" if dtype == "bfloat16" else "F32"]
  tensors = {}
  for t in llama.tensors(params):
    leaf = params
    for key in t.path:
      leaf = leaf[key]
    tensors[t.hf_name] = _Converted(leaf, t, np_dtype)
  parent = os.path.dirname(output_dir)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(
      prefix=os.path.basename(output_dir) + ".exporting-", dir=parent
  )
  try:
    safetensors_io.write(
        os.path.join(staging, "model.safetensors"),
        tensors,
        metadata={"format": "pt"},
    )
    with open(os.path.join(staging, "config.json"), "w", encoding="utf-8") as f:
      json.dump(llama.hf_config(config, dtype), f, indent=2)
    if os.path.isdir(output_dir):
      os.rmdir(output_dir)
    os.rename(staging, output_dir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
