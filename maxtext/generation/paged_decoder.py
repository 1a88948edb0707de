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
"""

import collections
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
from maxtext.generation import sampling
from maxtext.model import model_config
from maxtext.runtime import mesh as mesh_lib

_STOP_SLOTS = 8


@dataclasses.dataclass(frozen=True)
class EngineOptions:
  """The engine's shape; checked when built.

  Attributes:
    num_slots: sequences decoded together (the decode program's rows); 0
      = one per row of the call (the static decoder's batch).
    page_size: positions a page holds (a power of two).
    num_pages: the pool's pages; 0 = (num_slots + 1) x the pages of the
      length bucket (`decoder.cache_length`) of the longest context plus
      max_new_tokens: every slot's longest sequence plus one waiting
      context, the static decoder's cache for num_slots + 1 rows.
    chunk: most decode steps one program call runs before the host
      refills slots (it returns early when a slot frees while sequences
      wait).
  """

  num_slots: int = 0
  page_size: int = 16
  num_pages: int = 0
  chunk: int = 32

  def __post_init__(self):
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
      recurrent states (a hybrid model's).
    peak_bytes: bytes of the most pages in use at once, and of the slots'
      recurrent states.
    pages_used: the most pages in use at once.
    prefill_passes: prefill calls (one per context).
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
  """Where the page pool's leaves live on `mesh` (None: one device).

  A grouped-query pool's [L, N, P, K, D] leaves are split by key/value
  heads (K) over the mesh's tensor axis when it divides them: each device
  keeps the heads its attention computes (the projections are split so,
  `transformer.param_partition_specs`), and the pool takes 1 / tensor of
  the bytes on each. Otherwise (no tensor axis, heads it does not divide,
  MLA's latent entries, which have no heads) the pool is replicated.
  """
  if mesh is None:
    return None
  tensor = mesh_lib.tensor_size(mesh)
  if (
      tensor > 1
      and config.attention_type != "mla"
      and config.num_kv_heads % tensor == 0
  ):
    spec = jax.sharding.PartitionSpec(
        None, None, None, mesh_lib.TENSOR_AXIS, None
    )
  else:
    spec = jax.sharding.PartitionSpec()
  return jax.sharding.NamedSharding(mesh, spec)


def _constrain(tree, sharding):
  """Every leaf of `tree` placed by `sharding` (None: left as it is)."""
  if sharding is None:
    return tree
  return jax.tree_util.tree_map(
      lambda x: jax.lax.with_sharding_constraint(x, sharding), tree
  )


@functools.partial(
    jax.jit,
    static_argnames=("config", "pool_layout", "replicated"),
    donate_argnums=(1,),
)
def _prefill(
    params, pool, tokens, length, table, *, config, pool_layout, replicated
):
  """Writes a context's entries into its pages; returns (pool, logits [V]
  of its last position, its recurrent states (one row; {} without
  recurrent layers)). tokens int32 [1, T] right-padded, table [1, T/P].
  The pool keeps `pool_layout`, the rest is `replicated` (None: one
  device), so every call takes and returns the same layouts."""
  positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
  hidden, pool, states = paged_model.forward(
      params,
      tokens,
      positions,
      positions < length,
      pool,
      table,
      config,
      kv_cache.init_states(config, 1),
  )
  last = jax.lax.dynamic_index_in_dim(hidden, length - 1, 1)
  return (
      _constrain(pool, pool_layout),
      _constrain(cached_model.logits(params, last)[0, 0], replicated),
      _constrain(states, replicated),
  )


@functools.partial(
    jax.jit, static_argnames=("config", "num_pages", "page_size", "sharding")
)
def _empty_pool(*, config, num_pages, page_size, sharding):
  """A zero pool placed by `sharding` (`pool_sharding`; None: one
  device)."""
  return _constrain(
      paged_model.init_pool(config, num_pages, page_size), sharding
  )


@functools.partial(jax.jit, static_argnames=("config", "slots", "sharding"))
def _empty_states(*, config, slots, sharding):
  """Every slot's zero recurrent states, replicated over `sharding`'s mesh
  (None: one device); {} for a model without recurrent layers."""
  states = kv_cache.init_states(config, slots)
  if sharding is None:
    return states
  return jax.tree_util.tree_map(
      lambda x: jax.lax.with_sharding_constraint(x, sharding), states
  )


@functools.partial(jax.jit, donate_argnums=(0,))
def _set_states(states, slot, context_states):
  """Slot `slot` of every [L, S, ...] state set to the context's [L, 1,
  ...] states."""
  return jax.tree_util.tree_map(
      lambda x, c: x.at[:, slot].set(c[:, 0]), states, context_states
  )


@functools.partial(jax.jit, donate_argnums=(0,))
def _set_row(logits, slot, row):
  return logits.at[slot].set(row)


@functools.partial(jax.jit, donate_argnums=(0,))
def _copy_page(pool, source, target):
  return jax.tree_util.tree_map(
      lambda x: x.at[:, target].set(x[:, source]), pool
  )


@functools.partial(
    jax.jit,
    static_argnames=(
        "config",
        "chunk",
        "greedy",
        "filtered",
        "pool_layout",
        "replicated",
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
    pool_layout=None,
    replicated=None,
):
  """Up to `chunk` decode steps of every slot.

  Args:
    params: the model's parameters.
    pool: the page pool.
    states: the slots' recurrent states ({} without recurrent layers).
    logits: float32 [S, V]: each slot's next-token logits.
    tables: int32 [S, W] page tables.
    steps: int32 [S] ids each slot's sequence has so far.
    positions: int32 [S] where each slot's next id goes.
    budgets: int32 [S] each sequence's max_new_tokens.
    rows: int32 [S] each sequence's row (its draws' key).
    active: bool [S] slots holding a running sequence.
    stop_after: int32: return once this many sequences finished.
    seed_key, temperature, top_k, top_p, stop_ids, allowed_vocab: as
      `decoder._generate`.
    config, chunk, greedy, filtered: static.
    pool_layout, replicated: static; as `_prefill`'s (the states and
      logits are replicated).

  Returns:
    (pool, states, logits, ids int32 [S, chunk], log_probs float32
    [S, chunk], steps, active): a slot's new ids are the first (new steps -
    old steps) of its row.
  """
  slots = logits.shape[0]

  draw = (temperature, top_k, top_p, allowed_vocab)

  def cond(carry):
    k, _, _, _, _, _, active, finished, _, _ = carry
    return (k < chunk) & jnp.any(active) & (finished < stop_after)

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
  return (
      _constrain(pool, pool_layout),
      _constrain(states, replicated),
      _constrain(logits, replicated),
      ids,
      log_probs,
      steps,
      active,
  )


@dataclasses.dataclass
class _Context:
  """A prefilled context: its pages and the continuations yet to start."""

  length: int
  pages: list
  logits: Any  # float32 [V] on the device.
  states: Any  # Its recurrent states ([L, 1, ...]; {} without them).
  waiting: int


@dataclasses.dataclass
class _Sequence:
  """A continuation in a slot."""

  row: int
  length: int  # Its context's.
  budget: int
  pages: list
  unallocated: int  # Pages reserved for it, not yet taken from the pool.


def table_width(config, length: int, page_size: int) -> int:
  """The pages of a slot's table for sequences of up to `length` positions
  (context plus max_new_tokens): the pages of the length bucket
  (`decoder.cache_length`), so the pool's and tables' shapes, and the
  programs, depend on the bucket only."""
  return _pages(
      decoder.cache_length(length, config.max_sequence_length), page_size
  )


def pool_pages(engine: EngineOptions, slots: int, width: int) -> int:
  """The pool's pages: `engine.num_pages`, or by default (slots + 1) x the
  widest table (`EngineOptions.num_pages`)."""
  return engine.num_pages or (slots + 1) * width


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
    params: the model's parameters, on one device or sharded over `mesh`.
    config: the model's config or the run's.
    contexts: id lists (a prompt, or an episode's turns so far); each
      len + max_new_tokens <= config.max_sequence_length.
    options: how many ids and how to choose them (as `decoder.generate`).
    max_new_tokens: each row's own limit (<= options.max_new_tokens), in
      row order (context-major); None = options.max_new_tokens for all.
    engine: slots, pages and chunk.
    allowed_vocab: ids at or above this are never chosen; 0 = the vocab.
    mesh: run on this mesh (the pool split as `pool_sharding` says, the
      engine's other arrays replicated, the parameters where the caller
      put them); None = one device.

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
  contexts = decoder.check_prompts(contexts, config, new)
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
  size, slots = engine.page_size, engine.num_slots or rows
  longest = max(len(c) for c in contexts)
  # The widest table: the pages of the longest sequence's length bucket
  # (the static decoder's).
  width = table_width(config, longest + new, size)
  num_pages = pool_pages(engine, slots, width)
  pool_book = page_pool.PagePool(num_pages)
  replicated = (
      None
      if mesh is None
      else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  )

  def put(x):
    """A host value on the engine's devices (each process passes the
    same value; replicated over `mesh`)."""
    if replicated is None:
      return jnp.asarray(x)
    return jax.device_put(np.asarray(x), replicated)

  layout = pool_sharding(config, mesh)
  pool = _empty_pool(
      config=config, num_pages=num_pages, page_size=size, sharding=layout
  )
  states = _empty_states(config=config, slots=slots, sharding=replicated)
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
  tables = np.zeros((slots, width), np.int32)
  steps = np.zeros((slots,), np.int32)
  positions = np.zeros((slots,), np.int32)
  slot_budgets = np.ones((slots,), np.int32)
  slot_rows = np.zeros((slots,), np.int32)
  in_slot: list[Optional[_Sequence]] = [None] * slots
  logits = put(np.zeros((slots, config.vocab_size), np.float32))
  to_prefill = collections.deque(range(len(contexts)))
  ready = collections.deque()  # (context index, sample, _Context)
  reserved = 0  # Pages promised to admitted sequences, not yet allocated.
  figures = collections.Counter()

  def lifetime_pages(length, budget):
    # The last id is never written: positions 0..length + budget - 2.
    return _pages(length + budget - 1, size)

  # One prefill shape per call: the longest context's length bucket.
  bucket = prefill_length(config, longest, size)

  def prefill(index):
    nonlocal pool
    context = contexts[index]
    pages = pool_book.allocate(_pages(len(context), size))
    tokens = np.full((1, bucket), sampling.PAD_ID, np.int32)
    tokens[0, : len(context)] = context
    table = np.zeros((1, bucket // size), np.int32)
    table[0, : len(pages)] = pages
    pool, last, context_states = _prefill(
        params,
        pool,
        put(tokens),
        put(np.int32(len(context))),
        put(table),
        config=config,
        pool_layout=layout,
        replicated=replicated,
    )
    figures["prefill_passes"] += 1
    state = _Context(len(context), pages, last, context_states, g)
    ready.extend((index, sample, state) for sample in range(g))

  def new_pages(context, budget):
    """Pages a continuation takes from the pool over its life."""
    full = context.length // size
    takes_over = context.length % size and context.waiting == 1
    return lifetime_pages(context.length, budget) - full - int(takes_over)

  def admit(slot, index, sample, context):
    nonlocal pool, states, logits, reserved
    row = index * g + sample
    budget = budgets[row]
    full = context.length // size
    pages = context.pages[:full]
    pool_book.share(pages)
    fresh = new_pages(context, budget)
    if context.length % size:
      if context.waiting > 1:
        (copy,) = pool_book.allocate(1)
        fresh -= 1
        pool = _copy_page(
            pool, put(np.int32(context.pages[full])), put(np.int32(copy))
        )
        figures["page_copies"] += 1
        pages = pages + [copy]
      else:
        pages = pages + [context.pages[full]]
    context.waiting -= 1
    if not context.waiting:
      pool_book.release(context.pages[:full])
    in_slot[slot] = _Sequence(row, context.length, budget, pages, fresh)
    reserved += fresh
    tables[slot] = 0
    tables[slot, : len(pages)] = pages
    steps[slot] = 0
    positions[slot] = context.length
    slot_budgets[slot] = budget
    slot_rows[slot] = row
    logits = _set_row(logits, put(np.int32(slot)), context.logits)
    if states:
      states = _set_states(states, put(np.int32(slot)), context.states)

  def fill_slots():
    for slot in range(slots):
      if in_slot[slot] is not None:
        continue
      if not ready and to_prefill:
        need = _pages(len(contexts[to_prefill[0]]), size)
        if pool_book.free - reserved < need:
          return
        prefill(to_prefill.popleft())
      if not ready:
        return
      index, sample, context = ready[0]
      if pool_book.free - reserved < new_pages(
          context, budgets[index * g + sample]
      ):
        return
      admit(slot, *ready.popleft())

  def decode(view, active, stop_after):
    nonlocal pool, states, logits
    pool, states, logits, *out = _decode(
        params,
        pool,
        states,
        logits,
        put(tables[:, :view]),
        put(steps),
        put(positions),
        put(slot_budgets),
        put(slot_rows),
        put(active),
        put(np.int32(stop_after)),
        *sampling_args,
        config=config,
        chunk=engine.chunk,
        greedy=options.greedy,
        filtered=options.filtered,
        pool_layout=layout,
        replicated=replicated,
    )
    return out

  # Every view bucket's program, run with no slot active (it stops before
  # its first step): a call compiles all the decode programs its shapes
  # can need, so a warm-up call leaves nothing to compile for later calls
  # of the same buckets, however long their sequences grow.
  view = 1
  while True:
    view = min(view, width)
    decode(view, np.zeros((slots,), bool), 1)
    if view == width:
      break
    view *= 2

  while True:
    fill_slots()
    running = [s for s in range(slots) if in_slot[s] is not None]
    if not running:
      if ready or to_prefill:
        raise ValueError(
            f"num_pages={num_pages} pages of {size} cannot hold one "
            "sequence (its context plus max_new_tokens): give more pages"
        )
      break
    # Pages for the positions the next chunk may write.
    for slot in running:
      seq = in_slot[slot]
      last = min(positions[slot] + engine.chunk, seq.length + seq.budget - 1)
      more = _pages(last, size) - len(seq.pages)
      if more > 0:
        pages = pool_book.allocate(more)
        tables[slot, len(seq.pages) : len(seq.pages) + more] = pages
        seq.pages.extend(pages)
        seq.unallocated -= more
        reserved -= more
    view = _bucket(max(len(in_slot[s].pages) for s in running), width)
    active = np.array([seq is not None for seq in in_slot])
    waiting = bool(ready or to_prefill)
    ids, log_probs, new_steps, still = decode(
        view, active, 1 if waiting else slots + 1
    )
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
        lengths[seq.row] = new_steps[slot]
        pool_book.release(seq.pages)
        reserved -= seq.unallocated
        in_slot[slot] = None
  page_bytes = paged_model.pool_bytes(config, 1, size)
  state_bytes = kv_cache.state_bytes_per_row(config) * slots
  return EngineGeneration(
      ids=out_ids,
      lengths=lengths,
      log_probs=out_log_probs,
      cache_bytes=page_bytes * num_pages + state_bytes,
      peak_bytes=page_bytes * pool_book.peak_in_use + state_bytes,
      pages_used=pool_book.peak_in_use,
      prefill_passes=figures["prefill_passes"],
      decode_calls=figures["decode_calls"],
      decode_steps=figures["decode_steps"],
      page_copies=figures["page_copies"],
  )


@dataclasses.dataclass(frozen=True)
class LoweredEngine:
  """The engine's programs lowered for abstract arguments (`lower`).

  Attributes:
    programs: "prefill" (one context of `prefill_length` tokens) and
      "decode" (`chunk` steps of every slot over the widest table), as
      `jax.stages.Lowered`.
    pool: the page pool's shapes and shardings.
    states: the slots' recurrent states' ({} without recurrent layers).
    logits: the slots' next-token logits'.
    num_pages: the pool's pages.
    width: pages of a slot's table.
    prefill_length: tokens of the prefill program.
  """

  programs: dict
  pool: Any
  states: Any
  logits: Any
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

  The arguments are the ones `generate` passes for `num_slots` slots of
  sequences of up to `length` positions (context plus max_new_tokens) and
  contexts of up to `prompt_length` ids: the pool placed as
  `pool_sharding` says, the states, logits and per-slot arrays replicated
  over `mesh`, the parameters as `params`' shapes and shardings say.
  Decode is the widest view's (every page of a table: the most memory of
  the view buckets), drawing by temperature without top-k or top-p (as a
  rollout at temperature 1 and top-p 1 does).

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
  size = engine.page_size
  width = table_width(config, length, size)
  num_pages = pool_pages(engine, num_slots, width)
  bucket = prefill_length(config, prompt_length, size)
  replicated = (
      None
      if mesh is None
      else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  )

  def placed(tree):
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
        tree,
    )

  def shape(dtype, *dims):
    return jax.ShapeDtypeStruct(dims, dtype, sharding=replicated)

  layout = pool_sharding(config, mesh)
  pool = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=layout),
      jax.eval_shape(
          functools.partial(paged_model.init_pool, config, num_pages, size)
      ),
  )
  states = placed(
      jax.eval_shape(functools.partial(kv_cache.init_states, config, num_slots))
  )
  logits = shape(jnp.float32, num_slots, config.vocab_size)
  i32 = jnp.int32
  prefill = _prefill.lower(
      params,
      pool,
      shape(i32, 1, bucket),
      shape(i32),
      shape(i32, 1, bucket // size),
      config=config,
      pool_layout=layout,
      replicated=replicated,
  )
  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  decode = _decode.lower(
      params,
      pool,
      states,
      logits,
      shape(i32, num_slots, width),
      *(shape(i32, num_slots) for _ in range(4)),  # steps .. rows
      shape(jnp.bool_, num_slots),
      shape(i32),  # stop_after
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
      pool_layout=layout,
      replicated=replicated,
  )
  return LoweredEngine(
      programs={"prefill": prefill, "decode": decode},
      pool=pool,
      states=states,
      logits=logits,
      num_pages=num_pages,
      width=width,
      prefill_length=bucket,
  )
