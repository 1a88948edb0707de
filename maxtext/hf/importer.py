"""Imports a Hugging Face checkpoint as a `load_parameters_path`.

The families (config.json's `architectures`): LlamaForCausalLM
(`maxtext.hf.llama`), DeepseekV3ForCausalLM (`maxtext.hf.deepseek`, FP8
weights dequantised by `maxtext.hf.fp8`), Qwen3ForCausalLM and
Qwen3MoeForCausalLM (`maxtext.hf.qwen3`), Qwen3_5MoeForCausalLM and
Qwen3_5MoeForConditionalGeneration (`maxtext.hf.qwen35`: the text model;
the vision tower and multi-token-prediction layers are left out, one log
line each).

`import_checkpoint(input_dir, output_dir, values)` writes `output_dir` as a
checkpoint directory of this project (`maxtext.storage.checkpointing`):
step 0 holds the "state" item {"params": ...}, which
`checkpointing.restore_params_only` reads, so a run starts from it with
`--config.load_parameters_path=output_dir`. Beside it, `config.py` (a
`get_config()` file usable with `--config=`) states the model fields, and
`config.json` records the run config's values (`values`, or base.py's
config with the model fields config.json gives) as a run directory does,
with `checkpoint_directory` naming `output_dir` itself, so
`tools/generate --run_dir=output_dir` samples from the imported model.
Every shape is checked against the model's settings (`ModelConfig`) of
those values, which the import returns. The model's tokenizer files
(`maxtext.hf.tokenizer_files.FILES`: those present) are copied beside
them, and the log says which; an export of a run started from the import
writes them back.

Everything is checked before anything is written: config.json, every
shard's header (a truncated shard is found there), every tensor's presence
and shape. A problem is one `ConversionError` line naming the file or
tensor (and both shapes), and `output_dir` is left untouched.

Memory: each shard is memory-mapped; each parameter is assembled in a
scratch file one layer (or one block of rows) at a time, then handed to
orbax as a read-only memory map that orbax writes without copying, one
parameter at a time, releasing its pages once written. The process holds
about one parameter and orbax's write buffers, not the model
(tools/benchmarks/import_bench measures it).
"""

import asyncio
from collections.abc import Iterator
import contextlib
import json
import mmap
import os
import re
import shutil
from typing import Any, Callable, Mapping, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from maxtext.core import progress as progress_lib
from maxtext.config import config_lib
from maxtext.hf import config_json
from maxtext.hf import deepseek
from maxtext.hf import fp8
from maxtext.hf import hf_directory
from maxtext.hf import llama
from maxtext.hf import qwen3
from maxtext.hf import qwen35
from maxtext.hf import staging as staging_lib
from maxtext.hf import tokenizer_files
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.storage import checkpointing
from maxtext.storage import run_dir
from maxtext.storage import run_record

CONFIG_FILE = "config.py"
# Rows of an unstacked matrix copied at a time (embedding, unembedding).
_ROW_BLOCK = 4096


class ConversionError(ValueError):
  """Bad input to a conversion: one line naming the file, tensor or field."""


def config_file_text(fields: dict[str, Any], source: str) -> str:
  """A config file (`get_config()`) setting `fields` over base.py."""
  lines = [
      f'"""Model fields of the Hugging Face checkpoint {source}.',
      "",
      "Written by tools/import_checkpoint; start a run from the imported",
      "parameters with --config=<this file>",
      "--config.load_parameters_path=<this file's directory>.",
      '"""',
      "",
      "import ml_collections",
      "",
      "from maxtext.configs import base",
      "",
      "",
      "def get_config() -> ml_collections.ConfigDict:",
      '  """base.py with the imported model\'s fields."""',
      "  config = base.get_config()",
  ]
  lines += [f"  config.{key} = {value!r}" for key, value in fields.items()]
  lines += ["  return config", ""]
  return "\n".join(lines)


# config.json's architecture -> its conversion module.
FAMILIES = {
    llama.ARCHITECTURE: llama,
    deepseek.ARCHITECTURE: deepseek,
    **{name: qwen3 for name in qwen3.ARCHITECTURES},
    **{name: qwen35 for name in qwen35.ARCHITECTURES},
}


def family(hf_config, source: str):
  """The conversion module of config.json `hf_config` (at `source`)."""
  architectures = hf_config.get("architectures") or [
      hf_config.get("model_type")
  ]
  for name in architectures:
    if name in FAMILIES:
      return FAMILIES[name]
  raise ConversionError(
      f"{source}: architecture {architectures[0]!r} is not supported "
      f"(supported: {', '.join(FAMILIES)})"
  )


def plan(
    hf: hf_directory.HfDirectory, config: model_config.ModelConfig
) -> tuple[Any, list]:
  """(abstract params, tensors) after checking every tensor's presence and
  shape (and an FP8 tensor's scale) against the model's settings `config`;
  raises ConversionError on the first problem."""
  source = os.path.join(hf.path, "config.json")
  module = family(hf.config, source)
  if module is llama and (config.num_experts or config.attention_type != "gqa"):
    raise ConversionError(
        f"config: a {llama.ARCHITECTURE} checkpoint needs a dense "
        f"grouped-query model; got attention_type={config.attention_type!r}, "
        f"num_experts={config.num_experts}"
    )
  if module is deepseek and (
      not config.num_experts or config.attention_type != "mla"
  ):
    raise ConversionError(
        f"config: a {deepseek.ARCHITECTURE} checkpoint needs an MLA "
        f"mixture-of-experts model; got "
        f"attention_type={config.attention_type!r}, "
        f"num_experts={config.num_experts}"
    )
  if module is qwen3 and (not config.qk_norm or config.attention_type != "gqa"):
    raise ConversionError(
        f"config: a Qwen3 checkpoint needs a grouped-query model with "
        f"qk_norm=True; got attention_type={config.attention_type!r}, "
        f"qk_norm={config.qk_norm}"
    )
  if module is qwen35 and not config.full_attention_interval:
    raise ConversionError(
        "config: a Qwen3.5-MoE checkpoint needs the Gated DeltaNet layer "
        "pattern; got full_attention_interval=0"
    )
  _check_layer_count(hf, config)
  try:
    abstract = transformer.abstract_params(config)
  except ValueError as e:
    raise ConversionError(f"config: {e}") from None
  if module is llama:
    planned = llama.tensors(abstract)
  elif module is qwen3:
    planned = qwen3.tensors(abstract, config)
  elif module is qwen35:
    planned = qwen35.tensors(abstract, config, qwen35.prefix(hf.config, source))
  else:
    planned = deepseek.tensors(abstract, config, hf.config)
  tensors = []
  try:
    # Each tensor is checked as the plan names it: the first problem is
    # found before the rest of the plan is built.
    for t in planned:
      _check_tensor(hf, abstract, t)
      tensors.append(t)
  except llama.UnsupportedError as e:
    raise ConversionError(f"config: {e}") from None
  return abstract, tensors


_LAYER = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\.")


def _check_layer_count(
    hf: hf_directory.HfDirectory, config: model_config.ModelConfig
) -> None:
  """Refuses a config with more layers than the tensors hold, before the
  plan (one entry per layer and tensor) is built."""
  held = {
      int(m.group(1)) for m in map(_LAYER.match, hf.names()) if m is not None
  }
  if config.num_layers > len(held):
    raise ConversionError(
        f"{hf.path}: the config has {config.num_layers} layers "
        f"(num_hidden_layers / num_layers) but the tensors hold {len(held)}"
    )


def _left_out(hf: hf_directory.HfDirectory, module, name: str) -> bool:
  """Whether the import leaves tensor `name` out knowingly (its family's
  notes say so): a Qwen3.5 vision tower or multi-token-prediction layers,
  DeepSeek's multi-token-prediction layers, an output projection tied to
  the embedding."""
  if module is qwen35 and name.startswith(("model.visual.", "mtp.")):
    return True
  if module is deepseek:
    first = int(hf.config.get("num_hidden_layers") or 0)
    extra = int(hf.config.get("num_nextn_predict_layers") or 0)
    match = _LAYER.match(name)
    if match is not None and first <= int(match.group(1)) < first + extra:
      return True
  return name == "lm_head.weight" and bool(hf.config.get("tie_word_embeddings"))


def check_unused(
    hf: hf_directory.HfDirectory, module, tensors, allow: bool, log
) -> None:
  """Refuses (or, when `allow`, warns about) tensors the import would not
  read and does not leave out knowingly: a bias the model has no place
  for, layers past the config's count, another model's tensors.

  Raises:
    ConversionError: one line naming how many, the first few and the flag.
  """
  used = {t.hf_name for t in tensors}
  used |= {name + fp8.SCALE_SUFFIX for name in used}
  unused = sorted(
      name
      for name in hf.names()
      if name not in used and not _left_out(hf, module, name)
  )
  if not unused:
    return
  shown = ", ".join(unused[:3]) + (", ..." if len(unused) > 3 else "")
  text = (
      f"{hf.path}: {len(unused)} tensor(s) the model has no place for "
      f"({shown})"
  )
  if not allow:
    raise ConversionError(
        f"{text}: another architecture or more layers than the config's? "
        "(--allow_unused_tensors imports without them)"
    )
  log(f"warning: {text} are not imported (allow_unused_tensors)")


def _check_tensor(hf: hf_directory.HfDirectory, abstract, t) -> None:
  """Raises ConversionError if tensor `t` is missing or of another shape."""
  leaf = abstract
  for key in t.path:
    leaf = leaf[key]
  shape = leaf.shape
  if t.layer is not None:
    shape = shape[1:]
  if t.expert is not None:
    shape = shape[1:]
  wanted = tuple(t.layout.hf_shape(tuple(shape)))
  if not hf.has(t.hf_name):
    raise ConversionError(
        f"{hf.path}: tensor {t.hf_name} missing (expected shape {wanted})"
    )
  if tuple(hf.shape(t.hf_name)) != wanted:
    raise ConversionError(
        f"{hf.file_of(t.hf_name)}: tensor {t.hf_name} has shape "
        f"{tuple(hf.shape(t.hf_name))}, the config expects {wanted}"
    )
  try:
    fp8.check(hf, t.hf_name)
  except fp8.Fp8Error as e:
    raise ConversionError(str(e)) from None


class _OneAtATimeNumpyHandler(ocp.type_handlers.NumpyHandler):
  """orbax's NumPy array handler, writing one array at a time, in place.

  orbax's default deep-copies every host array before its background write
  and writes them all at once, which would bring the whole model into
  memory. The arrays saved here are read-only memory maps: each is written
  without a copy, one after the other, and its pages are released from
  this process once written.
  """

  def __init__(self, job: progress_lib.Progress, arrays: int):
    super().__init__(deepcopy_host_arrays=False)
    self._lock = None
    self._job = job
    self._arrays = arrays
    self._written = 0

  async def _open_and_write(self, value, tspec, ts_context):
    if self._lock is None:
      self._lock = asyncio.Lock()  # Made inside orbax's event loop.
    async with self._lock:
      await super()._open_and_write(value, tspec, ts_context)
      mapping = getattr(value, "_mmap", None)
      if mapping is not None:
        mapping.madvise(mmap.MADV_DONTNEED)
      self._written += 1
      self._job.advance(
          value.nbytes, f"parameters {self._written}/{self._arrays}"
      )


@contextlib.contextmanager
def _numpy_arrays_saved_one_at_a_time(
    job: progress_lib.Progress, arrays: int
) -> Iterator[None]:
  """Registers `_OneAtATimeNumpyHandler` for the block (each array written
  moves `job` on, of `arrays`), then puts orbax's default NumPy handler
  back."""
  previous = ocp.type_handlers.get_type_handler(np.ndarray)
  ocp.type_handlers.register_type_handler(
      np.ndarray, _OneAtATimeNumpyHandler(job, arrays), override=True
  )
  try:
    yield
  finally:
    ocp.type_handlers.register_type_handler(np.ndarray, previous, override=True)


def _fill(path: str, shape, dtype, blocks: Callable[[], Any]) -> np.ndarray:
  """Writes the blocks (arrays, in row-major order) to `path` and returns
  the file as a read-only memory map of `shape`."""
  with open(path, "wb") as f:
    for block in blocks():
      np.ascontiguousarray(block, dtype=dtype).tofile(f)
  return np.memmap(path, dtype=dtype, mode="r", shape=tuple(shape))


def _finite(hf, name: str, block: np.ndarray, allow: bool) -> np.ndarray:
  """`block` of tensor `name`, refused if it holds NaN or Inf (unless
  `allow`): an imported model of non-finite weights generates nothing."""
  if not allow and not np.isfinite(block).all():
    raise ConversionError(
        f"{hf.file_of(name)}: tensor {name} holds non-finite values (NaN "
        "or Inf, after conversion to the config's dtype); pass "
        "--allow_non_finite to import it anyway"
    )
  return block


def _tensor_bytes(hf: hf_directory.HfDirectory, name: str) -> int:
  """Bytes of tensor `name` in its shard."""
  return int(np.prod(hf.shape(name))) * hf.dtype(name).itemsize


class _Converting:
  """The conversion's progress: the Hugging Face tensors read, of all."""

  def __init__(self, reporter: progress_lib.Reporter, hf, tensors):
    self._hf = hf
    self._count = len(tensors)
    self._read = 0
    self.job = reporter.start(
        "import_checkpoint: converting",
        sum(_tensor_bytes(hf, t.hf_name) for t in tensors),
        progress_lib.BYTES,
    )

  def read(self, name: str) -> None:
    """Tensor `name` is converted."""
    self._read += 1
    self.job.advance(
        _tensor_bytes(self._hf, name),
        f"tensors {self._read}/{self._count}, shard "
        f"{os.path.basename(self._hf.file_of(name))}",
    )


def _leaf_blocks(hf, tensors, leaf, dtype, converting, allow_non_finite=False):
  """The blocks of one parameter, in order: one per layer of a stack, or
  row blocks of an unstacked matrix; each checked to be finite. Each
  tensor read is told to `converting`."""
  if tensors[0].layer is not None:
    experts = tensors[0].expert is not None
    shape = tuple(leaf.shape[2:] if experts else leaf.shape[1:])
    for t in sorted(tensors, key=lambda t: (t.layer, t.expert or 0)):
      block = t.layout.to_project(fp8.read(hf, t.hf_name), shape).astype(dtype)
      yield _finite(hf, t.hf_name, block, allow_non_finite)
      converting.read(t.hf_name)
    return
  (t,) = tensors
  array = t.layout.to_project(fp8.read(hf, t.hf_name), tuple(leaf.shape))
  for start in range(0, max(array.shape[0], 1), _ROW_BLOCK):
    block = np.asarray(array[start : start + _ROW_BLOCK]).astype(dtype)
    yield _finite(hf, t.hf_name, block, allow_non_finite)
  converting.read(t.hf_name)


def _write_parameters(
    hf: hf_directory.HfDirectory,
    abstract,
    tensors,
    staging: str,
    input_dir: str,
    allow_non_finite: bool,
    progress: progress_lib.Reporter,
) -> str:
  """Converts the tensors into parameters (scratch files) and saves them as
  step 0 of a checkpoint directory in `staging`; returns that directory.

  Both steps report their progress: the tensors read (bytes of their
  shards, the current shard), then the parameters written.
  """
  scratch = os.path.join(staging, "scratch")
  os.mkdir(scratch)
  by_leaf = {}
  for t in tensors:
    by_leaf.setdefault(t.path, []).append(t)
  params = jax.tree_util.tree_map(lambda x: x, abstract)  # A copy to fill.
  converting = _Converting(progress, hf, tensors)
  with converting.job:
    for path, group in by_leaf.items():
      node = params
      for key in path[:-1]:
        node = node[key]
      leaf = node[path[-1]]
      # Each parameter in its own dtype (weight_dtype; float32 for the
      # router bias).
      dtype = np.dtype(leaf.dtype)
      node[path[-1]] = _fill(
          os.path.join(scratch, "_".join(path)),
          leaf.shape,
          dtype,
          lambda g=group, l=leaf, d=dtype: _leaf_blocks(
              hf, g, l, d, converting, allow_non_finite
          ),
      )
  leaves = jax.tree_util.tree_leaves(params)
  checkpoint_dir = os.path.join(staging, "checkpoint")
  with (
      progress.start(
          "import_checkpoint: writing",
          sum(leaf.nbytes for leaf in leaves),
          progress_lib.BYTES,
      ) as writing,
      _numpy_arrays_saved_one_at_a_time(writing, len(leaves)),
      checkpointing.Checkpointer(
          checkpoint_dir, save_period=1, max_to_keep=0
      ) as checkpointer,
  ):
    checkpointer.save(
        0,
        {"params": params},
        {"source": os.path.abspath(input_dir)},
        force=True,
    )
  return checkpoint_dir


def import_checkpoint(
    input_dir: str,
    output_dir: str,
    values: Optional[Mapping[str, Any]] = None,
    log: Callable[[str], None] = print,
    allow_non_finite: bool = False,
    progress: progress_lib.Reporter = progress_lib.SILENT,
    allow_unused_tensors: bool = False,
) -> model_config.ModelConfig:
  """Converts the Hugging Face model at `input_dir` into `output_dir`.

  Args:
    input_dir: a directory with config.json and *.safetensors (and
      model.safetensors.index.json when sharded).
    output_dir: where the checkpoint goes: absent or an empty directory.
    values: the run config to check every shape against and to record, by
      field name (`config_lib.to_json_dict`); None = base.py's config with
      the model fields config.json gives (logged, and written as
      config.py).
    log: where the derived fields are printed.
    allow_non_finite: import tensors holding NaN or Inf; by default the
      first such tensor is refused (after the checks above: the weights
      are read only while they are converted, into a staging directory
      that is removed).
    progress: where the conversion's and the write's progress goes.
    allow_unused_tensors: import a directory holding tensors the model
      has no place for (warned about); by default refused.

  Returns:
    The model's settings the parameters were written for.

  Raises:
    ConversionError: bad input, before anything is written.
  """
  output_dir = _checked_output(output_dir)
  hf, module, fields = _read_source(input_dir)
  values = _checked_values(values, fields, input_dir, log)
  try:
    model = model_config.ModelConfig.from_config(values)
  except ValueError as e:
    raise ConversionError(f"config: {e}") from None
  abstract, tensors = plan(hf, model)
  check_unused(hf, module, tensors, allow_unused_tensors, log)
  _log_notes(module, hf, log)

  staging = staging_lib.make(output_dir, "importing", log)
  try:
    checkpoint_dir = _write_parameters(
        hf, abstract, tensors, staging, input_dir, allow_non_finite, progress
    )
    _write_sources(checkpoint_dir, hf, fields, input_dir)
    _copy_tokenizer(input_dir, checkpoint_dir, log)
    _write_run_record(checkpoint_dir, values, input_dir, output_dir)
    if os.path.isdir(output_dir):
      os.rmdir(output_dir)
    os.rename(checkpoint_dir, output_dir)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return model


def _checked_output(output_dir: str) -> str:
  """`output_dir` resolved, checked to be absent or an empty directory.

  Raises:
    ConversionError: it is not; one line.
  """
  # Resolved up front: a symbolic link to an empty directory is replaced
  # by the finished checkpoint where it points.
  output_dir = staging_lib.resolve(output_dir)
  try:
    staging_lib.check_output(output_dir)
  except ValueError as e:
    raise ConversionError(str(e)) from None
  return output_dir


def _log_notes(module, hf, log: Callable[[str], None]) -> None:
  """Logs the parts of the model `hf` that the import leaves out, one line
  each, where its family `module` (DeepSeek-V3, Qwen3.5-MoE) names them."""
  if module is deepseek:
    for line in deepseek.notes(hf.config):
      log(line)
  if module is qwen35:
    for line in qwen35.notes(hf.config, hf.names()):
      log(line)


def _read_source(input_dir: str):
  """The Hugging Face directory, its family's module and the model fields
  its config.json gives.

  Raises:
    ConversionError: naming the file and the field or format problem.
  """
  try:
    hf = hf_directory.HfDirectory(input_dir)
  except hf_directory.FormatError as e:
    raise ConversionError(str(e)) from None
  source = os.path.join(input_dir, "config.json")
  try:
    config_json.check(hf.config, source)
    module = family(hf.config, source)
    fields = module.config_fields(hf.config, source)
  except KeyError as e:
    raise ConversionError(f"{source}: field {e.args[0]} missing") from None
  except (TypeError, ValueError) as e:
    # UnsupportedError and config_json's errors name the file already.
    text = str(e)
    raise ConversionError(
        text if text.startswith(source) else f"{source}: {text}"
    ) from None
  return hf, module, fields


def _checked_values(
    values: Optional[Mapping[str, Any]],
    fields: dict,
    input_dir: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
  """The run config's values the import writes for, by field name.

  Without `values`, those of base.py's config with config.json's `fields`
  (`config_lib.base_with`; each field logged); with them, `values`
  themselves, with a warning for each field that differs from
  config.json's without changing a shape (shapes are checked by the plan).

  Raises:
    ConversionError: fields no config can be derived from.
  """
  source = os.path.join(input_dir, "config.json")
  if values is None:
    try:
      values = config_lib.to_json_dict(config_lib.base_with(fields))
    except (TypeError, ValueError) as e:
      raise ConversionError(f"{source}: {e}") from None
    for key, value in fields.items():
      log(f"config.{key} = {value!r}")
    return values
  for key, value in fields.items():
    if key != "max_sequence_length" and values[key] != value:
      log(
          f"warning: config.{key} = {values[key]!r} but config.json gives "
          f"{value!r}"
      )
  return dict(values)


def _write_sources(
    checkpoint_dir: str,
    hf: hf_directory.HfDirectory,
    fields: dict,
    input_dir: str,
) -> None:
  """Writes beside the parameters the config file of the derived fields and
  the source's config.json."""
  with open(
      os.path.join(checkpoint_dir, CONFIG_FILE), "w", encoding="utf-8"
  ) as f:
    f.write(config_file_text(fields, os.path.abspath(input_dir)))
  with open(
      os.path.join(checkpoint_dir, "hf_config.json"), "w", encoding="utf-8"
  ) as f:
    json.dump(hf.config, f, indent=2)


def _write_run_record(
    checkpoint_dir: str,
    values: Mapping[str, Any],
    input_dir: str,
    output_dir: str,
) -> None:
  """Writes the run's config record (its `values` by field name) beside the
  parameters, its checkpoint directory `output_dir`, naming the source it
  was imported from."""
  run_dir.write_config_json(
      os.path.join(checkpoint_dir, run_record.CONFIG_JSON),
      config_lib.to_json_dict(dict(values, checkpoint_directory=output_dir)),
      {"imported_from": os.path.abspath(input_dir)},
  )


def _copy_tokenizer(
    input_dir: str, checkpoint_dir: str, log: Callable[[str], None]
) -> None:
  """Copies the tokenizer files `input_dir` holds; logs which, or none."""
  copied = tokenizer_files.copy(
      {
          n: os.path.join(input_dir, n)
          for n in tokenizer_files.present(input_dir)
      },
      checkpoint_dir,
  )
  log(
      f"tokenizer files copied: {', '.join(copied)}"
      if copied
      else f"no tokenizer files in {input_dir} (looked for "
      f"{', '.join(tokenizer_files.FILES)})"
  )
