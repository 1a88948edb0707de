r"""Benchmark: peak host memory of tools/import_checkpoint on a deep model.

Runbook:

  tools/bazel run //tools/benchmarks:import_bench
  tools/bazel run //tools/benchmarks:import_bench -- --fp8
  # Other shapes: --layers, --emb_dim, --mlp_dim, --vocab, --shards.

Writes a random Llama-shaped Hugging Face directory (bfloat16, `--shards`
safetensors files with their index, written tensor by tensor with
`maxtext.hf.safetensors_io`; with --fp8 the attention and MLP matrices are
float8_e4m3fn with a float32 `weight_scale_inv` per 128x128 block and
config.json's `quantization_config`, as DeepSeek-V3 publishes its weights,
which the import dequantises with `maxtext.hf.fp8`), then runs
`//tools:import_checkpoint` on it in a child process, twice: on that model
and on a one-layer model of the same widths (the floor: Python, JAX and
orbax themselves, and the largest unstacked tensor). The child's peak
resident set size comes from `getrusage(RUSAGE_CHILDREN)` after each child
ends. The last line is:

  import_bench: format=bfloat16|fp8 layers=L model_bytes=B imported_bytes=I \
      peak_rss=R floor_rss=F ratio=R/B

where B is the safetensors files' size, I the imported float32
parameters' bytes, and ratio the peak RSS over the model's bytes.
"""

import json
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import ml_dtypes
import numpy as np

from maxtext.hf import fp8
from maxtext.hf import llama
from maxtext.hf import safetensors_io
from testing import runfiles

_LAYERS = flags.DEFINE_integer("layers", 32, "Decoder layers.")
_EMB = flags.DEFINE_integer("emb_dim", 512, "hidden_size.")
_MLP = flags.DEFINE_integer("mlp_dim", 1536, "intermediate_size.")
_VOCAB = flags.DEFINE_integer("vocab", 32000, "vocab_size.")
_SHARDS = flags.DEFINE_integer("shards", 4, "safetensors files.")
_FP8 = flags.DEFINE_bool(
    "fp8", False, "Store the matrices as block-scaled float8_e4m3fn."
)
_HEADS, _KV_HEADS, _HEAD_DIM = 8, 2, 64


class _Random:
  """A random tensor (`mean` + `scale` x standard normal, in `dtype`:
  bfloat16 by default) made when the writer asks for it."""

  def __init__(
      self, shape, seed, dtype=ml_dtypes.bfloat16, scale=0.02, mean=0.0
  ):
    self.shape, self.seed = tuple(shape), seed
    self.scale, self.mean = scale, mean
    self.dtype = np.dtype(dtype)

  def __array__(self, dtype=None, copy=None):
    del dtype, copy
    rng = np.random.default_rng(self.seed)
    values = self.scale * rng.standard_normal(self.shape, np.float32)
    return (values + np.float32(self.mean)).astype(self.dtype)


# FP8 weights span e4m3's range (|x| <= 448); their scales bring them back
# to the bfloat16 model's 0.02.
_FP8_SPREAD = 64.0


def _tensors(shapes: dict[str, tuple[int, ...]], fp8_matrices: bool):
  """The writer's tensors for `shapes`: the projections (and with
  `fp8_matrices` their scales) in FP8, the rest in bfloat16."""
  tensors = {}
  for name, shape in shapes.items():
    seed = hash(name) % 2**32
    if fp8_matrices and "_proj." in name:
      tensors[name] = _Random(shape, seed, fp8.FP8, _FP8_SPREAD)
      tensors[name + fp8.SCALE_SUFFIX] = _Random(
          fp8.scale_shape(shape, fp8.DEFAULT_BLOCK),
          seed + 1,
          np.float32,
          scale=0.0,
          mean=0.02 / _FP8_SPREAD,
      )
    else:
      tensors[name] = _Random(shape, seed)
  return tensors


def _hf_shapes(layers: int) -> dict[str, tuple[int, ...]]:
  """Every tensor's name and shape in a model of `layers` layers."""
  e, m, v, d = _EMB.value, _MLP.value, _VOCAB.value, _HEAD_DIM
  shapes = {
      "model.embed_tokens.weight": (v, e),
      "model.norm.weight": (e,),
      "lm_head.weight": (v, e),
  }
  per_layer = {
      "input_layernorm.weight": (e,),
      "post_attention_layernorm.weight": (e,),
      "self_attn.q_proj.weight": (_HEADS * d, e),
      "self_attn.k_proj.weight": (_KV_HEADS * d, e),
      "self_attn.v_proj.weight": (_KV_HEADS * d, e),
      "self_attn.o_proj.weight": (e, _HEADS * d),
      "mlp.gate_proj.weight": (m, e),
      "mlp.up_proj.weight": (m, e),
      "mlp.down_proj.weight": (e, m),
  }
  for i in range(layers):
    for suffix, shape in per_layer.items():
      shapes[f"model.layers.{i}.{suffix}"] = shape
  return shapes


def write_model(
    path: str, layers: int, shards: int, fp8_matrices: bool = False
) -> int:
  """Writes the random model; returns its safetensors files' bytes."""
  os.makedirs(path)
  config = {
      "architectures": [llama.ARCHITECTURE],
      "model_type": "llama",
      "vocab_size": _VOCAB.value,
      "hidden_size": _EMB.value,
      "intermediate_size": _MLP.value,
      "num_hidden_layers": layers,
      "num_attention_heads": _HEADS,
      "num_key_value_heads": _KV_HEADS,
      "head_dim": _HEAD_DIM,
      "max_position_embeddings": 2048,
      "rms_norm_eps": 1e-5,
      "rope_theta": 500000.0,
      "tie_word_embeddings": False,
  }
  if fp8_matrices:
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(fp8.DEFAULT_BLOCK),
    }
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f)
  names = sorted(_tensors(_hf_shapes(layers), fp8_matrices).items())
  weight_map, total = {}, 0
  for s in range(shards):
    part = dict(names[s::shards])
    file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    safetensors_io.write(os.path.join(path, file), part)
    total += os.path.getsize(os.path.join(path, file))
    weight_map.update({n: file for n in part})
  with open(
      os.path.join(path, "model.safetensors.index.json"), "w", encoding="utf-8"
  ) as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  return total


def _import_peak_rss(hf_dir: str, output_dir: str) -> int:
  """Runs the import in a fresh child; its peak RSS in bytes."""
  command = runfiles.binary_command("tools/import_checkpoint")
  script = (
      "import resource, subprocess, sys\n"
      "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
      "sys.stderr.write(done.stderr[-2000:] if done.returncode else '')\n"
      "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
      "sys.exit(done.returncode)\n"
  )
  done = subprocess.run(
      [sys.executable, "-c", script]
      + command
      + [f"--input={hf_dir}", f"--output_dir={output_dir}"],
      env=runfiles.binary_environ(command),
      capture_output=True,
      text=True,
      check=False,
  )
  if done.returncode:
    raise RuntimeError(f"import_checkpoint failed: {done.stderr}")
  return int(done.stdout.split()[-1]) * 1024  # ru_maxrss is in KiB.


def _dir_bytes(path: str) -> int:
  return sum(
      os.path.getsize(os.path.join(root, f))
      for root, _, files in os.walk(path)
      for f in files
  )


def main(argv):
  """Writes both models, imports each in a child, prints the figures."""
  del argv
  with tempfile.TemporaryDirectory(prefix="import_bench_") as tmp:
    layers = _LAYERS.value
    model_bytes = write_model(
        os.path.join(tmp, "hf"), layers, _SHARDS.value, _FP8.value
    )
    write_model(os.path.join(tmp, "hf_floor"), 1, 1, _FP8.value)
    peak = _import_peak_rss(os.path.join(tmp, "hf"), os.path.join(tmp, "out"))
    imported = _dir_bytes(os.path.join(tmp, "out"))
    floor = _import_peak_rss(
        os.path.join(tmp, "hf_floor"), os.path.join(tmp, "out_floor")
    )
  mib = 1 << 20
  kind = "fp8" if _FP8.value else "bfloat16"
  print(f"model ({kind} safetensors): {model_bytes / mib:.1f} MiB")
  print(f"imported checkpoint on disk:  {imported / mib:.1f} MiB")
  print(f"import peak RSS:              {peak / mib:.1f} MiB")
  print(f"one-layer import peak RSS:    {floor / mib:.1f} MiB")
  print(
      f"import_bench: format={kind} layers={layers} "
      f"model_bytes={model_bytes} "
      f"imported_bytes={imported} peak_rss={peak} floor_rss={floor} "
      f"ratio={peak / model_bytes:.3f}"
  )


if __name__ == "__main__":
  app.run(main)
