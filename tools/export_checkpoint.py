"""Exports a run's checkpoint as a Hugging Face model directory.

  tools/bazel run //tools:export_checkpoint -- --run_dir=/runs/llama32_ft \\
      --output_dir=/models/llama32_ft --dtype=bfloat16
  tools/bazel run //tools:export_checkpoint -- --run_dir=/runs/dsv3_ft \\
      --output_dir=/models/dsv3_ft --dtype=bfloat16

writes config.json and model.safetensors, which
`transformers.AutoModelForCausalLM.from_pretrained("/models/llama32_ft")`
loads: dense grouped-query models as LlamaForCausalLM, those with per-head
q/k norms (qk_norm) as Qwen3ForCausalLM, grouped-query mixture-of-experts
models as Qwen3MoeForCausalLM, multi-head latent attention
mixture-of-experts models as DeepseekV3ForCausalLM, the Gated DeltaNet
hybrid (full_attention_interval > 0) as Qwen3_5MoeForCausalLM. --step picks
a checkpoint (default: the newest); --dtype is the tensors' dtype (bfloat16
or float32, default float32). The run's tokenizer files (those of the
imported checkpoint it started from, or of its prepared data) are copied
beside them, and the output says which. A bad input (a model neither
family can hold names the field) is one line, exit status 2, and
--output_dir (absent or empty) stays untouched.

While it writes, stderr says how far it is (bytes and tensors written,
GB/s, ETA, the shard being written): on a terminal one line redrawn,
otherwise a line every --progress_interval_s seconds, and the last line:

  export_checkpoint: writing: done, 16.1 GB in 1m 52s (143.8 MB/s);
      tensors 291/291, shard model-00004-of-00004.safetensors

(one line; the figures are illustrative). Restoring the checkpoint first
logs its verification and its restore the same way (docs/checkpoints.md).
"""

from absl import app
from absl import flags

from maxtext.core import caller_paths
from maxtext.core import progress
from maxtext.hf import exporter
from maxtext.hf import tokenizer_files
from maxtext.generation import generate
from tools import command_line

_RUN_DIR = flags.DEFINE_string("run_dir", None, "The run directory.")
_STEP = flags.DEFINE_integer(
    "step", None, "Checkpoint step to export; default: the newest."
)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Hugging Face model directory to write."
)
_DTYPE = flags.DEFINE_string(
    "dtype", "float32", f"Tensor dtype: one of {list(exporter.DTYPES)}."
)
_PROGRESS_S = flags.DEFINE_float(
    "progress_interval_s",
    10.0,
    "Seconds between progress lines on stderr when it is not a terminal.",
)
_MAX_SHARD_BYTES = flags.DEFINE_integer(
    "max_shard_bytes",
    exporter.DEFAULT_MAX_SHARD_BYTES,
    "The most tensor bytes in one safetensors shard (Hugging Face's 5 GB by "
    "default); more than one shard comes with model.safetensors.index.json.",
)


def _export() -> None:
  """Loads the run and exports it; ValueError for bad input."""
  if _DTYPE.value not in exporter.DTYPES:
    raise ValueError(
        f"--dtype={_DTYPE.value!r}: must be one of {list(exporter.DTYPES)}"
    )
  reporter = progress.Reporter(progress.stderr(), _PROGRESS_S.value)
  if _MAX_SHARD_BYTES.value < 1:
    raise ValueError(
        f"--max_shard_bytes={_MAX_SHARD_BYTES.value}: must be >= 1"
    )
  run = generate.load_run(
      caller_paths.resolve_local_path(_RUN_DIR.value), _STEP.value
  )
  output_dir = caller_paths.resolve_local_path(_OUTPUT_DIR.value)
  start = run.paths.load_parameters_path or ""
  selection = tokenizer_files.for_export(
      run.run_dir,
      caller_paths.resolve_local_path(start) if start else "",
      run.tokenizer.path if run.tokenizer else None,
  )
  exporter.export_checkpoint(
      run.config,
      run.params,
      output_dir,
      _DTYPE.value,
      selection.files,
      max_shard_bytes=_MAX_SHARD_BYTES.value,
      progress=reporter,
  )
  for line in selection.notes:
    print(f"export_checkpoint: {line}")
  for name, source in selection.files.items():
    print(f"export_checkpoint: copied {name} from {source}")
  print(f"export_checkpoint: step {run.step} of {run.run_dir} -> {output_dir}")


def main(argv: list[str]) -> None:
  command_line.check(argv, _RUN_DIR, _OUTPUT_DIR)
  with command_line.user_errors("export_checkpoint"):
    _export()


if __name__ == "__main__":
  app.run(main)
