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
grouped-query cache of the same width would take. Then the two samplers'
greedy agreement on the first `--windowed_tokens` ids (below), the cached
decoder's step against the bandwidth limit (below), and the last line:

  decode_bench: speedup=S

with S = cached tokens/s / windowed tokens/s.

With `--lengths=longtail` it compares instead the static decoder with the
paged, continuous-batching decoder (`maxtext.generation.paged_decoder`) on
the requests of a GRPO rollout: `--prompts` prompts of `--prompt_len` ids,
`--num_generations` (G) completions each, whose lengths are drawn from a
geometric distribution of mean `--mean_length`, capped at `--max_length`
(seeded by `--seed`). Each request stops at its own length (as a stop id
would end it; the model is random, so lengths are imposed). The static
decoder runs all P x G rows in one batch with max_new_tokens = the longest
length (rows step on, emitting padding, until the longest ends) and
prefills each row's prompt; the paged decoder runs `--slots` slots of
pages of `--page_size`, refilling a slot when its request ends, and
prefills each prompt once. Both are greedy and must agree on every
request's ids. The model's max_sequence_length is raised, if needed, to
hold a prompt plus `--max_length` (the parameters do not depend on it).
The table gives useful tokens (the requests' lengths summed), seconds,
useful tokens/s, compile seconds, cache bytes allocated and used at most,
and prefill passes; the last line is:

  decode_bench: continuous_speedup=S pages_used=U prefill_passes=P/Q

with S = paged useful tokens/s / static useful tokens/s, U the most pages
in use at once, P the paged decoder's prefill passes and Q the static
decoder's prefilled rows.

With `--host_profile` (longtail) the paged decoder runs twice more
(`tools/benchmarks/decode_host_profile`): its host work by phase (admit,
prefill, decode dispatch, the wait for a call's results, bookkeeping), and
its programs launched, arrays moved host->device and device->host, and
programs compiled, per decode call, in lines that start with "paged host
profile" (the last: `paged host profile: launches=L to_device=D
to_host=H compiles=C host_cpu_us=U (per decode call)`).

Greedy agreement (`maxtext.generation.greedy_agreement`): "same ids: N/M"
counts the requests (rows) whose two id sequences are equal; "agree within
<dtype> rounding: K/M" adds those whose first difference is a near-tie of
the float32 model's logits over the common context, which the rounding may
order either way: the compute dtype's, but bfloat16's for float32 on a TPU at
JAX's default matmul precision (`greedy_agreement.rounding_dtype`).

The step against the limit (`maxtext.generation.decode_roofline`): the
bytes a decode step reads (the weights in the compute dtype, the mean
visible key/value cache and recurrent states of a step's rows), and, where
the device's HBM bandwidth is known (`maxtext.metrics.hbm_bandwidth`), the
step time that bandwidth allows against the measured step (the timed
seconds over the decode steps: the paged decoder's count in longtail mode,
`--new_tokens` for the cached decoder) and the fraction of the limit
reached; on other devices (the CPU) the limit is unknown.
"""

import dataclasses
import os
import threading
import time
from typing import Any

from absl import app
from absl import flags
import jax
from jax import monitoring
from ml_collections import config_flags
import numpy as np

from maxtext.configs import decode_bench
from maxtext.generation import decode_roofline
from maxtext.generation import decoder
from maxtext.generation import greedy_agreement
from maxtext.generation import kv_cache
from maxtext.generation import paged_decoder
from maxtext.generation import replica_layout
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.generation import sampling
from tools import command_line
from tools.benchmarks import decode_host_profile

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
_LENGTHS = flags.DEFINE_enum(
    "lengths",
    "fixed",
    ["fixed", "longtail"],
    "fixed: cached decoder against windowed sampler at --new_tokens; "
    "longtail: static against paged decoder on long-tailed lengths.",
)
_PROMPTS = flags.DEFINE_integer("prompts", 4, "longtail: prompts.")
_NUM_GENERATIONS = flags.DEFINE_integer(
    "num_generations", 16, "longtail: completions per prompt (G)."
)
_MEAN_LENGTH = flags.DEFINE_integer(
    "mean_length", 64, "longtail: mean of the geometric completion lengths."
)
_MAX_LENGTH = flags.DEFINE_integer(
    "max_length", 1024, "longtail: cap on a completion's length."
)
_SLOTS = flags.DEFINE_integer("slots", 16, "longtail: paged decoder slots.")
_REFILL = flags.DEFINE_integer(
    "refill",
    1,
    "longtail: finished sequences a decode call waits for before it returns "
    "to refill slots (paged_decoder.EngineOptions.refill).",
)
_CHUNK = flags.DEFINE_integer(
    "chunk",
    paged_decoder.EngineOptions.chunk,
    "longtail: most decode steps one paged decode call runs; 0 = the "
    "engine's choice by attention path (paged_decoder.EngineOptions.chunk).",
)
_PAGE_SIZE = flags.DEFINE_integer(
    "page_size", 16, "longtail: positions per page."
)
_ATTENTION = flags.DEFINE_enum(
    "attention",
    "auto",
    ["auto", "kernel", "gather"],
    "longtail: how the paged decoder's grouped-query layers read the pool "
    "(paged_decoder.EngineOptions.attention).",
)

_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir",
    None,
    "longtail: after the timed runs, trace one more paged run into this "
    "directory with the JAX profiler (summarise it with trace_summary).",
)

_HOST_PROFILE = flags.DEFINE_bool(
    "host_profile",
    False,
    "longtail: after the timed runs, run the paged decoder twice more to "
    "time its host work by phase and count its launches and transfers per "
    "decode call (decode_host_profile).",
)

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


def _agreement_line(agree, config, of: str) -> str:
  """The two decoders' greedy agreement (`greedy_agreement`): exactly and
  within the rounding the compute dtype carries on this device."""
  dtype = greedy_agreement.rounding_dtype(config.compute_dtype)
  return (
      f"same ids: {agree.same}/{agree.total} {of}; agree within "
      f"{dtype} rounding: {agree.within_rounding}/{agree.total}"
  )


def longtail_lengths(
    rng: np.random.Generator, count: int, mean: int, cap: int
) -> np.ndarray:
  """`count` completion lengths, geometric (support 1, 2, ...) with mean
  `mean`, capped at `cap`."""
  return np.minimum(rng.geometric(1.0 / mean, size=count), cap).astype(int)


_LONGTAIL_COUNTS = (
    _PROMPTS,
    _NUM_GENERATIONS,
    _PROMPT_LEN,
    _MAX_LENGTH,
    _MEAN_LENGTH,
    _REFILL,
)


def _check_longtail_counts() -> None:
  """Raises app.UsageError unless each of `_LONGTAIL_COUNTS` is >= 1 and
  --chunk >= 0."""
  if min(flag.value for flag in _LONGTAIL_COUNTS) < 1:
    raise app.UsageError(
        ", ".join(f"--{flag.name}" for flag in _LONGTAIL_COUNTS)
        + " must be >= 1"
    )
  if _CHUNK.value < 0:
    raise app.UsageError(
        f"--chunk={_CHUNK.value} must be >= 0 (0: the engine's choice)"
    )


def _longtail(config: model_config.ModelConfig) -> None:
  """The static decoder against the paged one on long-tailed lengths."""
  _check_longtail_counts()
  prompts_n, g = _PROMPTS.value, _NUM_GENERATIONS.value
  prompt_len, cap = _PROMPT_LEN.value, _MAX_LENGTH.value
  engine = paged_decoder.EngineOptions(
      num_slots=_SLOTS.value,
      page_size=_PAGE_SIZE.value,
      refill=_REFILL.value,
      chunk=_CHUNK.value,
      attention=_ATTENTION.value,
  )
  why_not = paged_decoder.kernel_fits(
      config, replica_layout.for_model(config, None)
  )
  if _ATTENTION.value == "kernel" and why_not:
    raise app.UsageError(f"--attention=kernel: {why_not}")
  config = dataclasses.replace(
      config,
      max_sequence_length=max(config.max_sequence_length, prompt_len + cap),
  )
  params = jax.jit(lambda k: transformer.init_params(config, k))(
      jax.random.PRNGKey(_SEED.value)
  )
  rng = np.random.default_rng(_SEED.value)
  prompts = [
      [int(i) for i in rng.integers(0, config.vocab_size, prompt_len)]
      for _ in range(prompts_n)
  ]
  lengths = longtail_lengths(rng, prompts_n * g, _MEAN_LENGTH.value, cap)
  static, paged, host_lines = _longtail_runs(
      params, config, prompts, g, lengths, engine
  )
  rows = prompts_n * g
  agree = greedy_agreement.agreement(
      params,
      config,
      [prompts[r // g] for r in range(rows)],
      [static.run.ids[r, :n] for r, n in enumerate(lengths)],
      [paged.run.ids[r, :n] for r, n in enumerate(lengths)],
  )
  _print_longtail(config, params, engine, prompt_len, g, lengths, static, paged)
  print(_agreement_line(agree, config, "requests"))
  step = decode_roofline.step_bytes(
      config, params, [prompt_len] * rows, lengths, paged.run.decode_steps
  )
  for line in decode_roofline.report(
      step, jax.devices()[0].device_kind, paged.seconds
  ):
    print(f"paged {line}")
  for line in host_lines:
    print(f"paged {line}")
  print(
      f"decode_bench: continuous_speedup={static.seconds / paged.seconds:.1f} "
      f"pages_used={paged.run.pages_used} "
      f"prefill_passes={paged.run.prefill_passes}/{rows}"
  )


@dataclasses.dataclass(frozen=True)
class _Measured:
  """One decoder's timed run: its result, seconds, and compile seconds."""

  run: Any
  seconds: float
  compile_s: float


def _longtail_runs(params, config, prompts, g, lengths, engine):
  """Compiles and times the static decoder, then the paged one.

  The static decoder runs every row to the longest length; the paged one
  gives each row its own (`lengths`). With --profile_dir, the paged run is
  traced once more, apart from the timed runs (the profiler slows what it
  traces). With --host_profile, the paged run is run twice more to profile
  its host work (`decode_host_profile`).

  Returns:
    (static, paged) `_Measured`, and the host profile's lines (none
    without --host_profile).
  """
  options = sampling.SamplingOptions(
      max_new_tokens=int(lengths.max()), num_samples=g
  )
  compiles = _CompileSeconds()

  def static():
    return decoder.generate(params, config, prompts, options)

  def paged():
    return paged_decoder.generate(
        params,
        config,
        prompts,
        options,
        max_new_tokens=[int(n) for n in lengths],
        engine=engine,
    )

  _, static_compile = compiles.measure(static)
  static_run, static_s = _timed(static)
  _, paged_compile = compiles.measure(paged)
  paged_run, paged_s = _timed(paged)
  if _PROFILE_DIR.value:
    with jax.profiler.trace(_PROFILE_DIR.value):
      paged()
  host_lines = []
  if _HOST_PROFILE.value:
    host_lines = decode_host_profile.report(decode_host_profile.profile(paged))
  return (
      _Measured(static_run, static_s, static_compile),
      _Measured(paged_run, paged_s, paged_compile),
      host_lines,
  )


def _print_longtail(
    config, params, engine, prompt_len, g, lengths, static, paged
) -> None:
  """The long-tail comparison's header line and table."""
  rows = len(lengths)
  useful = int(lengths.sum())
  per_token = kv_cache.bytes_per_token(config)
  # Each row's keys and values, and its recurrent states (a hybrid's).
  needed = per_token * int(np.sum(prompt_len + lengths))
  needed += kv_cache.state_bytes_per_row(config) * rows
  print(
      f"decode_bench: longtail, {transformer.num_params(params) / 1e6:.1f}M "
      f"parameters (emb {config.emb_dim}, {config.num_layers} layers, "
      f"{config.attention_type}), {rows // g} prompts of {prompt_len} x "
      f"G={g}, completion lengths geometric mean {_MEAN_LENGTH.value} capped "
      f"at {_MAX_LENGTH.value} (drawn: mean {lengths.mean():.1f}, max "
      f"{int(lengths.max())}), greedy, "
      f"{engine.num_slots} slots, pages of {engine.page_size}, "
      f"attention {engine.attention}, "
      f"{jax.devices()[0].platform} x{jax.device_count()}"
  )
  print(
      f"{'decoder':<8} {'useful':>7} {'seconds':>9} {'tokens/s':>10} "
      f"{'compile_s':>10} {'cache_alloc':>12} {'cache_used':>12} "
      f"{'prefills':>9}"
  )
  print(
      f"{'static':<8} {useful:>7} {static.seconds:>9.3f} "
      f"{useful / static.seconds:>10.1f} {static.compile_s:>10.2f} "
      f"{static.run.cache_bytes:>12} {needed:>12} {rows:>9}"
  )
  print(
      f"{'paged':<8} {useful:>7} {paged.seconds:>9.3f} "
      f"{useful / paged.seconds:>10.1f} {paged.compile_s:>10.2f} "
      f"{paged.run.cache_bytes:>12} {paged.run.peak_bytes:>12} "
      f"{paged.run.prefill_passes:>9}"
  )
  print(
      f"paged: {paged.run.decode_steps} decode steps in "
      f"{paged.run.decode_calls} calls, {paged.run.page_copies} partial "
      f"pages copied; static: {int(lengths.max())} steps of {rows} rows"
  )


def main(argv: list[str]) -> None:
  """Runs both samplers and prints the table and the closing line; a
  mistake in the flags is one line and exit status 2."""
  with command_line.user_errors("decode_bench", (app.UsageError,)):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = model_config.of(_CONFIG.value)
    if _LENGTHS.value == "longtail":
      _longtail(config)
      return
    _uniform(config)


def _uniform(config: model_config.ModelConfig) -> None:
  """The cached decoder against the windowed sampler on equal lengths."""
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

  agree = greedy_agreement.agreement(
      params, config, prompts, generation.ids[:, :windowed], window_ids
  )
  cached_rate, window_rate = _print_uniform(
      config,
      params,
      prompt_len,
      _Measured(generation, cached_s, cached_compile),
      _Measured(window_ids, window_s, window_compile),
  )
  print(_agreement_line(agree, config, f"rows, the first {windowed} tokens"))
  step = decode_roofline.step_bytes(
      config, params, [prompt_len] * batch, [new] * batch, new
  )
  for line in decode_roofline.report(
      step, jax.devices()[0].device_kind, cached_s
  ):
    print(f"cached {line}")
  print(f"decode_bench: speedup={cached_rate / window_rate:.1f}")


def _print_uniform(config, params, prompt_len, cached, window):
  """The uniform comparison's header line, table and cache line.

  Returns:
    (the cached decoder's tokens/s, the windowed sampler's).
  """
  batch, new, windowed = _BATCH.value, _NEW_TOKENS.value, _WINDOWED_TOKENS.value
  generation = cached.run
  cached_rate = batch * new / cached.seconds
  window_rate = batch * windowed / window.seconds
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
      f"{'cached':<10} {batch * new:>7} {cached.seconds:>9.3f} "
      f"{cached_rate:>10.1f} {cached.compile_s:>10.2f} "
      f"{generation.cache_bytes:>12}"
  )
  print(
      f"{'windowed':<10} {batch * windowed:>7} {window.seconds:>9.3f} "
      f"{window_rate:>10.1f} {window.compile_s:>10.2f} {'-':>12}"
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
  return cached_rate, window_rate


if __name__ == "__main__":
  app.run(main)
