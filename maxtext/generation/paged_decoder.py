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

Programs: prefill is compiled once per length bucket of a call's longest
context (the decoder's `cache_length` buckets; every context of a call is
prefilled in that shape); the decode program once per power-of-two number
of pages a slot may see (`view` buckets up to the pages of the longest
sequence's bucket), all of them on a call's first use of its shapes;
setting a slot's logits and copying a page once each. None depends
on a request. A decode call runs up to `EngineOptions.chunk` steps on the
device and returns early once a slot has finished while sequences wait, so
a slot is refilled within a step of freeing.

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
is prefilled into the replica, among those with a free slot and no
continuation ready, that has the most free (unreserved) pages; one prefill
call takes a context for each such replica (the others' rows are empty
and write nothing). Its continuations run in that replica's slots only,
sharing its pages, and each replica fills its own free slots from its own
ready continuations. The decode program's replicas step together: the
call stops once any replica with work waiting has finished a sequence
(the one value they exchange, an integer pair a step), or when no replica
has a running one. Draws are keyed by (row, step), so the ids do not
depend on the replica either. `EngineGeneration`'s pages and bytes are
summed over the replicas (`pages_used`: the sum of each replica's most
pages in use, the pages the replicas' blocks must hold). With R = 1 (no
"data" axis, or one device) the programs run without `shard_map`.
"""

import collections
import contextlib
import dataclasses
import functools
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import checks
from maxtext.generation import cached_model
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
    chunk: most decode steps one program call runs before the host
      refills slots (it returns early when a slot frees while sequences
      wait).
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
    prefill_passes: contexts prefilled (each once; one call prefills a
      context for each of several replicas).
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
  decode_calls: int
  decode_steps: int
  page_copies: int


def _pages(positions: int, page_size: int) -> int:
  return -(-positions // page_size)


def pool_sharding(
    config, mesh: Optional[jax.sharding.Mesh]
) -> Optional[jax.sharding.NamedSharding]:
  """Where the page pool's [L, N, P, K, D] leaves live on `mesh` (None:
  one device): the pages split over the data-parallel replicas (the mesh's
  "data" axis), the key/value heads over its tensor axis where that
  divides them (`replica_layout`)."""
  layout = replica_layout.for_model(config, mesh)
  return layout.sharding(layout.pool_spec())


def kernel_fits(config, layout) -> Optional[str]:
  """Why the ragged paged attention kernel cannot serve this model and
  layout, or None when it can: grouped-query attention (MLA's latents are
  not keys and values), heads of a multiple of 128 (the TPU's lanes), a
  pool whose heads are not split over a tensor axis (the kernel sees one
  device's pool), compiled for a TPU."""
  if config.attention_type == "mla":
    return "multi-head latent attention keeps latents, not keys and values"
  if config.head_dim % 128:
    return f"head_dim={config.head_dim} is not a multiple of 128"
  if layout.heads_axis is not None:
    return "the pool's heads are split over the tensor axis"
  platform = layers.target_platform(layout.mesh)
  if platform != "tpu":
    return f"the kernel runs on a TPU, not on {platform}"
  return None


def attention_of(engine: EngineOptions, config, layout):
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


def _prefill_body(params, pool, tokens, length, table, *, config, attention):
  """One replica's prefill of one context (tokens [1, T], length [1],
  table [1, T / P]): (pool, logits [1, V] of its last position, its
  recurrent states [L, 1, ...]). A length of 0 writes nothing (its logits
  and states are not read)."""
  positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
  hidden, pool, states = paged_model.forward(
      params,
      tokens,
      positions,
      positions < length[:, None],
      pool,
      table,
      config,
      kv_cache.init_states(config, 1),
      attention,
  )
  last = jax.lax.dynamic_index_in_dim(hidden, length[0] - 1, 1)
  return pool, cached_model.logits(params, last)[:, 0], states


@functools.partial(
    jax.jit,
    static_argnames=("config", "layout", "attention"),
    donate_argnums=(1,),
)
def _prefill(
    params, pool, tokens, lengths, tables, *, config, layout, attention
):
  """Writes up to one context per replica into its pages.

  Args:
    params: the model's parameters.
    pool: the page pool.
    tokens: int32 [R, T]: replica r's context, right-padded.
    lengths: int32 [R]: the contexts' ids; 0 for a replica with none
      (it writes nothing).
    tables: int32 [R, T / P]: each context's pages (the replica's local
      ids).
    config, layout: static (`replica_layout.Layout`).
    attention: static: `attention_of`'s.

  Returns:
    (pool, logits float32 [R, V] of each context's last position, their
    recurrent states [L, R, ...] ({} without recurrent layers)), split
    over the replicas as the engine's other arrays are, so every call
    takes and returns the same layouts.
  """
  split = layout.split
  pool, logits, states = layout.per_replica(
      functools.partial(_prefill_body, config=config, attention=attention),
      in_specs=(P(), split(1), split(0), split(0), split(0)),
      out_specs=(split(1), split(0), split(1)),
  )(params, pool, tokens, lengths, tables)
  return (
      layout.constrain(pool, layout.pool_spec()),
      layout.constrain(logits, split(0)),
      layout.constrain(states, split(1)),
  )


@functools.partial(
    jax.jit,
    static_argnames=("config", "num_pages", "page_size", "layout", "attention"),
)
def _empty_pool(*, config, num_pages, page_size, layout, attention):
  """A zero pool for `attention`, placed by `layout`."""
  return layout.constrain(
      paged_model.init_pool(config, num_pages, page_size, attention),
      layout.pool_spec(),
  )


@functools.partial(jax.jit, static_argnames=("config", "slots", "layout"))
def _empty_states(*, config, slots, layout):
  """Every slot's zero recurrent states, split over the replicas; {} for a
  model without recurrent layers."""
  return layout.constrain(kv_cache.init_states(config, slots), layout.split(1))


# The per-replica setters below take an [R] slot or page per replica; an
# entry past the replica's slots or pages sets nothing (the scatter drops
# it), so one call serves the replicas that have something to set.


@functools.partial(jax.jit, static_argnames=("layout",), donate_argnums=(0,))
def _set_states(states, slots, context_states, *, layout):
  """Slot slots[r] of replica r's [L, S / R, ...] states set to its
  context's (context_states [L, R, ...], a prefill's)."""

  def body(states, slot, context_states):
    return jax.tree_util.tree_map(
        lambda x, c: x.at[:, slot[0]].set(c[:, 0], mode="drop"),
        states,
        context_states,
    )

  split = layout.split
  return layout.per_replica(
      body, in_specs=(split(1), split(0), split(1)), out_specs=split(1)
  )(states, slots, context_states)


@functools.partial(jax.jit, static_argnames=("layout",), donate_argnums=(0,))
def _set_row(logits, slots, rows, *, layout):
  """Row slots[r] of replica r's [S / R, V] logits set to rows[r]."""

  def body(logits, slot, row):
    return logits.at[slot[0]].set(row[0], mode="drop")

  split = layout.split
  return layout.per_replica(
      body, in_specs=(split(0), split(0), split(0)), out_specs=split(0)
  )(logits, slots, rows)


@functools.partial(jax.jit, static_argnames=("layout",), donate_argnums=(0,))
def _copy_page(pool, sources, targets, *, layout):
  """Replica r's page targets[r] set to its page sources[r] (local ids)."""

  def body(pool, source, target):
    return jax.tree_util.tree_map(
        lambda x: x.at[:, target[0]].set(x[:, source[0]], mode="drop"), pool
    )

  split = layout.split
  return layout.constrain(
      layout.per_replica(
          body, in_specs=(split(1), split(0), split(0)), out_specs=split(1)
      )(pool, sources, targets),
      layout.pool_spec(),
  )


def _decode_body(
    params,
    pool,
    states,
    logits,
    tables,
    steps,
    positions,
    budgets,
    rows,
    active,
    stop_after,
    seed_key,
    temperature,
    top_k,
    top_p,
    stop_ids,
    allowed_vocab,
    *,
    config,
    chunk: int,
    greedy: bool,
    filtered: bool,
    replicas: int,
    attention,
):
  """One replica's `_decode` on its blocks (stop_after [1])."""
  slots = logits.shape[0]

  draw = (temperature, top_k, top_p, allowed_vocab)

  def cond(carry):
    k, _, _, _, _, _, active, finished, _, _ = carry
    going = jnp.stack([jnp.any(active), finished >= stop_after[0]])
    if replicas > 1:
      # Every replica steps while any has a running slot and none has
      # finished the sequences its host waits for: the one integer pair
      # the replicas exchange a step.
      going = jax.lax.psum(going.astype(jnp.int32), mesh_lib.DATA_AXIS)
    return (k < chunk) & (going[0] > 0) & (going[1] == 0)

  def body(carry):
    (
        k,
        pool,
        states,
        logits,
        steps,
        positions,
        active,
        finished,
        ids,
        log_probs,
    ) = carry
    keys = jax.vmap(
        lambda r, s: jax.random.fold_in(jax.random.fold_in(seed_key, r), s)
    )(rows, steps)
    token, log_prob = sampling.choose_with_log_prob(
        logits, keys, *draw, greedy=greedy, filtered=filtered
    )
    token = jnp.where(active, token, sampling.PAD_ID)
    ids = ids.at[:, k].set(token)
    log_probs = log_probs.at[:, k].set(jnp.where(active, log_prob, 0.0))
    steps = steps + active
    done = active & (jnp.isin(token, stop_ids) | (steps >= budgets))
    live = active & ~done
    # A finished sequence's last id needs no entry: nothing reads it.
    hidden, pool, states = paged_model.forward(
        params,
        token[:, None],
        positions[:, None],
        live[:, None],
        pool,
        tables,
        config,
        states,
        attention,
    )
    logits = cached_model.logits(params, hidden)[:, 0]
    return (
        k + 1,
        pool,
        states,
        logits,
        steps,
        positions + live,
        live,
        finished + jnp.sum(done),
        ids,
        log_probs,
    )

  carry = (
      jnp.int32(0),
      pool,
      states,
      logits,
      steps,
      positions,
      active,
      jnp.int32(0),
      jnp.full((slots, chunk), sampling.PAD_ID, jnp.int32),
      jnp.zeros((slots, chunk), jnp.float32),
  )
  _, pool, states, logits, steps, _, active, _, ids, log_probs = (
      jax.lax.while_loop(cond, body, carry)
  )
  return pool, states, logits, ids, log_probs, steps, active


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
    tables,
    steps,
    positions,
    budgets,
    rows,
    active,
    stop_after,
    seed_key,
    temperature,
    top_k,
    top_p,
    stop_ids,
    allowed_vocab,
    *,
    config,
    chunk: int,
    greedy: bool,
    filtered: bool,
    layout,
    attention,
):
  """Up to `chunk` decode steps of every slot.

  Args:
    params: the model's parameters.
    pool: the page pool.
    states: the slots' recurrent states ({} without recurrent layers).
    logits: float32 [S, V]: each slot's next-token logits.
    tables: int32 [S, W] page tables (local page ids of the slot's
      replica).
    steps: int32 [S] ids each slot's sequence has so far.
    positions: int32 [S] where each slot's next id goes.
    budgets: int32 [S] each sequence's max_new_tokens.
    rows: int32 [S] each sequence's row (its draws' key).
    active: bool [S] slots holding a running sequence.
    stop_after: int32 [R]: return once replica r has finished this many
      sequences (any replica).
    seed_key, temperature, top_k, top_p, stop_ids, allowed_vocab: as
      `decoder._generate`.
    config, chunk, greedy, filtered: static.
    layout: static (`replica_layout.Layout`): every [S, ...] array split
      over the replicas on its slot dimension, the pool on its pages.
    attention: static: `attention_of`'s.

  Returns:
    (pool, states, logits, ids int32 [S, chunk], log_probs float32
    [S, chunk], steps, active): a slot's new ids are the first (new steps -
    old steps) of its row; ids, log_probs, steps and active whole on every
    device.
  """
  split = layout.split
  slot_specs = (split(0),) * 7  # tables .. active, stop_after
  pool, states, logits, ids, log_probs, steps, active = layout.per_replica(
      functools.partial(
          _decode_body,
          config=config,
          chunk=chunk,
          greedy=greedy,
          filtered=filtered,
          replicas=layout.replicas,
          attention=attention,
      ),
      in_specs=(P(), split(1), split(1), split(0)) + slot_specs + (P(),) * 6,
      out_specs=(split(1), split(1)) + (split(0),) * 5,
  )(
      params,
      pool,
      states,
      logits,
      tables,
      steps,
      positions,
      budgets,
      rows,
      active,
      stop_after,
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
      *layout.constrain((ids, log_probs, steps, active), P()),
  )


@dataclasses.dataclass
class _Prefilled:
  """One prefill call's outputs, on the device: each replica's context's
  logits [R, V] and recurrent states [L, R, ...] ({} without them)."""

  logits: Any
  states: Any


@dataclasses.dataclass
class _Context:
  """A prefilled context: its replica, pages and the continuations yet to
  start."""

  replica: int
  length: int
  pages: list  # Local ids in its replica's block.
  prefilled: _Prefilled  # Row `replica` of it is this context's.
  waiting: int


@dataclasses.dataclass
class _Sequence:
  """A continuation in a slot."""

  row: int
  length: int  # Its context's.
  budget: int
  pages: list
  unallocated: int  # Pages reserved for it, not yet taken from the pool.


@dataclasses.dataclass
class _Admission:
  """A continuation given a slot, whose logits (and states, and partial
  page's copy) the device has yet to set."""

  replica: int
  slot: int  # Local to the replica.
  context: _Context
  copy: Optional[tuple[int, int]]  # (source, target) local page ids.


def table_width(config, length: int, page_size: int) -> int:
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


def prefill_length(config, longest: int, page_size: int) -> int:
  """The prefill program's tokens for contexts of up to `longest` ids: their
  length bucket, in whole pages."""
  bucket = decoder.cache_length(longest, config.max_sequence_length)
  return _pages(bucket, page_size) * page_size


def _bucket(count: int, limit: int) -> int:
  """The smallest power of two >= count, at most `limit`."""
  return min(1 << max(count - 1, 0).bit_length(), limit)


def generate(
    params: Any,
    config: Any,
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
  attention = attention_of(engine, config, layout)
  replicas = layout.replicas
  size = engine.page_size
  slots = replica_slots(engine.num_slots or rows, replicas)
  local_slots = slots // replicas
  longest = max(len(c) for c in contexts)
  # The widest table: the pages of the longest sequence's length bucket
  # (the static decoder's).
  width = table_width(config, longest + new, size)
  num_pages = pool_pages(engine, slots, width, replicas)
  local_pages = num_pages // replicas
  books = [page_pool.PagePool(local_pages) for _ in range(replicas)]
  # Pages promised to each replica's admitted sequences, not yet allocated.
  reserved = [0] * replicas
  split = layout.split
  put = layout.put

  pool = _empty_pool(
      config=config,
      num_pages=num_pages,
      page_size=size,
      layout=layout,
      attention=attention,
  )
  states = _empty_states(config=config, slots=slots, layout=layout)
  stop_slots = -(-max(len(options.stop_ids), 1) // _STOP_SLOTS) * _STOP_SLOTS
  stop_ids = np.full((stop_slots,), -1, np.int32)
  stop_ids[: len(options.stop_ids)] = options.stop_ids
  sampling_args = (
      put(jax.random.PRNGKey(options.seed)),
      put(np.float32(1.0 if options.greedy else options.temperature)),
      put(np.int32(options.top_k)),
      put(np.float32(options.top_p)),
      put(stop_ids),
      put(np.int32(allowed_vocab)),
  )

  out_ids = np.full((rows, new), sampling.PAD_ID, np.int32)
  out_log_probs = np.zeros((rows, new), np.float32)
  lengths = np.zeros((rows,), np.int32)
  # Slot s belongs to replica s // local_slots; its table holds local ids.
  tables = np.zeros((slots, width), np.int32)
  steps = np.zeros((slots,), np.int32)
  positions = np.zeros((slots,), np.int32)
  slot_budgets = np.ones((slots,), np.int32)
  slot_rows = np.zeros((slots,), np.int32)
  in_slot: list[Optional[_Sequence]] = [None] * slots
  logits = put(np.zeros((slots, config.vocab_size), np.float32), split(0))
  to_prefill = collections.deque(range(len(contexts)))
  # Each replica's continuations of its prefilled contexts, waiting for a
  # slot: (context index, sample, _Context).
  ready = [collections.deque() for _ in range(replicas)]
  figures = collections.Counter()

  def free(replica):
    """A replica's pages neither held nor promised."""
    return books[replica].free - reserved[replica]

  def lifetime_pages(length, budget):
    # The last id is never written: positions 0..length + budget - 2.
    return _pages(length + budget - 1, size)

  # One prefill shape per call: the longest context's length bucket.
  bucket = prefill_length(config, longest, size)

  def prefill(assigned):
    """Prefills context assigned[r] into replica r, for each r given, in
    one call."""
    nonlocal pool
    tokens = np.full((replicas, bucket), sampling.PAD_ID, np.int32)
    context_lengths = np.zeros((replicas,), np.int32)
    table = np.zeros((replicas, bucket // size), np.int32)
    pages = {}
    for replica, index in assigned.items():
      context = contexts[index]
      pages[replica] = books[replica].allocate(_pages(len(context), size))
      tokens[replica, : len(context)] = context
      context_lengths[replica] = len(context)
      table[replica, : len(pages[replica])] = pages[replica]
    pool, last, context_states = _prefill(
        params,
        pool,
        put(tokens, split(0)),
        put(context_lengths, split(0)),
        put(table, split(0)),
        config=config,
        layout=layout,
        attention=attention,
    )
    prefilled = _Prefilled(last, context_states)
    for replica, index in assigned.items():
      figures["prefill_passes"] += 1
      state = _Context(
          replica, len(contexts[index]), pages[replica], prefilled, g
      )
      ready[replica].extend((index, sample, state) for sample in range(g))

  def new_pages(context, budget):
    """Pages a continuation takes from the pool over its life."""
    full = context.length // size
    takes_over = context.length % size and context.waiting == 1
    return lifetime_pages(context.length, budget) - full - int(takes_over)

  def admit(slot, index, sample, context):
    """Gives continuation `sample` of context `index` the slot, on the
    host; returns the `_Admission` the device has yet to carry out."""
    replica = context.replica
    book = books[replica]
    row = index * g + sample
    budget = budgets[row]
    full = context.length // size
    pages = context.pages[:full]
    book.share(pages)
    fresh = new_pages(context, budget)
    copy = None
    if context.length % size:
      if context.waiting > 1:
        (target,) = book.allocate(1)
        fresh -= 1
        copy = (context.pages[full], target)
        pages = pages + [target]
      else:
        pages = pages + [context.pages[full]]
    context.waiting -= 1
    if not context.waiting:
      book.release(context.pages[:full])
    in_slot[slot] = _Sequence(row, context.length, budget, pages, fresh)
    reserved[replica] += fresh
    tables[slot] = 0
    tables[slot, : len(pages)] = pages
    steps[slot] = 0
    positions[slot] = context.length
    slot_budgets[slot] = budget
    slot_rows[slot] = row
    return _Admission(replica, slot % local_slots, context, copy)

  def set_slots(admissions):
    """Sets the admitted slots' logits and states, and copies their
    partial pages, on the device: per call at most one admission per
    replica, all of one prefill call's contexts."""
    nonlocal pool, states, logits
    while admissions:
      prefilled = admissions[0].context.prefilled
      now, later, taken = [], [], set()
      for admission in admissions:
        if (
            admission.context.prefilled is prefilled
            and admission.replica not in taken
        ):
          now.append(admission)
          taken.add(admission.replica)
        else:
          later.append(admission)
      admissions = later
      # Entries past a replica's slots or pages set nothing.
      targets = np.full((replicas,), local_slots, np.int32)
      sources = np.zeros((replicas,), np.int32)
      copies = np.full((replicas,), local_pages, np.int32)
      for admission in now:
        targets[admission.replica] = admission.slot
        if admission.copy is not None:
          sources[admission.replica], copies[admission.replica] = admission.copy
          figures["page_copies"] += 1
      if any(a.copy is not None for a in now):
        pool = _copy_page(
            pool, put(sources, split(0)), put(copies, split(0)), layout=layout
        )
      targets = put(targets, split(0))
      logits = _set_row(logits, targets, prefilled.logits, layout=layout)
      if states:
        states = _set_states(states, targets, prefilled.states, layout=layout)

  def fill_slots():
    """Fills free slots from each replica's ready continuations, and
    prefills waiting contexts for replicas with a free slot and none
    ready, until neither makes progress."""
    while True:
      admissions = []
      wanting = []
      for replica in range(replicas):
        for slot in range(replica * local_slots, (replica + 1) * local_slots):
          if in_slot[slot] is not None:
            continue
          if not ready[replica]:
            wanting.append(replica)
            break
          index, sample, context = ready[replica][0]
          if free(replica) < new_pages(context, budgets[index * g + sample]):
            break
          admissions.append(admit(slot, *ready[replica].popleft()))
      set_slots(admissions)
      # Each waiting context goes to the wanting replica with the most
      # free pages, one per replica a call.
      assigned = {}
      while to_prefill and wanting:
        replica = max(wanting, key=free)
        if free(replica) < _pages(len(contexts[to_prefill[0]]), size):
          break
        assigned[replica] = to_prefill.popleft()
        wanting.remove(replica)
      if not assigned:
        return
      prefill(assigned)

  def decode(view, active, stop_after):
    nonlocal pool, states, logits
    pool, states, logits, *out = _decode(
        params,
        pool,
        states,
        logits,
        put(tables[:, :view], split(0)),
        put(steps, split(0)),
        put(positions, split(0)),
        put(slot_budgets, split(0)),
        put(slot_rows, split(0)),
        put(active, split(0)),
        put(stop_after, split(0)),
        *sampling_args,
        config=config,
        chunk=engine.chunk,
        greedy=options.greedy,
        filtered=options.filtered,
        layout=layout,
        attention=attention,
    )
    return out

  # Every view bucket's program, run with no slot active (it stops before
  # its first step): a call compiles all the decode programs its shapes
  # can need, so a warm-up call leaves nothing to compile for later calls
  # of the same buckets, however long their sequences grow.
  view = 1
  while True:
    view = min(view, width)
    decode(view, np.zeros((slots,), bool), np.ones((replicas,), np.int32))
    if view == width:
      break
    view *= 2

  while True:
    fill_slots()
    running = [s for s in range(slots) if in_slot[s] is not None]
    if not running:
      if any(ready) or to_prefill:
        each = (
            f" ({local_pages} for each of {replicas} data replicas)"
            if replicas > 1
            else ""
        )
        raise ValueError(
            f"num_pages={num_pages} pages of {size}{each} cannot hold one "
            "sequence (its context plus max_new_tokens): give more pages"
        )
      break
    # Pages for the positions the next chunk may write.
    for slot in running:
      seq = in_slot[slot]
      replica = slot // local_slots
      last = min(positions[slot] + engine.chunk, seq.length + seq.budget - 1)
      more = _pages(last, size) - len(seq.pages)
      if more > 0:
        pages = books[replica].allocate(more)
        tables[slot, len(seq.pages) : len(seq.pages) + more] = pages
        seq.pages.extend(pages)
        seq.unallocated -= more
        reserved[replica] -= more
    view = _bucket(max(len(in_slot[s].pages) for s in running), width)
    active = np.array([seq is not None for seq in in_slot])
    # A replica with work waiting stops the call at its first finished
    # sequence, so its slot is refilled within a step.
    stop_after = np.array(
        [
            1 if ready[replica] or to_prefill else local_slots + 1
            for replica in range(replicas)
        ],
        np.int32,
    )
    ids, log_probs, new_steps, still = decode(view, active, stop_after)
    ids, log_probs, new_steps, still = jax.device_get(
        (ids, log_probs, new_steps, still)
    )
    figures["decode_calls"] += 1
    figures["decode_steps"] += int(np.max(new_steps - steps))
    for slot in running:
      seq = in_slot[slot]
      made = int(new_steps[slot] - steps[slot])
      start = int(steps[slot])
      out_ids[seq.row, start : start + made] = ids[slot, :made]
      out_log_probs[seq.row, start : start + made] = log_probs[slot, :made]
      steps[slot] = new_steps[slot]
      positions[slot] = seq.length + new_steps[slot]
      if not still[slot]:
        replica = slot // local_slots
        lengths[seq.row] = new_steps[slot]
        books[replica].release(seq.pages)
        reserved[replica] -= seq.unallocated
        in_slot[slot] = None
  page_bytes = paged_model.pool_bytes(config, 1, size)
  state_bytes = kv_cache.state_bytes_per_row(config) * slots
  pages_used = sum(book.peak_in_use for book in books)
  return EngineGeneration(
      ids=out_ids,
      lengths=lengths,
      log_probs=out_log_probs,
      cache_bytes=page_bytes * num_pages + state_bytes,
      peak_bytes=page_bytes * pages_used + state_bytes,
      pages_used=pages_used,
      prefill_passes=figures["prefill_passes"],
      decode_calls=figures["decode_calls"],
      decode_steps=figures["decode_steps"],
      page_copies=figures["page_copies"],
  )


@dataclasses.dataclass(frozen=True)
class LoweredEngine:
  """The engine's programs lowered for abstract arguments (`lower`).

  Attributes:
    programs: "prefill" (one context of `prefill_length` tokens per data
      replica) and
      "decode" (`chunk` steps of every slot over the widest table), as
      `jax.stages.Lowered`.
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
    config, num_slots: int, length: int, prompt_length: int
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
    config: Any,
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
  the parameters as `params`' shapes and shardings say. Prefill takes one
  context per replica. Decode is the widest view's (every page of a
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
  replicas = layout.replicas
  num_slots = replica_slots(num_slots, replicas)
  size = engine.page_size
  width = table_width(config, length, size)
  num_pages = pool_pages(engine, num_slots, width, replicas)
  bucket = prefill_length(config, prompt_length, size)
  split = layout.split

  def placed(tree, spec):
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=layout.sharding(spec)
        ),
        tree,
    )

  def shape(dtype, *dims, spec=P()):
    return jax.ShapeDtypeStruct(dims, dtype, sharding=layout.sharding(spec))

  pool = placed(
      jax.eval_shape(
          functools.partial(
              paged_model.init_pool, config, num_pages, size, attention
          )
      ),
      layout.pool_spec(),
  )
  states = placed(
      jax.eval_shape(
          functools.partial(kv_cache.init_states, config, num_slots)
      ),
      split(1),
  )
  logits = shape(jnp.float32, num_slots, config.vocab_size, spec=split(0))
  i32 = jnp.int32
  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  # The target's device is the default while lowering: a Pallas TPU
  # kernel's lowering reads the chip's kind from it (a TPU slice described
  # on a CPU host is not the default backend).
  target = (
      jax.default_device(mesh.devices.flat[0])
      if mesh is not None
      else contextlib.nullcontext()
  )
  with target:
    prefill = _prefill.lower(
        params,
        pool,
        shape(i32, replicas, bucket, spec=split(0)),
        shape(i32, replicas, spec=split(0)),
        shape(i32, replicas, bucket // size, spec=split(0)),
        config=config,
        layout=layout,
        attention=attention,
    )
    decode = _decode.lower(
        params,
        pool,
        states,
        logits,
        shape(i32, num_slots, width, spec=split(0)),
        # steps .. rows
        *(shape(i32, num_slots, spec=split(0)) for _ in range(4)),
        shape(jnp.bool_, num_slots, spec=split(0)),
        shape(i32, replicas, spec=split(0)),  # stop_after
        shape(key.dtype, *key.shape),
        shape(jnp.float32),  # temperature
        shape(i32),  # top_k
        shape(jnp.float32),  # top_p
        shape(i32, _STOP_SLOTS),
        shape(i32),  # allowed_vocab
        config=config,
        chunk=engine.chunk,
        greedy=False,
        filtered=False,
        layout=layout,
        attention=attention,
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
