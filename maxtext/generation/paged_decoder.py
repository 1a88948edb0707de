"""Continuous batching over a paged cache, with shared prompt prefixes.

`generate(params, config, contexts, options)` returns what
`decoder.generate` returns for the same arguments (one row per (context,
sample), prompt-major; the same ids and log-probabilities up to float32
summation order), computed differently: a fixed number of slots decode
together, each taking the next waiting sequence as soon as its own ends;
keys and values live in pages of one pool, taken as sequences grow and
given back when they end; a context is prefilled once and its samples
share its pages. On a mesh with a "data" axis the engine runs one replica
per device of that axis.

This module is the engine's public entry point: its options
(`EngineOptions`, checked when built), its result (`EngineGeneration`),
`generate`, and how the options resolve on a model and mesh
(`attention_of`, `configured`, `kernel_fits`, `pool_sharding`). The
engine's parts:

* `paged_scheduler`: the host's scheduler (`Scheduler`): slots, pages,
  shared prefixes, admission and the replicas' books, one `generate` call
  at a time.
* `paged_programs`: the device programs (prefill, stage, decode) and the
  layout of the values they take from and return to the host.
* `paged_sizes`: the slots, pages, tables and program buckets the options
  and the longest requests give.
* `paged_lowering`: the programs lowered ahead of time for abstract
  arguments (`lower`), for compiling them for devices this host lacks.
"""

import dataclasses
from typing import Any, Optional, Sequence

import jax
import numpy as np

from maxtext.core import checks
from maxtext.generation import decode_weights
from maxtext.generation import decoder
from maxtext.generation import paged_model
from maxtext.generation import paged_scheduler
from maxtext.generation import replica_layout
from maxtext.generation import sampling
from maxtext.model import layers
from maxtext.model import model_config

_ATTENTION = ("auto", "kernel", "gather")


@dataclasses.dataclass(frozen=True)
class EngineOptions:
  """The engine's shape; checked when built.

  Attributes:
    num_slots: sequences decoded together (the decode program's rows); 0
      = one per row of the call (the static decoder's batch). On a mesh of
      R data replicas, rounded up to a multiple of R.
    page_size: positions a page holds (a power of two).
    num_pages: the pool's pages (all replicas'; rounded up to a multiple
      of R); 0 = (num_slots + R) x the pages of the length bucket
      (`decoder.cache_length`) of the longest context plus
      max_new_tokens: every slot's longest sequence plus one waiting
      context per replica, for R = 1 the static decoder's cache for
      num_slots + 1 rows.
    chunk: most decode steps one program call runs (its freed slots
      take queued continuations within the call; it returns early when
      slots free while sequences wait for a prefill: `refill`); 0 = by
      the attention path (`configured`): 256 where the kernel reads the
      pool in place, 32 where each layer gathers its rows' pages into a
      view. Between two calls the device waits for the host (a transfer
      each way and its bookkeeping, about 2 ms a call on a TPU v5e), so
      the kernel's calls run until the queue needs the host. A gathered
      view spans every position the call may write, so there each step's
      attention grows with the chunk. A longer chunk also costs the
      [slots, chunk] records a call returns, and takes each running
      sequence's pages for the chunk's positions earlier (from the pages
      reserved for it at admission, so no fewer sequences are admitted).
    refill: while sequences wait beyond a replica's queue (for a prefill,
      or for pages), its decode call returns when this many of its
      sequences have finished with no queued continuation to take their
      slots (or as many as wait, if fewer): 1 refills each such slot
      within a step of its freeing; more trades idle slot steps for fewer
      calls, and so for less of the host's work between calls.
    prefill_tokens: most context tokens one prefill call writes per
      replica (its contexts x their length bucket): a call prefills as
      many waiting contexts as the replica's free slots take, up to this,
      and always at least one.
    attention: how grouped-query layers read the pool: "kernel" (the
      Pallas ragged paged attention kernel reads each row's pages in
      place; TPU), "gather" (each layer gathers the rows' pages into a
      view, `paged_model.paged_store`) or "auto" (the kernel where it
      runs: `kernel_fits`).
  """

  num_slots: int = 0
  page_size: int = 16
  num_pages: int = 0
  chunk: int = 0
  refill: int = 1
  prefill_tokens: int = 2048
  attention: str = "auto"

  def __post_init__(self):
    if self.attention not in _ATTENTION:
      raise ValueError(
          f"attention={self.attention!r}: must be one of {_ATTENTION}"
      )
    checks.check_int("num_slots", self.num_slots, 0)
    size = checks.check_int("page_size", self.page_size, 1)
    if size & (size - 1):
      raise ValueError(f"page_size={size}: must be a power of two")
    checks.check_int("num_pages", self.num_pages, 0)
    checks.check_int("chunk", self.chunk, 0)
    checks.check_int("refill", self.refill, 1)
    checks.check_int("prefill_tokens", self.prefill_tokens, 1)


@dataclasses.dataclass(frozen=True)
class EngineGeneration:
  """What `generate` returns: `decoder.Generation`'s rows and figures.

  Attributes:
    ids, lengths, log_probs: as `decoder.Generation` (row r continues
      context r // num_samples); ids past a row's own max_new_tokens are
      `sampling.PAD_ID`.
    cache_bytes: bytes of the page pool (allocated) and of the slots'
      recurrent states (a hybrid model's), over all replicas.
    peak_bytes: bytes of `pages_used` pages and of the slots' recurrent
      states.
    pages_used: the most pages in use at once; on several data replicas
      the sum of each replica's most (what their blocks must hold).
    prefill_passes: contexts prefilled (each once).
    prefill_calls: prefill program calls (one prefills several contexts,
      of one replica or several).
    decode_calls: decode program calls.
    decode_steps: decode steps run (each steps every slot).
    page_copies: partial pages copied for a continuation (copy on write).
  """

  ids: np.ndarray
  lengths: np.ndarray
  log_probs: np.ndarray
  cache_bytes: int
  peak_bytes: int
  pages_used: int
  prefill_passes: int
  prefill_calls: int
  decode_calls: int
  decode_steps: int
  page_copies: int


def pool_sharding(
    config: model_config.ModelConfig, mesh: Optional[jax.sharding.Mesh]
) -> Optional[jax.sharding.NamedSharding]:
  """Where the page pool's [L, N, P, K, D] leaves live on `mesh` (None:
  one device): the pages split over the data-parallel replicas (the mesh's
  "data" axis), the key/value heads over its tensor axis where that
  divides them (`replica_layout`)."""
  layout = replica_layout.for_model(config, mesh)
  return layout.sharding(layout.pool_spec())


def kernel_fits(config: model_config.ModelConfig, layout) -> Optional[str]:
  """Why the ragged paged attention kernel cannot serve this model and
  layout, or None when it can: grouped-query attention (MLA's latents are
  not keys and values), a pool whose heads are not split over a tensor
  axis (the kernel sees one device's pool), compiled for a TPU. Heads
  narrower than a multiple of the TPU's 128 lanes are zero-padded in the
  kernel's pool (`paged_model.kernel_head_dim`)."""
  if config.attention_type == "mla":
    return "multi-head latent attention keeps latents, not keys and values"
  if layout.heads_axis is not None:
    return "the pool's heads are split over the tensor axis"
  platform = layers.target_platform(layout.mesh)
  if platform != "tpu":
    return f"the kernel runs on a TPU, not on {platform}"
  return None


def attention_of(
    engine: EngineOptions, config: model_config.ModelConfig, layout
):
  """`engine.attention` resolved: "gather" or the kernel
  (`paged_model.Attention`).

  Raises:
    ValueError: "kernel" where `kernel_fits` says it cannot run (one line).
  """
  if engine.attention == "gather":
    return "gather"
  why_not = kernel_fits(config, layout)
  if why_not is None:
    return paged_model.ragged_kernel
  if engine.attention == "kernel":
    raise ValueError(f"attention='kernel': {why_not}")
  return "gather"


# Decode steps a call runs where `EngineOptions.chunk` is 0, by how the
# grouped-query layers read the pool (docs/PERFORMANCE.md, "The decode
# call's chunk").
_KERNEL_CHUNK = 256
_GATHER_CHUNK = 32


def configured(
    engine: EngineOptions, config: model_config.ModelConfig, layout
) -> tuple[EngineOptions, Any]:
  """The engine as its programs run it, and its attention (`attention_of`):
  a chunk of 0 chosen by the attention path (`EngineOptions.chunk`).

  Raises:
    ValueError: as `attention_of`.
  """
  attention = attention_of(engine, config, layout)
  if engine.chunk:
    return engine, attention
  chunk = _GATHER_CHUNK if attention == "gather" else _KERNEL_CHUNK
  return dataclasses.replace(engine, chunk=chunk), attention


def generate(
    params: Any,
    config: model_config.ModelConfig,
    contexts: Sequence[Sequence[int]],
    options: sampling.SamplingOptions,
    *,
    max_new_tokens: Optional[Sequence[int]] = None,
    engine: EngineOptions = EngineOptions(),
    allowed_vocab: int = 0,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> EngineGeneration:
  """Continues each context `options.num_samples` times.

  Args:
    params: the model's parameters, on one device or sharded over `mesh`
      (replicated over its "data" axis, as the trainer places them).
    config: the model's config or the run's.
    contexts: id lists (a prompt, or an episode's turns so far); each
      len + its rows' max_new_tokens <= config.max_sequence_length.
    options: how many ids and how to choose them (as `decoder.generate`).
    max_new_tokens: each row's own limit (<= options.max_new_tokens), in
      row order (context-major); None = options.max_new_tokens for all.
    engine: slots, pages and chunk.
    allowed_vocab: ids at or above this are never chosen; 0 = the vocab.
    mesh: run on this mesh: one replica of the engine per device of its
      "data" axis, the pool and slots split as `replica_layout` says, the
      parameters where the caller put them; None = one device.

  Returns:
    An `EngineGeneration` of len(contexts) * num_samples rows.

  Raises:
    TypeError/ValueError: one line naming the option or context (as
      `decoder.generate`; a per-row limit out of range; a model with
      pool too small for one sequence).
  """
  config = model_config.of(config)
  allowed_vocab = sampling.check_for_model(options, config, allowed_vocab)
  new = options.max_new_tokens
  g = options.num_samples
  rows = len(contexts) * g
  if max_new_tokens is None:
    budgets = [new] * rows
  else:
    if len(max_new_tokens) != rows:
      raise ValueError(
          f"max_new_tokens has {len(max_new_tokens)} entries for {rows} "
          f"rows ({len(contexts)} contexts x num_samples={g})"
      )
    budgets = [
        checks.check_int(f"max_new_tokens[{i}]", b, 1)
        for i, b in enumerate(max_new_tokens)
    ]
    over = [b for b in budgets if b > new]
    if over:
      raise ValueError(
          f"max_new_tokens {over[0]} exceeds options.max_new_tokens={new}"
      )
  # Each context leaves room for its own rows' budgets.
  contexts = decoder.check_prompts(
      contexts,
      config,
      [max(budgets[i * g : (i + 1) * g]) for i in range(len(contexts))],
  )
  layout = replica_layout.for_model(config, mesh)
  engine, attention = configured(engine, config, layout)
  scheduler = paged_scheduler.Scheduler(
      decode_weights.cast(params, config.compute_dtype),
      config,
      contexts,
      budgets,
      options,
      (engine, layout, attention),
      allowed_vocab,
  )
  scheduler.warm_up()
  scheduler.run()
  return EngineGeneration(**scheduler.result())
