r"""Benchmark: generation with the key/value cache against the windowed sampler.

Runbook:

  tools/bazel run //tools/benchmarks:decode_bench
  # Other sizes: --batch, --prompt_len, --new_tokens, --windowed_tokens, and
  # any --config.x override of configs/decode_bench.py.

One process, one randomly initialised model (`--config`, by default
configs/decode_bench.py: ~19M parameters, max_sequence_length 512), `--batch`
prompts of `--prompt_len` random ids, continued greedily two ways:

  cached    `maxtext.generation.decoder.generate`: one prefill, then one
            cached step per token, `--new_tokens` tokens per row.
  windowed  `maxtext.generation.sampling.sample_many`: every token runs the
            model over the whole [batch, max_sequence_length] window. Its cost
            per token does not depend on how many tokens it makes, so it makes
            `--windowed_tokens` (fewer: it is slow) and its ids are checked
            against the cached decoder's first ones. The window is never
            exceeded (prompt + new tokens <= max_sequence_length).

Each is called twice with the same inputs: the first call's compilation time
(JAX's trace, lowering and backend-compile events, summed) is reported, the
second call is timed (wall clock to the ids on the host; it compiles
nothing). The table gives generated tokens (rows x new tokens), seconds,
tokens/s, compile seconds and the cache's bytes (the windowed sampler has
none); for multi-head latent attention, also the bytes per token that a
grouped-query cache of the same width would take. The last line is:

  decode_bench: speedup=S

with S = cached tokens/s / windowed tokens/s.
"""

import os
import threading
import time

from absl import app
from absl import flags
import jax
from jax import monitoring
import ml_collections
from ml_collections import config_flags
import numpy as np

from maxtext.configs import decode_bench
from maxtext.generation import decoder
from maxtext.generation import kv_cache
from maxtext.model import transformer
from maxtext.generation import sampling

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.abspath(decode_bench.__file__),
    "Model config (default: configs/decode_bench.py).",
    lock_config=True,
)
_BATCH = flags.DEFINE_integer("batch", 16, "Prompts generated together.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Ids per prompt.")
_NEW_TOKENS = flags.DEFINE_integer(
    "new_tokens", 128, "Tokens the cached decoder generates per row."
)
_WINDOWED_TOKENS = flags.DEFINE_integer(
    "windowed_tokens", 8, "Tokens the windowed sampler generates per row."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the parameters and prompts.")

_COMPILE_EVENTS = "/jax/core/compile/"


class _CompileSeconds:
  """Sums JAX's compilation-stage durations while `active`."""

  def __init__(self):
    self.active = False
    self.seconds = 0.0
    self._lock = threading.Lock()
    monitoring.register_event_duration_secs_listener(self._on_duration)

  def _on_duration(
      self, event: str, duration_s: float, **unused_kwargs
  ) -> None:
    if self.active and event.startswith(_COMPILE_EVENTS):
      with self._lock:
        self.seconds += duration_s

  def measure(self, fn):
    """(fn's result, compile seconds during it)."""
    self.seconds, self.active = 0.0, True
    try:
      result = fn()
    finally:
      self.active = False
    return result, self.seconds


def _timed(fn):
  """(fn's result, wall-clock seconds of the call)."""
  start = time.perf_counter()
  result = fn()
  return result, time.perf_counter() - start


def _check(config, batch: int, prompt_len: int, new: int, windowed: int):
  """Raises app.UsageError for sizes the two samplers cannot run."""
  if min(batch, prompt_len, new, windowed) < 1:
    raise app.UsageError(
        "--batch, --prompt_len, --new_tokens and --windowed_tokens must be >= 1"
    )
  if windowed > new:
    raise app.UsageError(
        f"--windowed_tokens={windowed} must be <= --new_tokens={new}"
    )
  if prompt_len + new > config.max_sequence_length:
    raise app.UsageError(
        f"--prompt_len={prompt_len} + --new_tokens={new} exceeds "
        f"max_sequence_length {config.max_sequence_length}"
    )


def main(argv: list[str]) -> None:
  """Runs both samplers and prints the table and the closing line."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = ml_collections.FrozenConfigDict(_CONFIG.value)
  batch, prompt_len = _BATCH.value, _PROMPT_LEN.value
  new, windowed = _NEW_TOKENS.value, _WINDOWED_TOKENS.value
  _check(config, batch, prompt_len, new, windowed)
  params = jax.jit(lambda k: transformer.init_params(config, k))(
      jax.random.PRNGKey(_SEED.value)
  )
  rng = np.random.default_rng(_SEED.value)
  prompts = [
      [int(i) for i in rng.integers(0, config.vocab_size, prompt_len)]
      for _ in range(batch)
  ]
  compiles = _CompileSeconds()

  def cached():
    return decoder.generate(
        params, config, prompts, sampling.SamplingOptions(max_new_tokens=new)
    )

  def window():
    return sampling.sample_many(
        params,
        config,
        prompts,
        sampling.SamplingOptions(max_new_tokens=windowed),
    )

  _, cached_compile = compiles.measure(cached)
  generation, cached_s = _timed(cached)
  _, window_compile = compiles.measure(window)
  window_ids, window_s = _timed(window)

  same = int(np.sum(np.all(generation.ids[:, :windowed] == window_ids, axis=1)))
  cached_rate = batch * new / cached_s
  window_rate = batch * windowed / window_s
  print(
      f"decode_bench: {transformer.num_params(params) / 1e6:.1f}M parameters "
      f"(emb {config.emb_dim}, {config.num_layers} layers, "
      f"{config.num_heads}/{config.num_kv_heads} heads of {config.head_dim}, "
      f"vocab {config.vocab_size}, {config.attention_type}), "
      f"max_sequence_length {config.max_sequence_length}, batch {batch}, "
      f"prompt {prompt_len}, greedy, {jax.devices()[0].platform} "
      f"x{jax.device_count()}"
  )
  print(
      f"{'sampler':<10} {'tokens':>7} {'seconds':>9} {'tokens/s':>10} "
      f"{'compile_s':>10} {'cache_bytes':>12}"
  )
  print(
      f"{'cached':<10} {batch * new:>7} {cached_s:>9.3f} {cached_rate:>10.1f} "
      f"{cached_compile:>10.2f} {generation.cache_bytes:>12}"
  )
  print(
      f"{'windowed':<10} {batch * windowed:>7} {window_s:>9.3f} "
      f"{window_rate:>10.1f} {window_compile:>10.2f} {'-':>12}"
  )
  print(
      f"cache: {generation.cache_length} positions x {batch} rows, "
      f"{kv_cache.bytes_per_token(config)} bytes per token"
      + (
          f" ({kv_cache.expanded_bytes_per_token(config)} for grouped-query "
          "attention of the same width)"
          if config.attention_type == "mla"
          else ""
      )
  )
  print(f"same ids: {same}/{batch} rows agree on the first {windowed} tokens")
  print(f"decode_bench: speedup={cached_rate / window_rate:.1f}")


if __name__ == "__main__":
  app.run(main)
