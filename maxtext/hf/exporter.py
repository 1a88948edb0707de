"""Exports a run's checkpoint as a Hugging Face model directory.

`export_checkpoint(config, params, output_dir, dtype)` writes `config.json`
and `model.safetensors` (with this package's writer, no torch), loadable by
`transformers.AutoModelForCausalLM.from_pretrained`: a dense grouped-query
model as LlamaForCausalLM (`maxtext.hf.llama`), a multi-head latent
attention mixture-of-experts model as DeepseekV3ForCausalLM
(`maxtext.hf.deepseek`), each through the same tensor table its import
reads. A config the family cannot hold is refused with one line naming the
field, before anything is written.

Each tensor is cut from its stacked `[layers, (experts,) ...]` parameter
and converted to Hugging Face's layout when the file is written, one at a
time, so the process holds the parameters and one tensor more. Tied
embeddings write no `lm_head.weight`. The tensors are in the dtype asked
for, except DeepSeek's router correction bias, which stays float32 (as the
model and the published checkpoint keep it). `tokenizer_files` (name ->
path, `maxtext.hf.tokenizer_files.for_export`) are copied beside them.
"""

import json
import os
import shutil
import tempfile
from typing import Any, Mapping, Optional

import jax
import numpy as np

from maxtext.hf import deepseek
from maxtext.hf import llama
from maxtext.hf import safetensors_io
from maxtext.hf import tokenizer_files as tokenizer_files_lib

DTYPES = ("bfloat16", "float32")
# Parameters written in float32 whatever the dtype asked for.
_FLOAT32 = ("router_bias",)


class _Converted:
  """One Hugging Face tensor, converted when the writer asks for it."""

  def __init__(self, leaf: Any, tensor: llama.Tensor, dtype: np.dtype):
    self._leaf, self._tensor = leaf, tensor
    self.dtype = dtype
    shape = leaf.shape
    if tensor.layer is not None:
      shape = shape[1:]
    if tensor.expert is not None:
      shape = shape[1:]
    self.shape = tuple(tensor.layout.hf_shape(tuple(shape)))
    self.size = int(np.prod(self.shape))

  def __array__(self, dtype=None, copy=None):
    del dtype, copy
    leaf = self._leaf
    if self._tensor.layer is not None:
      leaf = leaf[self._tensor.layer]
    if self._tensor.expert is not None:
      leaf = leaf[self._tensor.expert]
    return np.ascontiguousarray(
        self._tensor.layout.to_hf(np.asarray(jax.device_get(leaf))),
        dtype=self.dtype,
    )


def family(config):
  """The conversion module that holds the model `config`: DeepSeek-V3 for
  latent attention or experts, Llama otherwise."""
  if config.attention_type == "mla" or config.num_experts:
    return deepseek
  return llama


def hf_config_and_tensors(config, params, dtype: str):
  """(config.json document, the Hugging Face tensors) of `params`.

  Raises:
    ValueError: a config the family cannot hold; one line naming the field.
  """
  module = family(config)
  try:
    document = module.hf_config(config, dtype)
    if module is deepseek:
      tensors = list(deepseek.tensors(params, config, document))
    else:
      if config.attention_type != "gqa":
        raise llama.UnsupportedError(
            f"config.attention_type={config.attention_type!r}: a "
            f"{llama.ARCHITECTURE} has grouped-query attention"
        )
      tensors = list(llama.tensors(params))
  except llama.UnsupportedError as e:
    raise ValueError(str(e)) from None
  return document, tensors


def export_checkpoint(
    config,
    params,
    output_dir: str,
    dtype: str,
    tokenizer_files: Optional[Mapping[str, str]] = None,
) -> None:
  """Writes `params` of the model `config` as a Hugging Face model.

  Args:
    config: the run's config.
    params: its parameters (`transformer.init_params`' structure).
    output_dir: absent or empty directory to write.
    dtype: "bfloat16" or "float32".
    tokenizer_files: files to copy into `output_dir` (name -> path).

  Raises:
    ValueError: a bad dtype, a model neither family can hold, or a
      non-empty `output_dir`; one line.
  """
  if dtype not in DTYPES:
    raise ValueError(f"--dtype={dtype!r}: must be one of {list(DTYPES)}")
  document, hf_tensors = hf_config_and_tensors(config, params, dtype)
  output_dir = os.path.abspath(output_dir)
  if os.path.exists(output_dir) and (
      not os.path.isdir(output_dir) or os.listdir(output_dir)
  ):
    raise ValueError(f"--output_dir {output_dir}: exists and is not empty")
  np_dtype = safetensors_io.DTYPES["BF16" if dtype == "bfloat16" else "F32"]
  tensors = {}
  for t in hf_tensors:
    leaf = params
    for key in t.path:
      leaf = leaf[key]
    wanted = np.dtype(np.float32) if t.path[-1] in _FLOAT32 else np_dtype
    tensors[t.hf_name] = _Converted(leaf, t, wanted)
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
      json.dump(document, f, indent=2)
    tokenizer_files_lib.copy(tokenizer_files or {}, staging)
    if os.path.isdir(output_dir):
      os.rmdir(output_dir)
    os.rename(staging, output_dir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
