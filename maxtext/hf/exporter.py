"""Exports a run's checkpoint as a Hugging Face model directory.

`export_checkpoint(config, params, output_dir, dtype)` writes `config.json`
and the tensors (with this package's writer, no torch), loadable by
`transformers.AutoModelForCausalLM.from_pretrained`: a dense grouped-query
model as LlamaForCausalLM (`maxtext.hf.llama`), one with per-head q/k
norms (`qk_norm`) as Qwen3ForCausalLM and a grouped-query
mixture-of-experts model as Qwen3MoeForCausalLM (`maxtext.hf.qwen3`), a
multi-head latent attention mixture-of-experts model as
DeepseekV3ForCausalLM (`maxtext.hf.deepseek`), the hybrid Gated DeltaNet
model (`full_attention_interval`) as Qwen3_5MoeForCausalLM
(`maxtext.hf.qwen35`), each through the same
tensor table its import reads. A config the family cannot hold is refused
with one line naming the field, before anything is written.

Each tensor is cut from its stacked `[layers, (experts,) ...]` parameter
and converted to Hugging Face's layout when the file is written, one at a
time, so the process holds the parameters and one tensor more. Tied
embeddings write no `lm_head.weight`. The tensors go into shards of at
most `max_shard_bytes` each (a tensor larger than that alone in its shard),
in name order: one shard is `model.safetensors`; several are
`model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`
(Hugging Face's names, its "weight_map" and "total_size"). The tensors
are in the dtype asked for, except DeepSeek's router correction bias,
which stays float32 (as the model and the published checkpoint keep it).
`tokenizer_files` (name -> path, `maxtext.hf.tokenizer_files.for_export`)
are copied beside them.
"""

import itertools
import json
import os
import shutil
from typing import Any, Callable, Mapping, Optional

import jax
import numpy as np

from maxtext.core import progress as progress_lib
from maxtext.hf import deepseek
from maxtext.hf import hf_directory
from maxtext.hf import llama
from maxtext.hf import qwen3
from maxtext.hf import qwen35
from maxtext.hf import safetensors_io
from maxtext.hf import staging as staging_lib
from maxtext.hf import tokenizer_files as tokenizer_files_lib
from maxtext.model import model_config

DTYPES = ("bfloat16", "float32")
# Hugging Face's default shard size (`save_pretrained(max_shard_size="5GB")`).
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9

# Parameters written in float32 whatever the dtype asked for.
_FLOAT32 = ("router_bias",)


def _qwen35_only(config: model_config.ModelConfig) -> dict[str, tuple]:
  """The model fields only Qwen3.5-MoE's layout holds: field -> (its value
  in `config`, the plain value every other family has)."""
  return {
      "norm_zero_centered": (config.norm_zero_centered, False),
      "attention_output_gate": (config.attention_output_gate, False),
      "partial_rotary_factor": (config.partial_rotary_factor, 1.0),
      "shared_expert_gate": (config.shared_expert_gate, False),
      "shared_expert_mlp_dim": (config.shared_expert_mlp_dim, 0),
  }


class _Converted:
  """One Hugging Face tensor, converted when the writer asks for it: one
  parameter's slice, or the join of several (`llama.Tensor.join_axis`)."""

  def __init__(self, parts: list[tuple[Any, llama.Tensor]], dtype: np.dtype):
    self._parts = parts
    self.dtype = dtype
    leaf, tensor = parts[0]
    shape = leaf.shape
    if tensor.layer is not None:
      shape = shape[1:]
    if tensor.expert is not None:
      shape = shape[1:]
    self.shape = tuple(tensor.layout.hf_shape(tuple(shape)))
    self.size = int(np.prod(self.shape))

  def __array__(self, dtype=None, copy=None):
    del dtype, copy
    arrays = []
    for leaf, tensor in self._parts:
      if tensor.layer is not None:
        leaf = leaf[tensor.layer]
      if tensor.expert is not None:
        leaf = leaf[tensor.expert]
      arrays.append(tensor.layout.to_hf(np.asarray(jax.device_get(leaf))))
    if len(arrays) > 1:
      joined = np.concatenate(arrays, axis=self._parts[0][1].join_axis)
      arrays = [joined.reshape(self.shape)]
    return np.ascontiguousarray(arrays[0], dtype=self.dtype)


def family(config: model_config.ModelConfig):
  """The conversion module that holds the model `config`: DeepSeek-V3 for
  latent attention, Qwen3.5-MoE for the Gated DeltaNet layer pattern,
  Qwen3 for grouped-query attention with per-head q/k norms or experts,
  Llama otherwise."""
  if config.attention_type == "mla":
    return deepseek
  if config.full_attention_interval:
    return qwen35
  if config.qk_norm or config.num_experts:
    return qwen3
  return llama


def hf_config_and_tensors(config: model_config.ModelConfig, params, dtype: str):
  """(config.json document, the Hugging Face tensors) of `params`.

  Raises:
    ValueError: a config the family cannot hold; one line naming the field.
  """
  module = family(config)
  try:
    if module is not qwen35:
      for field, (value, plain) in _qwen35_only(config).items():
        if value != plain:
          raise llama.UnsupportedError(
              f"config.{field}={value!r}: only a "
              f"{qwen35.ARCHITECTURE} (full_attention_interval > 0) holds it"
          )
    document = module.hf_config(config, dtype)
    if module is deepseek:
      tensors = list(deepseek.tensors(params, config, document))
    elif module is qwen3:
      tensors = list(qwen3.tensors(params, config))
    elif module is qwen35:
      tensors = list(qwen35.tensors(params, config))
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
    config: model_config.ModelConfig,
    params,
    output_dir: str,
    dtype: str,
    tokenizer_files: Optional[Mapping[str, str]] = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    log: Callable[[str], None] = print,
    progress: progress_lib.Reporter = progress_lib.SILENT,
) -> None:
  """Writes `params` of the model `config` as a Hugging Face model.

  Args:
    config: the model's config.
    params: its parameters (`transformer.init_params`' structure).
    output_dir: absent or empty directory to write.
    dtype: "bfloat16" or "float32".
    tokenizer_files: files to copy into `output_dir` (name -> path).
    max_shard_bytes: the most tensor bytes in one shard (>= 1).
    log: where the removal of an interrupted export's staging is told.
    progress: where the write's progress goes (tensors and bytes written,
      GB/s, ETA, the shard being written).

  Raises:
    ValueError: a bad dtype or shard size, a model neither family can
      hold, or a non-empty `output_dir`; one line.
  """
  if dtype not in DTYPES:
    raise ValueError(f"--dtype={dtype!r}: must be one of {list(DTYPES)}")
  if max_shard_bytes < 1:
    raise ValueError(f"--max_shard_bytes={max_shard_bytes}: must be >= 1")
  document, hf_tensors = hf_config_and_tensors(config, params, dtype)
  output_dir = staging_lib.resolve(output_dir)
  staging_lib.check_output(output_dir)
  tensors = _converted_tensors(params, hf_tensors, dtype)
  staging = staging_lib.make(output_dir, "exporting", log)
  try:
    _write_shards(staging, tensors, max_shard_bytes, progress)
    with open(os.path.join(staging, "config.json"), "w", encoding="utf-8") as f:
      json.dump(document, f, indent=2)
    tokenizer_files_lib.copy(tokenizer_files or {}, staging)
    if os.path.isdir(output_dir):
      os.rmdir(output_dir)
    os.rename(staging, output_dir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


def _converted_tensors(
    params, hf_tensors: list[llama.Tensor], dtype: str
) -> dict[str, _Converted]:
  """Each Hugging Face tensor of `hf_tensors` by name, from its parameter
  parts in `params`, in `dtype` ("bfloat16" or "float32"; float32 for the
  parameters of _FLOAT32 whatever `dtype` says)."""
  np_dtype = safetensors_io.DTYPES["BF16" if dtype == "bfloat16" else "F32"]
  parts = {}
  for t in hf_tensors:
    leaf = params
    for key in t.path:
      leaf = leaf[key]
    parts.setdefault(t.hf_name, []).append((leaf, t))
  return {
      name: _Converted(
          group,
          (
              np.dtype(np.float32)
              if group[0][1].path[-1] in _FLOAT32
              else np_dtype
          ),
      )
      for name, group in parts.items()
  }


def _nbytes(tensor) -> int:
  """Bytes of a tensor (an object with `shape` and `dtype`)."""
  return int(np.prod(tensor.shape)) * np.dtype(tensor.dtype).itemsize


def shard_names(tensors: Mapping[str, Any], max_shard_bytes: int) -> list:
  """The tensors' names grouped into shards: in name order, a shard closed
  when the next tensor would take it past `max_shard_bytes`."""
  shards, size = [[]], 0
  for name in sorted(tensors):
    nbytes = _nbytes(tensors[name])
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += nbytes
  return shards


def _write_shards(
    directory: str,
    tensors: Mapping[str, Any],
    max_shard_bytes: int,
    progress: progress_lib.Reporter,
) -> None:
  """The safetensors files (and the index, for several) into `directory`."""
  groups = shard_names(tensors, max_shard_bytes)
  if len(groups) == 1:
    files = ["model.safetensors"]
  else:
    n = len(groups)
    files = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
  weight_map = {}
  total = sum(_nbytes(t) for t in tensors.values())
  count = itertools.count(1)
  with progress.start(
      "export_checkpoint: writing", total, progress_lib.BYTES
  ) as job:
    for file, names in zip(files, groups):

      def written(_, nbytes, file=file):
        job.advance(
            nbytes, f"tensors {next(count)}/{len(tensors)}, shard {file}"
        )

      for name in names:
        weight_map[name] = file
      safetensors_io.write(
          os.path.join(directory, file),
          {name: tensors[name] for name in names},
          metadata={"format": "pt"},
          written=written,
      )
  if len(files) > 1:
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    path = os.path.join(directory, hf_directory.INDEX_FILE)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(index, f, indent=2)
