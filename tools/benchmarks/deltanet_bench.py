r"""Benchmark: the Gated DeltaNet layer chunked against a per-token scan.

Runbook:

  tools/bazel run //tools/benchmarks:deltanet_bench
  tools/bazel run //tools/benchmarks:deltanet_bench -- --tokens=4096 \
      --chunk_size=64 --repeats=3

Runs one `maxtext.model.gated_deltanet` layer (random weights, float32) on
`--batch` sequences of `--tokens` tokens two ways: `apply` as training runs
it (the delta rule in chunks of `--chunk_size`, a scan over chunks) and
`apply(recurrent=True)` (a `lax.scan` over the tokens, one rank-one update
each). Each way is timed compiled, forward alone and forward + backward
(the gradient of a sum of the outputs with respect to the input and every
parameter), the best of `--repeats` after one warm-up call; compile time is
not counted. The two outputs are compared too (their largest difference
relative to the output's scale is printed), so a fast wrong form shows.

The last line is:

  deltanet_bench: tokens=T chunk=C forward_chunked_ms=F1
      forward_recurrent_ms=F2 forward_ratio=F2/F1 grad_chunked_ms=G1
      grad_recurrent_ms=G2 grad_ratio=G2/G1 max_rel_diff=D

(ratio > 1: the chunked form is that many times faster.)
"""

import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from maxtext.model import gated_deltanet

_TOKENS = flags.DEFINE_integer("tokens", 4096, "Tokens per sequence.")
_BATCH = flags.DEFINE_integer("batch", 1, "Sequences.")
_CHUNK = flags.DEFINE_integer("chunk_size", 64, "The chunked form's chunk.")
_EMB = flags.DEFINE_integer("emb_dim", 512, "Model width.")
_KEY_HEADS = flags.DEFINE_integer("key_heads", 2, "Query/key heads.")
_VALUE_HEADS = flags.DEFINE_integer("value_heads", 4, "Value heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 128, "Key and value head width.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per figure (best).")


class _Config:
  """The fields `gated_deltanet` reads."""

  def __init__(self):
    self.emb_dim = _EMB.value
    self.norm_epsilon = 1e-6
    self.linear_num_key_heads = _KEY_HEADS.value
    self.linear_num_value_heads = _VALUE_HEADS.value
    self.linear_key_head_dim = _HEAD_DIM.value
    self.linear_value_head_dim = _HEAD_DIM.value
    self.linear_conv_kernel_dim = 4
    self.linear_chunk_size = _CHUNK.value


def _best_ms(fn, *args) -> float:
  jax.block_until_ready(fn(*args))  # Compiles and warms up.
  times = []
  for _ in range(_REPEATS.value):
    began = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - began)
  return min(times) * 1e3


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _Config()
  keys = iter(jax.random.split(jax.random.PRNGKey(0), 16))

  def normal(shape, fan_in):
    return jax.random.normal(next(keys), shape) / fan_in**0.5

  params = jax.tree.map(
      lambda p: p[0],
      gated_deltanet.init_params(config, 1, normal, jnp.float32),
  )
  x = jax.random.normal(
      next(keys), (_BATCH.value, _TOKENS.value, config.emb_dim)
  )

  def forward(recurrent):
    return jax.jit(
        lambda x, p: gated_deltanet.apply(x, p, config, recurrent=recurrent)[0]
    )

  def grad(recurrent):
    def loss(x, p):
      out, _ = gated_deltanet.apply(x, p, config, recurrent=recurrent)
      return jnp.sum(out)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))

  chunked_out = forward(False)(x, params)
  recurrent_out = forward(True)(x, params)
  scale = float(jnp.max(jnp.abs(recurrent_out)))
  diff = float(jnp.max(jnp.abs(chunked_out - recurrent_out))) / scale
  figures = {}
  for name, make in (("forward", forward), ("grad", grad)):
    for form, recurrent in (("chunked", False), ("recurrent", True)):
      figures[f"{name}_{form}"] = _best_ms(make(recurrent), x, params)
      print(f"{name} {form}: {figures[f'{name}_{form}']:.1f} ms", flush=True)
  print(
      f"deltanet_bench: tokens={_TOKENS.value} chunk={_CHUNK.value} "
      f"forward_chunked_ms={figures['forward_chunked']:.1f} "
      f"forward_recurrent_ms={figures['forward_recurrent']:.1f} "
      f"forward_ratio="
      f"{figures['forward_recurrent'] / figures['forward_chunked']:.2f} "
      f"grad_chunked_ms={figures['grad_chunked']:.1f} "
      f"grad_recurrent_ms={figures['grad_recurrent']:.1f} "
      f"grad_ratio={figures['grad_recurrent'] / figures['grad_chunked']:.2f} "
      f"max_rel_diff={diff:.1e}"
  )


if __name__ == "__main__":
  app.run(main)
