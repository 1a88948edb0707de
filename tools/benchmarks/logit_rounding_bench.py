r"""Benchmark: how far the compute dtype moves a model's top-2 logits.

Runbook:

  tools/bazel run //tools/benchmarks:logit_rounding_bench -- \
      --config.compute_dtype=bfloat16
  # Other models: --config=<file>, any --config.x override; other sizes:
  # --rows, --length (0 = max_sequence_length), --seed.

One randomly initialised model (`--config`, by default
configs/decode_bench.py) runs over `--rows` sequences of `--length` random
ids twice: in its compute dtype and in float32 at the highest matmul
precision. At each position the float32 pass's two best ids a and b have a
logit difference; the table gives percentiles of how far the compute dtype's
pass moves it, in units of eps * max(|l_a|, |l_b|)
(`maxtext.generation.greedy_agreement.rounding_errors`), the unit of the
greedy agreement rule, whose bound (`ROUNDING_ULPS`) the last line gives:

  logit_rounding_bench: max=E bound=K
"""

import os

from absl import app
from absl import flags
import jax
from ml_collections import config_flags
import numpy as np

from maxtext.configs import decode_bench
from maxtext.generation import greedy_agreement
from maxtext.model import model_config
from maxtext.model import transformer

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.abspath(decode_bench.__file__),
    "Model config (default: configs/decode_bench.py).",
    lock_config=True,
)
_ROWS = flags.DEFINE_integer("rows", 4, "Sequences.")
_LENGTH = flags.DEFINE_integer(
    "length", 256, "Ids per sequence (0 = max_sequence_length)."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the parameters and ids.")


def main(argv: list[str]) -> None:
  """Measures the errors and prints their percentiles and the bound."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = model_config.of(_CONFIG.value)
  length = _LENGTH.value or config.max_sequence_length
  if _ROWS.value < 1 or not 1 <= length <= config.max_sequence_length:
    raise app.UsageError(
        f"--rows={_ROWS.value} must be >= 1 and --length={length} in 1.."
        f"{config.max_sequence_length} (max_sequence_length)"
    )
  params = jax.jit(lambda k: transformer.init_params(config, k))(
      jax.random.PRNGKey(_SEED.value)
  )
  tokens = np.random.default_rng(_SEED.value).integers(
      0, config.vocab_size, (_ROWS.value, length)
  )
  errors = greedy_agreement.rounding_errors(params, config, tokens)
  print(
      f"logit_rounding_bench: {transformer.num_params(params) / 1e6:.1f}M "
      f"parameters ({config.num_layers} layers, emb {config.emb_dim}, vocab "
      f"{config.vocab_size}), {config.compute_dtype} against float32, "
      f"{errors.size} positions, {jax.devices()[0].platform}"
  )
  print(
      "top-2 difference error, units of eps * max(|l_a|, |l_b|): "
      + ", ".join(f"p{q} {np.percentile(errors, q):.3f}" for q in (50, 90, 99))
  )
  print(
      f"logit_rounding_bench: max={np.max(errors):.3f} "
      f"bound={greedy_agreement.ROUNDING_ULPS}"
  )


if __name__ == "__main__":
  app.run(main)
