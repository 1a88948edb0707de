"""Continuous batching over a paged cache, with shared prompt prefixes.

`generate(params, config, contexts, options)` returns what
`decoder.generate` returns for the same arguments (one row per (context,
sample), prompt-major; the same ids and log-probabilities up to float32
summation order), computed differently:

* Decode slots. A fixed number of slots (`EngineOptions.num_slots`) decode
  together, one token per slot per step. A sequence that stops (a stop id,
  or its own `max_new_tokens`) leaves its slot, and the next waiting
  sequence takes it at once: no slot steps on after its sequence ended while
  others go on, which in a static batch costs as many padding steps as the
  longest row is longer than the others.
* Pages. Keys and values live in fixed-size pages of one pool
  (`paged_model`); each slot has a page table. Pages are taken from the
  pool (`page_pool.PagePool`) as a sequence grows and go back when it ends,
  so the pool holds what running sequences use, not rows x the longest
  length.
* Shared prefixes. A context is prefilled once; its `num_samples`
  continuations list the context's full pages in their tables (each page
  counts its holders). The last, partial page is written by every
  continuation, so each gets its own copy when it takes a slot (copy on
  write; the last one to start takes the context's own page, with no copy).
  A context whose length is a multiple of the page size shares every page.
* Per-request randomness. Row r's draw at its step s uses the key
  fold_in(fold_in(PRNGKey(seed), r), s), the static decoder's: the ids
  depend on the request and the step, not on the slot, on which requests
  share a step, or on the number of slots.

Programs and calls: a prefill call writes as many waiting contexts as a
replica's free slots take (up to `EngineOptions.prefill_tokens` tokens),
and one stage call copies their logits and recurrent states into the
engine's ready buffers. Each replica's continuations of prefilled
contexts wait in its queue (their pages taken: the context's shared
ones, a partial page's copy, their first chunk's), which travels with
every decode call: at the call's start and after each step, the slots
that are free take the queue's next continuations on the device (their
values, page tables, logits and states from the ready buffers, their
partial pages' copies). A decode call runs up to `EngineOptions.chunk`
steps and returns early once `EngineOptions.refill` sequences (1 by
default) have finished with no queued continuation to take their slots
while others wait for a prefill, so a slot waits at most a step for a
context the host has yet to prefill, and none for one already
prefilled. A rollout whose rows all have slots is thus one prefill, one
stage and one decode call, however many contexts and samples it has.
Each call takes its host values as one array or a few (a transfer each,
not a program); a decode call takes one (its slots' values, page tables
and queue, `_SLOT_COLUMNS`, `_QUEUE_COLUMNS`) and returns its results to
the host as one (`_unpack_decoded`: each step's id, log-probability, row
and step per slot, and the slots' values after the call). Between two
decode calls the host thus makes a transfer each way and bookkeeping
whose loops run over the sequences that finished or started, and the
slots that take pages (the new ids go into their rows as whole arrays).
Prefill is compiled once per length bucket of a call's longest context
(the decoder's `cache_length` buckets) and power-of-two number of
contexts; the decode program once per power-of-two number of pages a
slot may see (`view` buckets up to the pages of the longest sequence's
bucket): all of them on a process's first call of its shapes
(`_Run.warm_up`). None depends on a request.

Admission reserves, for every admitted sequence, the pages it may still
need (its context plus its `max_new_tokens`), so a running sequence never
waits for a page; a sequence waits for a slot and for its pages. A context
whose pages cannot fit even into the empty pool is refused in one line.

Recurrent layers (a hybrid model's Gated DeltaNet) carry a state per
sequence rather than pages: one per slot (`kv_cache.init_states`), beside
the page tables. A context's prefill leaves its state after the context;
each continuation's slot starts from a copy of it (as the partial page is
copied), and a slot's state advances only on its live tokens.

Data-parallel replicas. On a mesh whose "data" axis has R > 1 devices
(the training mesh's, where the parameters are split over "fsdp" and
replicated over "data") the engine runs R replicas that decode without
exchanging weights, pages or activations (`replica_layout`): each holds
the whole model (split over its own fsdp, expert and tensor devices as
the caller placed it), S / R of the slots and N / R of the pool's pages,
which its page tables name by local ids, and the programs run their body
per replica (`shard_map` manual over "data" only). The slot count is
rounded up to a multiple of R (`replica_slots`), and so is the page count
(the default pool is (S + R) x the widest table: each replica's slots'
longest sequences plus one waiting context). The host keeps one
`page_pool.PagePool` and reservation count per replica. A waiting context
is prefilled into the replica, among those with free slots and no
continuation ready, that has the most free (unreserved) pages, until each
has contexts for its free slots; one prefill call takes them all (the
rows of a replica with fewer are empty and write nothing). Its
continuations run in that replica's slots only, sharing its pages, and
each replica fills its own free slots from its own ready continuations.
The decode program's replicas step together: the call stops once any
replica with work waiting has finished its `refill` sequences (the one
value they exchange, an integer pair a step), or when no replica has a
running one.
Draws are keyed by (row, step), so the ids do not depend on the replica
either. `EngineGeneration`'s pages and bytes are summed over the replicas
(`pages_used`: the sum of each replica's most pages in use, the pages the
replicas' blocks must hold). With R = 1 (no "data" axis, or one device)
the programs run without `shard_map`.
"""

import collections
import contextlib
import dataclasses
import functools
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import checks
from maxtext.generation import cached_model
from maxtext.generation import decode_weights
from maxtext.generation import decoder
from maxtext.generation import kv_cache
from maxtext.generation import page_pool
from maxtext.generation import paged_model
from maxtext.generation import replica_layout
from maxtext.generation import sampling
from maxtext.model import layers
from maxtext.model import model_config
from maxtext.runtime import mesh as mesh_lib

_STOP_SLOTS = 8

P = jax.sharding.PartitionSpec


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
      slots free while sequences wait for a prefill: `refill`).
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
  chunk: int = 32
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
    checks.check_int("chunk", self.chunk, 1)
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


def _pages(positions: int, page_size: int) -> int:
  return -(-positions // page_size)


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


def _prefill_body(
    params,
    pool,
    states,
    logits,
    tokens,
    bounds,
    tables,
    *,
    config: model_config.ModelConfig,
    attention,
):
  """One replica's prefill of a chunk of its C contexts.

  Args:
    params, pool: the model's parameters and the page pool.
    states, logits: the contexts' recurrent states [L, C, ...] and
      last-position logits [C, V] after the chunks before; None for a
      first chunk.
    tokens: int32 [C, T]: each context's ids at positions start ..
      start + T - 1, right-padded.
    bounds: int32 [C, 2]: each row's (start, length): the chunk's first
      position and the context's length; a row's positions at or past its
      length write nothing (a row of length 0 is empty).
    tables: int32 [C, W]: each context's pages.
    config, attention: static.

  Returns:
    (pool, logits [C, V]: each context's last position's logits where this
    chunk holds it, else as given, states [L, C, ...] after its valid
    tokens).
  """
  rows, width = tokens.shape
  starts, lengths = bounds[:, 0], bounds[:, 1]
  positions = starts[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
  if states is None:
    states = kv_cache.init_states(config, rows)
  hidden, pool, states = paged_model.forward(
      params,
      tokens,
      positions,
      positions < lengths[:, None],
      pool,
      tables,
      config,
      states,
      attention,
  )
  last = jnp.clip(lengths - 1 - starts, 0, width - 1)
  new = cached_model.logits(params, hidden[jnp.arange(rows), last][:, None])
  if logits is None:
    return pool, new[:, 0], states
  here = (lengths > starts) & (lengths <= starts + width)
  return pool, jnp.where(here[:, None], new[:, 0], logits), states


@functools.partial(
    jax.jit,
    static_argnames=("config", "layout", "attention"),
    donate_argnums=(1, 2, 3),
)
def _prefill(
    params,
    pool,
    states,
    logits,
    tokens,
    bounds,
    tables,
    *,
    config: model_config.ModelConfig,
    layout,
    attention,
):
  """Writes a chunk of up to C contexts per replica into its pages.

  A context longer than a chunk (`prefill_chunk`) is prefilled by calls
  that run on from each other (positions start.., the states and logits
  the call before returned), so a call's activations stay those of T
  tokens a context however long the context.

  Args:
    params: the model's parameters.
    pool: the page pool.
    states, logits: the call before's ({} / None and None for a first
      chunk).
    tokens: int32 [R * C, T]: replica r's contexts' ids in rows r * C ..
      (r + 1) * C - 1 (positions start .. start + T - 1), right-padded.
    bounds: int32 [R * C, 2]: each row's chunk start and context length
      (0 for a row with no context: it writes nothing).
    tables: int32 [R * C, W]: each context's pages (its replica's local
      ids).
    config, layout: static (`replica_layout.Layout`).
    attention: static: `attention_of`'s.

  Returns:
    (pool, logits float32 [R * C, V] of each context's last position (once
    a chunk has held it), their recurrent states [L, R * C, ...] ({}
    without recurrent layers)), split over the replicas as the engine's
    other arrays are, so every call takes and returns the same layouts.
  """
  split = layout.split
  pool, logits, states = layout.per_replica(
      functools.partial(_prefill_body, config=config, attention=attention),
      in_specs=(
          P(),
          split(1),
          split(1),
          split(0),
          split(0),
          split(0),
          split(0),
      ),
      out_specs=(split(1), split(0), split(1)),
  )(params, pool, states, logits, tokens, bounds, tables)
  return (
      layout.constrain(pool, layout.pool_spec()),
      layout.constrain(logits, split(0)),
      layout.constrain(states, split(1)),
  )


@functools.partial(
    jax.jit,
    static_argnames=("config", "num_pages", "page_size", "layout", "attention"),
)
def _empty_pool(
    *, config: model_config.ModelConfig, num_pages, page_size, layout, attention
):
  """A zero pool for `attention`, placed by `layout`."""
  return layout.constrain(
      paged_model.init_pool(config, num_pages, page_size, attention),
      layout.pool_spec(),
  )


@functools.partial(
    jax.jit, static_argnames=("config", "slots", "ready", "layout")
)
def _empty_slots(*, config: model_config.ModelConfig, slots, ready, layout):
  """Every slot's zero recurrent states ({} for a model without recurrent
  layers) and next-token logits, and the same for `ready` rows of the
  ready buffers (`_stage`), split over the replicas: (states, logits,
  ready states, ready logits)."""

  def zeros(rows):
    return (
        layout.constrain(kv_cache.init_states(config, rows), layout.split(1)),
        layout.constrain(
            jnp.zeros((rows, config.vocab_size), jnp.float32), layout.split(0)
        ),
    )

  return zeros(slots) + zeros(ready)


@functools.partial(jax.jit, static_argnames=("layout",), donate_argnums=(0, 1))
def _stage(ready_logits, ready_states, logits, states, rows, *, layout):
  """Copies a prefill call's contexts' logits and recurrent states into the
  engine's ready buffers, where decode calls start their continuations.

  Args:
    ready_logits, ready_states: the engine's [R * 2C, V] and
      [L, R * 2C, ...] (each replica's 2C rows: two generations of its C
      contexts, `_Run.prefill`).
    logits, states: a `_prefill` call's [R * c, V] and [L, R * c, ...].
    rows: int32 [R * c]: each prefilled row's local ready row (2C for
      none: the scatter drops it).
    layout: static (`replica_layout.Layout`).

  Returns:
    (ready_logits, ready_states).
  """

  def body(ready_logits, ready_states, logits, states, rows):
    ready_logits = ready_logits.at[rows].set(logits, mode="drop")
    ready_states = jax.tree_util.tree_map(
        lambda x, c: x.at[:, rows].set(c, mode="drop"), ready_states, states
    )
    return ready_logits, ready_states

  split = layout.split
  ready_logits, ready_states = layout.per_replica(
      body,
      in_specs=(split(0), split(1), split(0), split(1), split(0)),
      out_specs=(split(0), split(1)),
  )(ready_logits, ready_states, logits, states, rows)
  return (
      layout.constrain(ready_logits, split(0)),
      layout.constrain(ready_states, split(1)),
  )


# The decode program's per-slot values: one int32 array [S, _SLOT_COLUMNS
# + view + _QUEUE_COLUMNS + view], so a call moves them to the device at
# once. Each slot's steps (the ids its sequence has so far), position
# (where its next id goes), budget (its max_new_tokens), row (its draws'
# key), active (1: it holds a running sequence), its replica's stop_after
# (the finished sequences left without a successor at which the call
# returns) and queued (the replica's continuations waiting in its queue),
# then its page table's first `view` pages (local page ids of the slot's
# replica). Then row i of a replica's block is the i-th continuation of its
# queue: the first slot to free takes it on the device, within the call.
_STEPS, _POSITIONS, _BUDGETS, _ROWS, _ACTIVE, _STOP_AFTER, _QUEUED = range(7)
_SLOT_COLUMNS = 7
# A queued continuation: its position, budget and row (a slot's), its
# context's row in the ready buffers, its partial page's copy (local page
# ids; copy_to N / R for none), then its page table's first `view` pages.
_Q_POSITION, _Q_BUDGET, _Q_ROW, _Q_SOURCE, _Q_COPY_FROM, _Q_COPY_TO = range(6)
_QUEUE_COLUMNS = 6
# A decode call's results, per slot: `_RECORDS` [S, chunk] int32 arrays
# (the id drawn at step k, its log-probability's float32 bits, the row and
# step it belongs to (row -1: the slot held none), 1 where it ended its
# sequence), then `_FINALS` values after the call (steps, position,
# active, row, the replica's continuations taken from its queue, the steps
# the call ran).
_RECORDS = 5
_FINAL_STEPS, _FINAL_POSITIONS, _FINAL_ACTIVE, _FINAL_ROWS = range(4)
_FINAL_TAKEN, _FINAL_CALL_STEPS = 4, 5
_FINALS = 6


class _Decoded(NamedTuple):
  """A decode call's results on the host (`_unpack_decoded`)."""

  ids: np.ndarray  # int32 [S, chunk]
  log_probs: np.ndarray  # float32 [S, chunk]
  rows: np.ndarray  # int32 [S, chunk]: -1 where the slot held no sequence
  steps: np.ndarray  # int32 [S, chunk]: the id's step in its row
  done: np.ndarray  # bool [S, chunk]: the id ended its sequence
  finals: np.ndarray  # int32 [S, _FINALS]


def _unpack_decoded(packed: np.ndarray, chunk: int) -> _Decoded:
  """`_decode`'s packed int32 [S, _RECORDS * chunk + _FINALS] on the host."""
  parts = [packed[:, i * chunk : (i + 1) * chunk] for i in range(_RECORDS)]
  return _Decoded(
      ids=parts[0],
      log_probs=parts[1].view(np.float32),
      rows=parts[2],
      steps=parts[3],
      done=parts[4] > 0,
      finals=packed[:, _RECORDS * chunk :],
  )


class _DecodeCarry(NamedTuple):
  """The decode loop's state from one step to the next (S slots).

  Attributes:
    k: int32: steps taken in this call.
    pool: the page pool.
    states: the slots' recurrent states.
    logits: float32 [S, V]: each slot's next-token logits.
    steps: int32 [S]: the ids each slot's sequence has so far.
    positions: int32 [S]: where each slot's next id goes.
    budgets: int32 [S]: each slot's sequence's max_new_tokens.
    rows: int32 [S]: each slot's sequence's row (its draws' key).
    tables: int32 [S, view]: each slot's pages.
    active: bool [S]: the slots whose sequence is still running.
    finished: int32: sequences finished in this call.
    refilled: int32: slots the queue refilled after the call's first step.
    taken: int32: continuations taken from the queue in this call.
    records: int32 [_RECORDS, S, chunk]: `_unpack_decoded`'s records.
  """

  k: Any
  pool: Any
  states: Any
  logits: Any
  steps: Any
  positions: Any
  budgets: Any
  rows: Any
  tables: Any
  active: Any
  finished: Any
  refilled: Any
  taken: Any
  records: Any


class _Queue(NamedTuple):
  """A replica's queued continuations and its ready buffers, on the device
  (`_decode_body`)."""

  entries: Any  # int32 [S, _QUEUE_COLUMNS + view]
  length: Any  # int32: entries queued
  logits: Any  # float32 [2C, V]
  states: Any  # [L, 2C, ...]


def _take_queued(carry: _DecodeCarry, queue: _Queue, refill: bool):
  """The free slots take the queue's next continuations, in slot order:
  their values, pages, logits and states, and their partial pages' copies.
  A step that frees no slot, or leaves the queue empty, changes nothing
  (`lax.cond`: no copies run)."""
  free = ~carry.active
  index = carry.taken + jnp.cumsum(free) - 1
  take = free & (index < queue.length)

  def start(carry):
    entry = queue.entries[jnp.clip(index, 0, queue.entries.shape[0] - 1)]
    source = entry[:, _Q_SOURCE]
    pages = jax.tree_util.tree_leaves(carry.pool)[0].shape[1]
    copy_to = jnp.where(take, entry[:, _Q_COPY_TO], pages)
    copy_from = entry[:, _Q_COPY_FROM]
    pool = jax.tree_util.tree_map(
        lambda x: x.at[:, copy_to].set(x[:, copy_from], mode="drop"),
        carry.pool,
    )

    # The taking slots' rows of [L, S, ...] from [L, 2C, ...]; a slot that
    # takes nothing scatters to row S, which is dropped.
    into = jnp.where(take, jnp.arange(take.shape[0]), take.shape[0])

    def per_slot(x, ready):
      return x.at[:, into].set(ready[:, source], mode="drop")

    count = jnp.sum(take).astype(jnp.int32)
    return carry._replace(
        pool=pool,
        states=jax.tree_util.tree_map(per_slot, carry.states, queue.states),
        logits=jnp.where(take[:, None], queue.logits[source], carry.logits),
        steps=jnp.where(take, 0, carry.steps),
        positions=jnp.where(take, entry[:, _Q_POSITION], carry.positions),
        budgets=jnp.where(take, entry[:, _Q_BUDGET], carry.budgets),
        rows=jnp.where(take, entry[:, _Q_ROW], carry.rows),
        tables=jnp.where(
            take[:, None], entry[:, _QUEUE_COLUMNS:], carry.tables
        ),
        active=carry.active | take,
        refilled=carry.refilled + count if refill else carry.refilled,
        taken=carry.taken + count,
    )

  return jax.lax.cond(jnp.any(take), start, lambda carry: carry, carry)


def _decode_body(
    params,
    pool,
    states,
    logits,
    ready_logits,
    ready_states,
    slot_inputs,
    seed_key,
    temperature,
    top_k,
    top_p,
    stop_ids,
    allowed_vocab,
    *,
    config: model_config.ModelConfig,
    chunk: int,
    greedy: bool,
    filtered: bool,
    replicas: int,
    attention,
):
  """One replica's `_decode` on its blocks (its slots' rows of
  `slot_inputs`, its ready buffers).

  The free slots take queued continuations, then a while loop of
  `_decode_step`s, each followed by the freed slots taking the queue's
  next ones, as long as `_keep_decoding` says.
  """
  view = (slot_inputs.shape[1] - _SLOT_COLUMNS - _QUEUE_COLUMNS) // 2
  queue = _Queue(
      entries=slot_inputs[:, _SLOT_COLUMNS + view :],
      length=slot_inputs[0, _QUEUED],
      logits=ready_logits,
      states=ready_states,
  )
  # Every slot of a replica holds the replica's stop_after and queued.
  step = functools.partial(
      _decode_step,
      params=params,
      seed_key=seed_key,
      draw=(temperature, top_k, top_p, allowed_vocab),
      stop_ids=stop_ids,
      config=config,
      greedy=greedy,
      filtered=filtered,
      attention=attention,
  )
  keep_decoding = functools.partial(
      _keep_decoding,
      stop_after=slot_inputs[0, _STOP_AFTER],
      chunk=chunk,
      replicas=replicas,
  )
  carry = _first_carry(
      pool, states, logits, slot_inputs[:, : _SLOT_COLUMNS + view], chunk
  )
  carry = _take_queued(carry, queue, refill=False)
  out = jax.lax.while_loop(
      keep_decoding,
      lambda carry: _take_queued(step(carry), queue, refill=True),
      carry,
  )
  return out.pool, out.states, out.logits, _results(out)


def _first_carry(pool, states, logits, slot_inputs, chunk: int):
  """The decode loop's `_DecodeCarry` at a call's start, from its slots'
  values and tables (`slot_inputs` [S, _SLOT_COLUMNS + view])."""
  column = functools.partial(jnp.take, slot_inputs, axis=1)
  return _DecodeCarry(
      k=jnp.int32(0),
      pool=pool,
      states=states,
      logits=logits,
      steps=column(_STEPS),
      positions=column(_POSITIONS),
      budgets=column(_BUDGETS),
      rows=column(_ROWS),
      tables=slot_inputs[:, _SLOT_COLUMNS:],
      active=column(_ACTIVE) > 0,
      finished=jnp.int32(0),
      refilled=jnp.int32(0),
      taken=jnp.int32(0),
      # Rows -1 in the columns of steps the call does not take.
      records=jnp.full((_RECORDS, logits.shape[0], chunk), 0, jnp.int32)
      .at[2]
      .set(-1),
  )


def _results(out):
  """A replica's results of a call (`_DecodeCarry` after its loop): int32
  [S, _RECORDS * chunk + _FINALS] (`_unpack_decoded`)."""
  slots = out.steps.shape[0]
  finals = jnp.stack(
      [
          out.steps,
          out.positions,
          out.active.astype(jnp.int32),
          out.rows,
          jnp.full((slots,), out.taken, jnp.int32),
          jnp.full((slots,), out.k, jnp.int32),
      ],
      axis=1,
  )
  records = jnp.concatenate(list(out.records), axis=1)
  return jnp.concatenate([records, finals], axis=1)


def _keep_decoding(
    carry: _DecodeCarry, *, stop_after, chunk: int, replicas: int
):
  """Whether the decode loop takes another step.

  While fewer than `chunk` steps are taken, some slot runs, and fewer than
  `stop_after` sequences have finished without a queued continuation to
  take their slots.
  """
  going = jnp.stack(
      [jnp.any(carry.active), carry.finished - carry.refilled >= stop_after]
  )
  if replicas > 1:
    # Every replica steps while any has a running slot and none has
    # left the slots its host waits for idle: the one integer pair the
    # replicas exchange a step.
    going = jax.lax.psum(going.astype(jnp.int32), mesh_lib.DATA_AXIS)
  return (carry.k < chunk) & (going[0] > 0) & (going[1] == 0)


def _decode_step(
    carry: _DecodeCarry,
    *,
    params,
    seed_key,
    draw,
    stop_ids,
    config: model_config.ModelConfig,
    greedy: bool,
    filtered: bool,
    attention,
) -> _DecodeCarry:
  """One decode step of every slot: draw an id, then run the model on it.

  Each active slot draws its next id (the key folded from its row and
  step), records it, its log-probability, its row and step in column k,
  and finishes on a stop id or its budget; the others run the model on
  their id.
  """
  keys = jax.vmap(
      lambda r, s: jax.random.fold_in(jax.random.fold_in(seed_key, r), s)
  )(carry.rows, carry.steps)
  token, log_prob = sampling.choose_with_log_prob(
      carry.logits, keys, *draw, greedy=greedy, filtered=filtered
  )
  active = carry.active
  token = jnp.where(active, token, sampling.PAD_ID)
  steps = carry.steps + active
  done = active & (jnp.isin(token, stop_ids) | (steps >= carry.budgets))
  live = active & ~done
  column = jnp.stack(
      [
          token,
          jax.lax.bitcast_convert_type(
              jnp.where(active, log_prob, 0.0).astype(jnp.float32), jnp.int32
          ),
          jnp.where(active, carry.rows, -1),
          carry.steps,
          done.astype(jnp.int32),
      ]
  )
  # A finished sequence's last id needs no entry: nothing reads it.
  hidden, pool, states = paged_model.forward(
      params,
      token[:, None],
      carry.positions[:, None],
      live[:, None],
      carry.pool,
      carry.tables,
      config,
      carry.states,
      attention,
  )
  return carry._replace(
      k=carry.k + 1,
      pool=pool,
      states=states,
      logits=cached_model.logits(params, hidden)[:, 0],
      steps=steps,
      positions=carry.positions + live,
      active=live,
      finished=carry.finished + jnp.sum(done).astype(jnp.int32),
      records=carry.records.at[:, :, carry.k].set(column),
  )


@functools.partial(
    jax.jit,
    static_argnames=(
        "config",
        "chunk",
        "greedy",
        "filtered",
        "layout",
        "attention",
    ),
    donate_argnums=(1, 2, 3),
)
def _decode(
    params,
    pool,
    states,
    logits,
    ready_logits,
    ready_states,
    slot_inputs,
    seed_key,
    temperature,
    top_k,
    top_p,
    stop_ids,
    allowed_vocab,
    *,
    config: model_config.ModelConfig,
    chunk: int,
    greedy: bool,
    filtered: bool,
    layout,
    attention,
):
  """Up to `chunk` decode steps of every slot, each freed slot taking its
  replica's next queued continuation.

  Args:
    params: the model's parameters.
    pool: the page pool.
    states: the slots' recurrent states ({} without recurrent layers).
    logits: float32 [S, V]: each slot's next-token logits.
    ready_logits, ready_states: the prefilled contexts' logits [R * 2C, V]
      and states [L, R * 2C, ...] (`_stage`), which queued continuations
      start from.
    slot_inputs: int32 [S, _SLOT_COLUMNS + W + _QUEUE_COLUMNS + W]: each
      slot's values in the columns `_STEPS` .. `_QUEUED` (the call returns
      once any replica has left its slots' stop_after finished sequences
      without a successor), then its page table (W pages, local ids of the
      slot's replica), then its replica's queue (`_Q_POSITION` ..; one
      continuation a row).
    seed_key, temperature, top_k, top_p, stop_ids, allowed_vocab: as
      `decoder._generate`.
    config, chunk, greedy, filtered: static.
    layout: static (`replica_layout.Layout`): every [S, ...] array split
      over the replicas on its slot dimension, the pool on its pages.
    attention: static: `attention_of`'s.

  Returns:
    (pool, states, logits, decoded): decoded is the int32 [S, _RECORDS *
    chunk + _FINALS] of `_unpack_decoded`, whole on every device.
  """
  split = layout.split
  per_replica = _decode_per_replica(
      layout, config, chunk, greedy, filtered, attention
  )
  pool, states, logits, decoded = per_replica(
      params,
      pool,
      states,
      logits,
      ready_logits,
      ready_states,
      slot_inputs,
      seed_key,
      temperature,
      top_k,
      top_p,
      stop_ids,
      allowed_vocab,
  )
  # What the host reads comes back whole to every device (once a call, not
  # a step): a process reads only the arrays it holds every part of.
  return (
      layout.constrain(pool, layout.pool_spec()),
      layout.constrain(states, split(1)),
      layout.constrain(logits, split(0)),
      layout.constrain(decoded, P()),
  )


def _decode_per_replica(
    layout, config: model_config.ModelConfig, chunk, greedy, filtered, attention
):
  """`_decode_body` run on each replica's blocks of `_decode`'s arguments.

  The per-slot arrays, the ready buffers and the recurrent states are
  split on their slot (row) dimension, the pool on its pages; parameters
  and the draw's settings are whole on every replica.
  """
  split = layout.split
  return layout.per_replica(
      functools.partial(
          _decode_body,
          config=config,
          chunk=chunk,
          greedy=greedy,
          filtered=filtered,
          replicas=layout.replicas,
          attention=attention,
      ),
      # params, pool, states, logits, ready logits and states, slot_inputs,
      # the draw's six values.
      in_specs=(P(), split(1), split(1), split(0), split(0), split(1))
      + (split(0),)
      + (P(),) * 6,
      out_specs=(split(1), split(1), split(0), split(0)),
  )


@dataclasses.dataclass
class _Context:
  """A prefilled context: its replica, pages, row in its replica's ready
  buffers and the continuations yet to queue."""

  replica: int
  length: int
  pages: list  # Local ids in its replica's block.
  row: int  # Its local row in the ready buffers.
  waiting: int


@dataclasses.dataclass
class _Sequence:
  """A continuation, queued or in a slot."""

  row: int
  length: int  # Its context's.
  budget: int
  pages: list
  unallocated: int  # Pages reserved for it, not yet taken from the pool.
  replica: int


@dataclasses.dataclass
class _Queued:
  """A continuation in its replica's queue: the first slot to free on the
  device takes it, with its context's logits and states from the ready
  buffers' row `source` and its partial page's copy."""

  seq: _Sequence
  source: int
  copy: Optional[tuple[int, int]]  # (source, target) local page ids.


def table_width(
    config: model_config.ModelConfig, length: int, page_size: int
) -> int:
  """The pages of a slot's table for sequences of up to `length` positions
  (context plus max_new_tokens): the pages of the length bucket
  (`decoder.cache_length`), so the pool's and tables' shapes, and the
  programs, depend on the bucket only."""
  return _pages(
      decoder.cache_length(length, config.max_sequence_length), page_size
  )


def _round_up(count: int, multiple: int) -> int:
  return -(-count // multiple) * multiple


def replica_slots(slots: int, replicas: int) -> int:
  """The engine's slots for `slots` asked of `replicas` data-parallel
  replicas: rounded up to a multiple of them, so each replica has the
  same number (S / R)."""
  return _round_up(slots, replicas)


def pool_pages(
    engine: EngineOptions, slots: int, width: int, replicas: int = 1
) -> int:
  """The pool's pages over all replicas: `engine.num_pages` rounded up to
  a multiple of `replicas`, or by default (slots + replicas) x the widest
  table: each replica's slots' longest sequences plus one waiting context
  (`EngineOptions.num_pages`)."""
  if engine.num_pages:
    return _round_up(engine.num_pages, replicas)
  return (slots + replicas) * width


def prefill_length(
    config: model_config.ModelConfig, longest: int, page_size: int
) -> int:
  """The prefill program's tokens for contexts of up to `longest` ids: their
  length bucket, in whole pages."""
  bucket = decoder.cache_length(longest, config.max_sequence_length)
  return _pages(bucket, page_size) * page_size


def prefill_chunk(engine: EngineOptions, length: int) -> int:
  """The positions of a context one prefill call writes, for contexts of
  the length bucket `length`: all of them, or `engine.prefill_tokens` (a
  longer context is prefilled by several calls)."""
  return min(length, engine.prefill_tokens)


def prefill_contexts(
    engine: EngineOptions, length: int, local_slots: int, num_samples: int
) -> int:
  """The most contexts one prefill call writes per replica: enough to fill
  a replica's slots with their `num_samples` continuations each, within
  `engine.prefill_tokens` tokens of `length` (the prefill chunk); at
  least one."""
  return _bucket(
      -(-local_slots // num_samples), max(engine.prefill_tokens // length, 1)
  )


def _bucket(count: int, limit: int) -> int:
  """The smallest power of two >= count, at most `limit`."""
  return min(1 << max(count - 1, 0).bit_length(), limit)


def _buckets(limit: int) -> list[int]:
  """Every value `_bucket(count, limit)` takes: 1, 2, 4, .. up to limit."""
  sizes = [1]
  while sizes[-1] < limit:
    sizes.append(min(2 * sizes[-1], limit))
  return sizes


def _signature(tree: Any) -> tuple:
  """What a program compiled for `tree`'s arrays depends on: its
  structure, shapes, dtypes and placements."""
  leaves, structure = jax.tree_util.tree_flatten(tree)
  return structure, tuple(
      (x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves
  )


# The engine shapes whose programs a call in this process has run once
# (`_Run.warm_up`): a later call of the same shapes finds them compiled.
_WARM: set = set()


def _sampling_args(options, allowed_vocab: int, layout) -> tuple:
  """The decode program's sampling values on the engine's devices: the
  seed's key, temperature, top_k, top_p, stop ids (padded with -1 to a
  multiple of `_STOP_SLOTS`) and allowed_vocab."""
  stop_slots = -(-max(len(options.stop_ids), 1) // _STOP_SLOTS) * _STOP_SLOTS
  stop_ids = np.full((stop_slots,), -1, np.int32)
  stop_ids[: len(options.stop_ids)] = options.stop_ids
  put = layout.put
  return (
      put(jax.random.PRNGKey(options.seed)),
      put(np.float32(1.0 if options.greedy else options.temperature)),
      put(np.int32(options.top_k)),
      put(np.float32(options.top_p)),
      put(stop_ids),
      put(np.int32(allowed_vocab)),
  )


class _Run:
  """One `generate` call: the host's books (slots, pages, waiting
  sequences, the rows' ids) and the device's pool, states and logits.

  Device calls: a prefill writes up to `most_contexts` contexts per
  replica, and one stage call copies their logits and states into the
  ready buffers; a decode call runs up to `engine.chunk` steps, its free
  slots taking the continuations queued for them. Each takes its host
  values as one array or a few.

  Each replica's ready buffers hold two generations of its prefilled
  contexts (rows g * C .. (g + 1) * C - 1), written in turn: a replica is
  prefilled when it has more free slots than queued continuations, none
  ready, and no queued continuation starting from the generation the
  prefill writes. (The next decode call starts every continuation queued
  before then: they lead the queue, and there are free slots for them.)
  """

  def __init__(
      self,
      params,
      config: model_config.ModelConfig,
      contexts,
      budgets,
      options,
      shape,
      allowed_vocab,
  ):
    self.params, self.config, self.contexts = params, config, contexts
    self.budgets, self.options = budgets, options
    self.engine, self.layout, self.attention = shape
    self.g = options.num_samples
    rows = len(contexts) * self.g
    size = self.engine.page_size
    replicas = self.layout.replicas
    self.slots = replica_slots(self.engine.num_slots or rows, replicas)
    self.local_slots = self.slots // replicas
    longest = max(len(c) for c in contexts)
    # The widest table: the pages of the longest sequence's length bucket
    # (the static decoder's).
    self.width = table_width(config, longest + options.max_new_tokens, size)
    self.num_pages = pool_pages(self.engine, self.slots, self.width, replicas)
    self.local_pages = self.num_pages // replicas
    # One prefill length per call: the longest context's length bucket,
    # prefilled in chunks of `self.chunk` positions.
    self.bucket = prefill_length(config, longest, size)
    self.chunk = prefill_chunk(self.engine, self.bucket)
    self.most_contexts = prefill_contexts(
        self.engine, self.chunk, self.local_slots, self.g
    )
    self.books = [page_pool.PagePool(self.local_pages) for _ in range(replicas)]
    # Pages promised to each replica's admitted sequences, not yet taken.
    self.reserved = [0] * replicas
    # Slot s belongs to replica s // local_slots; its table holds local
    # ids. The decode program's per-slot values and tables are one array
    # (`_SLOT_COLUMNS`), of which these are views.
    self.slot_inputs = np.zeros(
        (self.slots, _SLOT_COLUMNS + self.width), np.int32
    )
    self.slot_values = self.slot_inputs[:, :_SLOT_COLUMNS]
    self.tables = self.slot_inputs[:, _SLOT_COLUMNS:]
    self.slot_values[:, _BUDGETS] = 1
    # Each slot's pages in its table, and the last position its sequence
    # may write (context + budget - 1).
    self.slot_pages = np.zeros((self.slots,), np.int64)
    self.slot_ends = np.zeros((self.slots,), np.int64)
    self.in_slot: list[Optional[_Sequence]] = [None] * self.slots
    self.to_prefill = collections.deque(range(len(contexts)))
    # Each replica's continuations of its prefilled contexts, waiting for
    # a place in its queue: (context index, sample, _Context).
    self.ready = [collections.deque() for _ in range(replicas)]
    # Each replica's queued continuations (pages taken), in queue order.
    self.queued = [collections.deque() for _ in range(replicas)]
    # The generation (0 or 1) of each replica's ready buffer rows that
    # its next prefill writes.
    self.generation = [0] * replicas
    self.figures = collections.Counter()
    new = options.max_new_tokens
    self.ids = np.full((rows, new), sampling.PAD_ID, np.int32)
    self.log_probs = np.zeros((rows, new), np.float32)
    self.lengths = np.zeros((rows,), np.int32)
    self.pool = _empty_pool(
        config=config,
        num_pages=self.num_pages,
        page_size=size,
        layout=self.layout,
        attention=self.attention,
    )
    self.states, self.logits, self.ready_states, self.ready_logits = (
        _empty_slots(
            config=config,
            slots=self.slots,
            ready=replicas * 2 * self.most_contexts,
            layout=self.layout,
        )
    )
    self.sampling_args = _sampling_args(options, allowed_vocab, self.layout)

  def free(self, replica: int) -> int:
    """A replica's pages neither held nor promised."""
    return self.books[replica].free - self.reserved[replica]

  def new_pages(self, context: _Context, budget: int) -> int:
    """Pages a continuation takes from the pool over its life."""
    size = self.engine.page_size
    # The last id is never written: positions 0..length + budget - 2.
    lifetime = _pages(context.length + budget - 1, size)
    full = context.length // size
    takes_over = context.length % size and context.waiting == 1
    return lifetime - full - int(takes_over)

  def prefill(self, assigned: dict, count: int, calls: int = 0) -> None:
    """Prefills the contexts assigned[r] (a list of (context index,
    pages)) into each replica r given, in calls of `count` contexts a
    replica and `self.chunk` positions, one per chunk of the longest (or
    `calls`), and stages them in the ready buffers' next generation of
    their replicas' rows."""
    rows = self.layout.replicas * count
    size = self.engine.page_size
    ids = np.full((rows, self.bucket), sampling.PAD_ID, np.int32)
    bounds = np.zeros((rows, 2), np.int32)
    table = np.zeros((rows, self.bucket // size), np.int32)
    # Each prefilled row's ready row (2C: none).
    ready_rows = np.full((rows,), 2 * self.most_contexts, np.int32)
    for replica, taken in assigned.items():
      first = self.generation[replica] * self.most_contexts
      for c, (index, pages) in enumerate(taken):
        row = replica * count + c
        ids[row, : len(self.contexts[index])] = self.contexts[index]
        bounds[row, 1] = len(self.contexts[index])
        table[row, : len(pages)] = pages
        ready_rows[row] = first + c
    put, split = self.layout.put, self.layout.split
    table = put(table, split(0))
    states, logits = None, None
    calls = calls or -(-int(bounds[:, 1].max()) // self.chunk)
    for start in range(0, calls * self.chunk, self.chunk):
      bounds[:, 0] = start
      self.pool, logits, states = _prefill(
          self.params,
          self.pool,
          states,
          logits,
          put(ids[:, start : start + self.chunk], split(0)),
          put(bounds, split(0)),
          table,
          config=self.config,
          layout=self.layout,
          attention=self.attention,
      )
      if assigned:
        self.figures["prefill_calls"] += 1
    self.ready_logits, self.ready_states = _stage(
        self.ready_logits,
        self.ready_states,
        logits,
        states,
        put(ready_rows, split(0)),
        layout=self.layout,
    )
    for replica, taken in assigned.items():
      for c, (index, pages) in enumerate(taken):
        self.figures["prefill_passes"] += 1
        context = _Context(
            replica,
            len(self.contexts[index]),
            pages,
            int(ready_rows[replica * count + c]),
            self.g,
        )
        self.ready[replica].extend(
            (index, sample, context) for sample in range(self.g)
        )
      self.generation[replica] ^= 1

  def queue(self, index, sample, context) -> _Queued:
    """Queues continuation `sample` of context `index`: its pages (the
    context's full pages shared, its partial page copied or taken over,
    the pages of its first chunk) and its values for the slot that takes
    it."""
    size = self.engine.page_size
    book = self.books[context.replica]
    row = index * self.g + sample
    budget = self.budgets[row]
    full = context.length // size
    pages = context.pages[:full]
    book.share(pages)
    fresh = self.new_pages(context, budget)
    copy = None
    if context.length % size:
      if context.waiting > 1:
        (target,) = book.allocate(1)
        fresh -= 1
        copy = (context.pages[full], target)
        pages = pages + [target]
        self.figures["page_copies"] += 1
      else:
        pages = pages + [context.pages[full]]
    context.waiting -= 1
    if not context.waiting:
      book.release(context.pages[:full])
    self.reserved[context.replica] += fresh
    seq = _Sequence(row, context.length, budget, pages, fresh, context.replica)
    # The pages of its first chunk, which it may write in the call that
    # starts it, at any of the call's steps.
    self.take_pages(context.replica, seq, context.length + self.engine.chunk)
    queued = _Queued(seq, context.row, copy)
    self.queued[context.replica].append(queued)
    return queued

  def take_pages(self, replica: int, seq: _Sequence, positions: int) -> int:
    """Takes from the pool the pages `seq` needs for its first `positions`
    positions (at most its own), reserved for it at its admission; returns
    how many."""
    size = self.engine.page_size
    last = min(positions, seq.length + seq.budget - 1)
    count = max(-(-last // size) - len(seq.pages), 0)
    if count:
      seq.pages.extend(self.books[replica].allocate(count))
      seq.unallocated -= count
      self.reserved[replica] -= count
    return count

  def fill_slots(self) -> None:
    """Queues each replica's ready continuations (as many as its pages
    take, up to its slots), and prefills waiting contexts for replicas
    with more free slots than queued continuations and none ready, until
    neither makes progress."""
    while True:
      # Each replica's free slots that no continuation will take.
      wanting = {}
      for replica in range(self.layout.replicas):
        ready, queued = self.ready[replica], self.queued[replica]
        while ready and len(queued) < self.local_slots:
          index, sample, context = ready[0]
          budget = self.budgets[index * self.g + sample]
          if self.free(replica) < self.new_pages(context, budget):
            break
          self.queue(*ready.popleft())
        first = replica * self.local_slots
        free = sum(
            self.in_slot[s] is None
            for s in range(first, first + self.local_slots)
        )
        # A prefill writes the replica's next generation of ready rows:
        # not while a queued continuation still starts from them.
        rows = range(
            self.generation[replica] * self.most_contexts,
            (self.generation[replica] + 1) * self.most_contexts,
        )
        if (
            free > len(queued)
            and not ready
            and not any(q.source in rows for q in queued)
        ):
          wanting[replica] = free - len(queued)
      assigned = self.assign(wanting)
      if not assigned:
        return
      most = max(len(taken) for taken in assigned.values())
      self.prefill(assigned, _bucket(most, self.most_contexts))

  def assign(self, wanting: dict) -> dict:
    """Waiting contexts for the replicas with free slots and nothing ready,
    their pages taken: each context goes to the wanting replica with the
    most free pages, until each has contexts for its free slots (or
    `most_contexts`) or the next does not fit. Returns {replica: [(context
    index, pages)]}."""
    size = self.engine.page_size

    def first_run(length):
      # The fresh pages a context's first continuation takes at most.
      return (
          _pages(length + self.options.max_new_tokens - 1, size)
          - length // size
      )

    assigned = {}
    while self.to_prefill and wanting:
      replica = max(wanting, key=self.free)
      length = len(self.contexts[self.to_prefill[0]])
      need = _pages(length, size)
      taken = assigned.get(replica, [])
      if taken:
        # A replica's further contexts leave room for the first
        # continuation of each context it takes, so its prompts' pages
        # never keep every continuation waiting.
        need_more = first_run(length) + sum(
            first_run(len(self.contexts[index])) for index, _ in taken
        )
        if self.free(replica) < need + need_more:
          del wanting[replica]
          continue
      elif self.free(replica) < need:
        break
      taken = assigned.setdefault(replica, [])
      taken.append(
          (self.to_prefill.popleft(), self.books[replica].allocate(need))
      )
      wanting[replica] -= self.g
      if wanting[replica] <= 0 or len(taken) == self.most_contexts:
        del wanting[replica]
    return assigned

  def queue_inputs(self, view: int) -> np.ndarray:
    """Each replica's queue as the decode program's rows
    (`_QUEUE_COLUMNS` and `view` pages): its first local_slots queued
    continuations, one a row of its slots' block."""
    rows = np.zeros((self.slots, _QUEUE_COLUMNS + view), np.int32)
    rows[:, _Q_COPY_TO] = self.local_pages
    for replica, queued in enumerate(self.queued):
      first = replica * self.local_slots
      for i, entry in enumerate(queued):
        seq, at = entry.seq, first + i
        rows[at, _Q_POSITION] = seq.length
        rows[at, _Q_BUDGET] = seq.budget
        rows[at, _Q_ROW] = seq.row
        rows[at, _Q_SOURCE] = entry.source
        if entry.copy is not None:
          rows[at, _Q_COPY_FROM : _Q_COPY_TO + 1] = entry.copy
        pages = seq.pages[:view]
        rows[at, _QUEUE_COLUMNS : _QUEUE_COLUMNS + len(pages)] = pages
      self.slot_values[first : first + self.local_slots, _QUEUED] = len(queued)
    return rows

  def decode(self, view: int, stop_after) -> jax.Array:
    """One `_decode` call over the tables' first `view` pages, each
    replica's free slots taking its queued continuations, each replica
    returning once stop_after[r] of its sequences have finished with no
    queued successor; returns its packed results (`_unpack_decoded`)."""
    self.slot_values[:, _STOP_AFTER] = np.repeat(stop_after, self.local_slots)
    queue = self.queue_inputs(view)
    inputs = np.concatenate(
        [self.slot_inputs[:, : _SLOT_COLUMNS + view], queue], axis=1
    )
    self.pool, self.states, self.logits, out = _decode(
        self.params,
        self.pool,
        self.states,
        self.logits,
        self.ready_logits,
        self.ready_states,
        self.layout.put(inputs, self.layout.split(0)),
        *self.sampling_args,
        config=self.config,
        chunk=self.engine.chunk,
        greedy=self.options.greedy,
        filtered=self.options.filtered,
        layout=self.layout,
        attention=self.attention,
    )
    return out

  def warm_up(self) -> None:
    """Runs every program this call's shapes can need, once per process
    and shapes: each view bucket's decode program with no slot active and
    nothing queued (it stops before its first step), and each prefill
    size's with no context (it writes nothing) and its stage program (it
    stages nothing). A call then compiles all its programs up front, and a
    warm-up call leaves nothing to compile for later calls of the same
    buckets, however long their sequences grow."""
    key = (
        self.config,
        self.engine,
        self.options.greedy,
        self.options.filtered,
        self.layout,
        self.attention,
        self.slots,
        self.width,
        self.num_pages,
        self.bucket,
        self.most_contexts,
        _signature(self.params),
    )
    if key in _WARM:
      return
    idle = np.ones((self.layout.replicas,), np.int32)
    for view in _buckets(self.width):
      self.decode(view, idle)
    # A first chunk's program, and one running on from a chunk before.
    calls = 1 if self.bucket <= self.chunk else 2
    for count in _buckets(self.most_contexts):
      self.prefill({}, count, calls)
    _WARM.add(key)

  def reserve_chunk(self, running: list) -> None:
    """Takes from the pool the pages the running slots' next chunk may
    write (reserved for them at admission)."""
    size = self.engine.page_size
    last = np.minimum(
        self.slot_values[running, _POSITIONS] + self.engine.chunk,
        self.slot_ends[running],
    )
    more = -(-last // size) - self.slot_pages[running]
    for slot in np.asarray(running)[more > 0]:
      seq = self.in_slot[slot]
      replica = slot // self.local_slots
      before = len(seq.pages)
      count = self.take_pages(
          replica,
          seq,
          int(self.slot_values[slot, _POSITIONS]) + self.engine.chunk,
      )
      self.tables[slot, before : before + count] = seq.pages[before:]
      self.slot_pages[slot] += count

  def collect(self, out) -> None:
    """A decode call's new ids into their rows; the queued continuations
    it started into their slots; finished sequences leave their slots
    and pages."""
    decoded = _unpack_decoded(jax.device_get(out), self.engine.chunk)
    finals = decoded.finals
    self.figures["decode_calls"] += 1
    self.figures["decode_steps"] += int(np.max(finals[:, _FINAL_CALL_STEPS]))
    drawn = decoded.rows >= 0
    rows, at = decoded.rows[drawn], decoded.steps[drawn]
    self.ids[rows, at] = decoded.ids[drawn]
    self.log_probs[rows, at] = decoded.log_probs[drawn]
    # The sequences that ran in this call: those in slots before it, and
    # those it took from the queues.
    running = {seq.row: seq for seq in self.in_slot if seq is not None}
    for replica, queued in enumerate(self.queued):
      taken = int(finals[replica * self.local_slots, _FINAL_TAKEN])
      for _ in range(taken):
        entry = queued.popleft()
        running[entry.seq.row] = entry.seq
    for row, step in zip(
        decoded.rows[decoded.done], decoded.steps[decoded.done]
    ):
      seq = running.pop(int(row))
      replica = seq.replica
      self.lengths[seq.row] = step + 1
      self.books[replica].release(seq.pages)
      self.reserved[replica] -= seq.unallocated
    self.set_slots(finals, running)

  def set_slots(self, finals: np.ndarray, running: dict) -> None:
    """The host's slot values and tables after a decode call: each slot's
    running sequence (`running`, by row) at its final step and position."""
    active = finals[:, _FINAL_ACTIVE] > 0
    for slot in range(self.slots):
      seq = (
          running.get(int(finals[slot, _FINAL_ROWS])) if active[slot] else None
      )
      if seq is self.in_slot[slot]:
        continue
      self.in_slot[slot] = seq
      self.tables[slot] = 0
      if seq is None:
        self.slot_pages[slot] = 0
        self.slot_values[slot, _BUDGETS] = 1
        continue
      self.tables[slot, : len(seq.pages)] = seq.pages
      self.slot_pages[slot] = len(seq.pages)
      self.slot_ends[slot] = seq.length + seq.budget - 1
      self.slot_values[slot, _BUDGETS] = seq.budget
      self.slot_values[slot, _ROWS] = seq.row
    self.slot_values[:, _STEPS] = finals[:, _FINAL_STEPS]
    self.slot_values[:, _POSITIONS] = finals[:, _FINAL_POSITIONS]
    self.slot_values[:, _ACTIVE] = active

  def run(self) -> None:
    """Decodes until every row has finished."""
    replicas, size = self.layout.replicas, self.engine.page_size
    while True:
      self.fill_slots()
      running = [s for s in range(self.slots) if self.in_slot[s] is not None]
      if not running and not any(self.queued):
        if any(self.ready) or self.to_prefill:
          each = (
              f" ({self.local_pages} for each of {replicas} data replicas)"
              if replicas > 1
              else ""
          )
          raise ValueError(
              f"num_pages={self.num_pages} pages of {size}{each} cannot "
              "hold one sequence (its context plus max_new_tokens): give "
              "more pages"
          )
        return
      self.reserve_chunk(running)
      widest = max(
          [len(self.in_slot[s].pages) for s in running]
          + [len(q.seq.pages) for queued in self.queued for q in queued]
      )
      self.collect(self.decode(_bucket(widest, self.width), self.stop_after()))

  def stop_after(self) -> np.ndarray:
    """Each replica's finished sequences without a queued successor at
    which a decode call returns: with work waiting beyond its queue,
    `engine.refill` or as many as wait (so a slot is refilled within a
    step of its freeing at refill 1); else never (its slots + 1)."""
    waiting_contexts = len(self.to_prefill) * self.g
    return np.array(
        [
            min(self.engine.refill, len(ready) + waiting_contexts)
            if ready or waiting_contexts
            else self.local_slots + 1
            for ready in self.ready
        ],
        np.int32,
    )

  def result(self) -> "EngineGeneration":
    """The rows and the run's figures."""
    page_bytes = paged_model.pool_bytes(
        self.config, 1, self.engine.page_size, self.attention
    )
    state_bytes = kv_cache.state_bytes_per_row(self.config) * self.slots
    pages_used = sum(book.peak_in_use for book in self.books)
    return EngineGeneration(
        ids=self.ids,
        lengths=self.lengths,
        log_probs=self.log_probs,
        cache_bytes=page_bytes * self.num_pages + state_bytes,
        peak_bytes=page_bytes * pages_used + state_bytes,
        pages_used=pages_used,
        prefill_passes=self.figures["prefill_passes"],
        prefill_calls=self.figures["prefill_calls"],
        decode_calls=self.figures["decode_calls"],
        decode_steps=self.figures["decode_steps"],
        page_copies=self.figures["page_copies"],
    )


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
  run = _Run(
      decode_weights.cast(params, config.compute_dtype),
      config,
      contexts,
      budgets,
      options,
      (engine, layout, attention_of(engine, config, layout)),
      allowed_vocab,
  )
  run.warm_up()
  run.run()
  return run.result()


@dataclasses.dataclass(frozen=True)
class LoweredEngine:
  """The engine's programs lowered for abstract arguments (`lower`).

  Attributes:
    programs: "prefill" (a chunk of `prefill_chunk` positions of its most
      contexts per data replica, `prefill_contexts` for one sample a
      context, running on from a chunk before where `prefill_length` takes
      more than one) and "decode" (`chunk` steps of every slot over the
      widest table), as `jax.stages.Lowered`.
    pool: the page pool's shapes and shardings.
    states: the slots' recurrent states' ({} without recurrent layers).
    logits: the slots' next-token logits'.
    num_slots: the slots (`replica_slots`: a multiple of the replicas).
    num_pages: the pool's pages (all replicas').
    width: pages of a slot's table.
    prefill_length: tokens of the prefill program.
  """

  programs: dict
  pool: Any
  states: Any
  logits: Any
  num_slots: int
  num_pages: int
  width: int
  prefill_length: int


def check_lowering(
    config: model_config.ModelConfig,
    num_slots: int,
    length: int,
    prompt_length: int,
) -> None:
  """`lower`'s shape arguments, checked.

  Raises:
    TypeError/ValueError: one line naming the argument.
  """
  checks.check_int("num_slots", num_slots, 1)
  checks.check_int("length", length, 2)
  if length > config.max_sequence_length:
    raise ValueError(
        f"length={length} exceeds max_sequence_length="
        f"{config.max_sequence_length}"
    )
  checks.check_int("prompt_length", prompt_length, 1)
  if prompt_length >= length:
    raise ValueError(
        f"prompt_length={prompt_length} leaves no new token of length="
        f"{length}"
    )


def lower(
    params: Any,
    config: model_config.ModelConfig,
    *,
    num_slots: int,
    length: int,
    prompt_length: int,
    engine: EngineOptions = EngineOptions(),
    mesh: Optional[jax.sharding.Mesh] = None,
) -> LoweredEngine:
  """Lowers the prefill and decode programs `generate` runs, unrun.

  The arguments are the ones `generate` passes for `num_slots` slots
  (rounded up to a multiple of the mesh's data replicas,
  `replica_slots`) of sequences of up to `length` positions (context plus
  max_new_tokens) and contexts of up to `prompt_length` ids: the pool and
  the per-slot arrays split over the replicas as `replica_layout` says,
  the parameters as `params`' shapes and shardings say. Prefill takes
  its most contexts per replica (`prefill_contexts`, one sample each: the
  most memory of its sizes). Decode is the widest view's (every page of a
  table: the most memory of the view buckets), drawing by temperature
  without top-k or top-p (as a rollout at temperature 1 and top-p 1
  does).

  Args:
    params: the parameters' `jax.ShapeDtypeStruct`s (with shardings on
      `mesh`).
    config: the model's config or the run's.
    num_slots: sequences decoded together (>= 1).
    length: positions of the longest sequence (<= max_sequence_length).
    prompt_length: ids of the longest context (< length).
    engine: page size, pages (0 = `pool_pages`' default) and chunk; its
      num_slots is not read.
    mesh: the devices' mesh; None = one device.

  Returns:
    The programs and the engine's arrays' shapes.

  Raises:
    ValueError: a length or slot count out of range (one line).
  """
  config = model_config.of(config)
  check_lowering(config, num_slots, length, prompt_length)
  layout = replica_layout.for_model(config, mesh)
  attention = attention_of(engine, config, layout)
  num_slots = replica_slots(num_slots, layout.replicas)
  width = table_width(config, length, engine.page_size)
  num_pages = pool_pages(engine, num_slots, width, layout.replicas)
  bucket = prefill_length(config, prompt_length, engine.page_size)
  abstract = _Abstract(layout)
  pool = abstract.pool(config, num_pages, engine.page_size, attention)
  states = abstract.states(config, num_slots)
  logits = abstract.array(
      jnp.float32, num_slots, config.vocab_size, spec=layout.split(0)
  )
  with _lowering_device(mesh):
    prefill = _lower_prefill(
        params, pool, config, layout, attention, engine, num_slots, bucket
    )
    decode = _lower_decode(
        params,
        pool,
        states,
        logits,
        config,
        layout,
        attention,
        engine,
        (width, bucket),
    )
  return LoweredEngine(
      programs={"prefill": prefill, "decode": decode},
      pool=pool,
      states=states,
      logits=logits,
      num_slots=num_slots,
      num_pages=num_pages,
      width=width,
      prefill_length=bucket,
  )


class _Abstract:
  """Abstract arrays (`jax.ShapeDtypeStruct`s) sharded by a replica layout."""

  def __init__(self, layout: replica_layout.Layout):
    self._layout = layout

  def tree(self, tree, spec):
    """`tree`'s abstract arrays, each with `spec`'s sharding."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=self._layout.sharding(spec)
        ),
        tree,
    )

  def array(self, dtype, *dims, spec=P()):
    """One abstract array of shape `dims`, with `spec`'s sharding."""
    return jax.ShapeDtypeStruct(
        dims, dtype, sharding=self._layout.sharding(spec)
    )

  def pool(
      self,
      config: model_config.ModelConfig,
      num_pages: int,
      page_size: int,
      attention,
  ):
    """The page pool of `num_pages` pages, sharded as the layout's pool."""
    return self.tree(
        jax.eval_shape(
            functools.partial(
                paged_model.init_pool, config, num_pages, page_size, attention
            )
        ),
        self._layout.pool_spec(),
    )

  def states(self, config: model_config.ModelConfig, rows: int):
    """The recurrent states of `rows` sequences, split over the replicas."""
    return self.tree(
        jax.eval_shape(functools.partial(kv_cache.init_states, config, rows)),
        self._layout.split(1),
    )


def _lowering_device(mesh: Optional[jax.sharding.Mesh]):
  """The target's device as the default while lowering.

  A Pallas TPU kernel's lowering reads the chip's kind from it (a TPU slice
  described on a CPU host is not the default backend).
  """
  if mesh is None:
    return contextlib.nullcontext()
  return jax.default_device(mesh.devices.flat[0])


def _lower_prefill(
    params,
    pool,
    config: model_config.ModelConfig,
    layout,
    attention,
    engine,
    num_slots,
    bucket,
):
  """The largest prefill program `lower` describes, lowered.

  A context per sample (num_samples 1), the most contexts a replica takes
  into one call; a chunk running on from chunks before where the contexts
  take more than one (it holds their states and logits too), else a first
  one.
  """
  size = engine.page_size
  chunk = prefill_chunk(engine, bucket)
  replicas = layout.replicas
  rows = replicas * prefill_contexts(engine, chunk, num_slots // replicas, 1)
  abstract, split, i32 = _Abstract(layout), layout.split, jnp.int32
  first = chunk == bucket
  return _prefill.lower(
      params,
      pool,
      None if first else abstract.states(config, rows),
      (
          None
          if first
          else abstract.array(
              jnp.float32, rows, config.vocab_size, spec=split(0)
          )
      ),
      abstract.array(i32, rows, chunk, spec=split(0)),
      abstract.array(i32, rows, 2, spec=split(0)),
      abstract.array(i32, rows, bucket // size, spec=split(0)),
      config=config,
      layout=layout,
      attention=attention,
  )


def _lower_decode(
    params,
    pool,
    states,
    logits,
    config: model_config.ModelConfig,
    layout,
    attention,
    engine,
    shape: tuple[int, int],
):
  """The decode program `lower` describes, lowered.

  Every slot over the widest table (`shape`: its `width` pages, and the
  prefill `bucket`, whose most contexts the ready buffers hold), drawing
  by temperature without top-k or top-p.
  """
  width, bucket = shape
  abstract, split, i32 = _Abstract(layout), layout.split, jnp.int32
  num_slots = logits.shape[0]
  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  # The ready buffers: two generations of a replica's most contexts a
  # prefill call takes (one sample each, as `_lower_prefill`).
  ready = (
      layout.replicas
      * 2
      * prefill_contexts(
          engine, prefill_chunk(engine, bucket), num_slots // layout.replicas, 1
      )
  )
  return _decode.lower(
      params,
      pool,
      states,
      logits,
      abstract.array(jnp.float32, ready, config.vocab_size, spec=split(0)),
      abstract.states(config, ready),
      abstract.array(
          i32,
          num_slots,
          _SLOT_COLUMNS + _QUEUE_COLUMNS + 2 * width,
          spec=split(0),
      ),
      abstract.array(key.dtype, *key.shape),
      abstract.array(jnp.float32),  # temperature
      abstract.array(i32),  # top_k
      abstract.array(jnp.float32),  # top_p
      abstract.array(i32, _STOP_SLOTS),
      abstract.array(i32),  # allowed_vocab
      config=config,
      chunk=engine.chunk,
      greedy=False,
      filtered=False,
      layout=layout,
      attention=attention,
  )
