"""Imports a Hugging Face checkpoint as parameters a run starts from.

LlamaForCausalLM, DeepseekV3ForCausalLM (FP8 weights dequantised; the
multi-token-prediction layers skipped with a warning), Qwen3ForCausalLM,
Qwen3MoeForCausalLM, Qwen3_5MoeForCausalLM and
Qwen3_5MoeForConditionalGeneration (its vision tower and
multi-token-prediction layers skipped with a warning each):
docs/checkpoints.md.

  # Qwen3.5-397B-A17B (the published ForConditionalGeneration layout):
  tools/bazel run //tools:import_checkpoint -- \\
      --input=/models/Qwen3.5-397B-A17B --output_dir=/ckpt/qwen35_397b \\
      --config=maxtext/configs/qwen35_397b_a17b.py

  # Qwen3-8B, its shapes checked against the project's config file:
  tools/bazel run //tools:import_checkpoint -- --input=/models/Qwen3-8B \\
      --output_dir=/ckpt/qwen3_8b --config=maxtext/configs/qwen3_8b.py

  # Derive the model fields from config.json (printed, and written as
  # DIR/config.py), then train from the imported parameters:
  tools/bazel run //tools:import_checkpoint -- \\
      --input=/models/Llama-3.2-1B --output_dir=/ckpt/llama32_1b
  tools/bazel run //maxtext:train_main -- --config=/ckpt/llama32_1b/config.py \\
      --config.load_parameters_path=/ckpt/llama32_1b

  # Check every tensor's shape against an existing config file instead:
  tools/bazel run //tools:import_checkpoint -- --input=/models/Llama-3.1-8B \\
      --output_dir=/ckpt/llama31_8b --config=maxtext/configs/llama31_8b.py

--input holds config.json and one or many *.safetensors (with
model.safetensors.index.json); --output_dir must be absent or empty (a
symbolic link is followed). The parameters are stored in the config's
weight_dtype. Bad input (no config.json, another architecture, a field of
the wrong JSON type, a tensor missing or of another shape, a truncated
shard or a header whose offsets overlap, a shard named outside --input,
NaN or Inf weights unless --allow_non_finite, tensors the model has no place
for, such as a bias or layers past the config's count, unless
--allow_unused_tensors) is one line naming the file
and tensor, exit status 2, and nothing is written to --output_dir.

While it works, stderr says how far it is: the tensors converted (bytes of
the shards, GB/s, ETA, the shard being read), then the parameters written;
on a terminal one line redrawn, otherwise a line every
--progress_interval_s seconds, and each step's last line:

  import_checkpoint: converting: 312.4 GB of 750.0 GB (42%), 1.1 GB/s,
      4m 44s elapsed, ETA 6m 38s; tensors 25112/60042, shard
      model-00040-of-00094.safetensors
  import_checkpoint: converting: done, 750.0 GB in 11m 20s (1.1 GB/s);
      tensors 60042/60042, shard model-00094-of-00094.safetensors
  import_checkpoint: writing: done, 794.1 GB in 9m 02s (1.5 GB/s);
      parameters 1214/1214

(each one line; the figures here are illustrative).
Relative paths resolve against the directory `bazel run` was started from.
"""

from absl import app
from absl import flags

from maxtext.core import caller_paths
from maxtext.core import progress
from maxtext.config import config_lib
from maxtext.hf import importer
from tools import command_line

_INPUT = flags.DEFINE_string(
    "input", None, "Hugging Face model directory (config.json, safetensors)."
)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Checkpoint directory to write (absent or empty)."
)
_ALLOW_NON_FINITE = flags.DEFINE_bool(
    "allow_non_finite",
    False,
    "Import tensors holding NaN or Inf; by default the first is refused.",
)
_PROGRESS_S = flags.DEFINE_float(
    "progress_interval_s",
    10.0,
    "Seconds between progress lines on stderr when it is not a terminal.",
)
_ALLOW_UNUSED_TENSORS = flags.DEFINE_bool(
    "allow_unused_tensors",
    False,
    "Import a directory holding tensors the model has no place for (each "
    "named in a warning); by default refused.",
)
_CONFIG = flags.DEFINE_string(
    "config",
    None,
    "Config file whose model fields every tensor shape is checked against; "
    "default: derived from config.json.",
)


def _import() -> None:
  """Checks the flags, imports, prints the output; ValueError for bad input."""
  reporter = progress.Reporter(progress.stderr(), _PROGRESS_S.value)
  config = None
  if _CONFIG.value:
    path = caller_paths.resolve_local_path(_CONFIG.value)
    try:
      config = config_lib.load_config_file(path)
    except FileNotFoundError as e:
      raise ValueError(f"--config: {e}") from None
    config_lib.validate(config)
  output_dir = caller_paths.resolve_local_path(_OUTPUT_DIR.value)
  importer.import_checkpoint(
      caller_paths.resolve_local_path(_INPUT.value),
      output_dir,
      None if config is None else config_lib.to_json_dict(config),
      allow_non_finite=_ALLOW_NON_FINITE.value,
      progress=reporter,
      allow_unused_tensors=_ALLOW_UNUSED_TENSORS.value,
  )
  print(f"import_checkpoint: wrote {output_dir}")


def main(argv: list[str]) -> None:
  command_line.check(argv, _INPUT, _OUTPUT_DIR)
  with command_line.user_errors("import_checkpoint"):
    _import()


if __name__ == "__main__":
  app.run(main)
