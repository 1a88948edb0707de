"""The paged decoder's device programs and the layout of their host values.

Programs and calls: a prefill call (`prefill`) writes a chunk of up to C
waiting contexts per replica into their pages, and one stage call
(`stage`) copies their logits and recurrent states into the engine's
ready buffers. Each replica's continuations of prefilled contexts wait in
its queue (their pages taken: the context's shared ones, a partial page's
copy, their first chunk's), which travels with every decode call
(`decode`): at the call's start and after each step, the slots that are
free take the queue's next continuations on the device (their values,
page tables, logits and states from the ready buffers; the queued
continuations' partial pages are copied once, at the call's start). A
decode call runs up to `chunk` steps and returns early once a replica's
`stop_after` sequences have finished with no queued continuation to take
their slots. Each call takes its host values as one array or a few (a
transfer each, not a program); a decode call takes one (its slots'
values, page tables and queue, `SLOT_COLUMNS`, `QUEUE_COLUMNS`) and
returns its results to the host as one (`unpack_decoded`: each step's id,
log-probability, row and step per slot, and the slots' values after the
call).

Per-request randomness. Row r's draw at its step s uses the key
fold_in(fold_in(PRNGKey(seed), r), s), the static decoder's: the ids
depend on the request and the step, not on the slot, on which requests
share a step, or on the number of slots.

Recurrent layers (a hybrid model's Gated DeltaNet) carry a state per
sequence rather than pages: one per slot (`kv_cache.init_states`), beside
the page tables. A context's prefill leaves its state after the context;
each continuation's slot starts from a copy of it (as the partial page is
copied), and a slot's state advances only on its live tokens.

Data-parallel replicas. On a mesh whose "data" axis has R > 1 devices
(the training mesh's, where the parameters are split over "fsdp" and
replicated over "data") the programs run R replicas that decode without
exchanging weights, pages or activations (`replica_layout`): each holds
the whole model (split over its own fsdp, expert and tensor devices as
the caller placed it), S / R of the slots and N / R of the pool's pages,
which its page tables name by local ids, and the programs run their body
per replica (`shard_map` manual over "data" only). A prefill call's rows
of a replica with fewer contexts than the others are empty and write
nothing. The decode program's replicas step together: the call stops
once any replica with work waiting has finished its `stop_after`
sequences (the one value they exchange, an integer pair a step), or when
no replica has a running one. Draws are keyed by (row, step), so the ids
do not depend on the replica either. With R = 1 (no "data" axis, or one
device) the programs run without `shard_map`.

Each program is the jitted form of the private function of its name with
a leading underscore (`decode` of `_decode`), whose name its compiles and
launches carry ("jit(_decode)"): the names that compile and launch counts
and the host profile (`tools/benchmarks/decode_host_profile`) report.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.generation import cached_model
from maxtext.generation import kv_cache
from maxtext.generation import paged_model
from maxtext.generation import sampling
from maxtext.model import model_config
from maxtext.runtime import mesh as mesh_lib

# The decode program's stop ids are padded to a multiple of this many.
STOP_SLOTS = 8

P = jax.sharding.PartitionSpec


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

  A context longer than a chunk (`paged_sizes.prefill_chunk`) is
  prefilled by calls that run on from each other (positions start.., the
  states and logits the call before returned), so a call's activations
  stay those of T tokens a context however long the context.

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
    attention: static: `paged_decoder.attention_of`'s.

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


prefill = jax.jit(
    _prefill,
    static_argnames=("config", "layout", "attention"),
    donate_argnums=(1, 2, 3),
)


def _empty_pool(
    *, config: model_config.ModelConfig, num_pages, page_size, layout, attention
):
  """A zero pool for `attention`, placed by `layout`."""
  return layout.constrain(
      paged_model.init_pool(config, num_pages, page_size, attention),
      layout.pool_spec(),
  )


empty_pool = jax.jit(
    _empty_pool,
    static_argnames=("config", "num_pages", "page_size", "layout", "attention"),
)


def _empty_slots(*, config: model_config.ModelConfig, slots, ready, layout):
  """Every slot's zero recurrent states ({} for a model without recurrent
  layers) and next-token logits, and the same for `ready` rows of the
  ready buffers (`stage`), split over the replicas: (states, logits,
  ready states, ready logits)."""

  def zeros(rows):
    return (
        layout.constrain(kv_cache.init_states(config, rows), layout.split(1)),
        layout.constrain(
            jnp.zeros((rows, config.vocab_size), jnp.float32), layout.split(0)
        ),
    )

  return zeros(slots) + zeros(ready)


empty_slots = jax.jit(
    _empty_slots, static_argnames=("config", "slots", "ready", "layout")
)


def _stage(ready_logits, ready_states, logits, states, rows, *, layout):
  """Copies a prefill call's contexts' logits and recurrent states into the
  engine's ready buffers, where decode calls start their continuations.

  Args:
    ready_logits, ready_states: the engine's [R * 2C, V] and
      [L, R * 2C, ...] (each replica's 2C rows: two generations of its C
      contexts, `paged_scheduler.Scheduler.prefill`).
    logits, states: a `prefill` call's [R * c, V] and [L, R * c, ...].
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


stage = jax.jit(_stage, static_argnames=("layout",), donate_argnums=(0, 1))


# The decode program's per-slot values: one int32 array [S, SLOT_COLUMNS
# + view + QUEUE_COLUMNS + view], so a call moves them to the device at
# once. Each slot's steps (the ids its sequence has so far), position
# (where its next id goes), budget (its max_new_tokens), row (its draws'
# key), active (1: it holds a running sequence), its replica's stop_after
# (the finished sequences left without a successor at which the call
# returns) and queued (the replica's continuations waiting in its queue),
# then its page table's first `view` pages (local page ids of the slot's
# replica). Then row i of a replica's block is the i-th continuation of its
# queue: the first slot to free takes it on the device, within the call.
STEPS, POSITIONS, BUDGETS, ROWS, ACTIVE, STOP_AFTER, QUEUED = range(7)
SLOT_COLUMNS = 7
# A queued continuation: its position, budget and row (a slot's), its
# context's row in the ready buffers, its partial page's copy (local page
# ids; copy_to N / R for none), then its page table's first `view` pages.
Q_POSITION, Q_BUDGET, Q_ROW, Q_SOURCE, Q_COPY_FROM, Q_COPY_TO = range(6)
QUEUE_COLUMNS = 6
# A decode call's results, per slot: `_RECORDS` [S, chunk] int32 arrays
# (the id drawn at step k, its log-probability's float32 bits, the row and
# step it belongs to (row -1: the slot held none), 1 where it ended its
# sequence), then `_FINALS` values after the call (steps, position,
# active, row, the replica's continuations taken from its queue, the steps
# the call ran).
_RECORDS = 5
FINAL_STEPS, FINAL_POSITIONS, FINAL_ACTIVE, FINAL_ROWS = range(4)
FINAL_TAKEN, FINAL_CALL_STEPS = 4, 5
_FINALS = 6


class Decoded(NamedTuple):
  """A decode call's results on the host (`unpack_decoded`)."""

  ids: np.ndarray  # int32 [S, chunk]
  log_probs: np.ndarray  # float32 [S, chunk]
  rows: np.ndarray  # int32 [S, chunk]: -1 where the slot held no sequence
  steps: np.ndarray  # int32 [S, chunk]: the id's step in its row
  done: np.ndarray  # bool [S, chunk]: the id ended its sequence
  finals: np.ndarray  # int32 [S, _FINALS]


def unpack_decoded(packed: np.ndarray, chunk: int) -> Decoded:
  """`decode`'s packed int32 [S, _RECORDS * chunk + _FINALS] on the host."""
  parts = [packed[:, i * chunk : (i + 1) * chunk] for i in range(_RECORDS)]
  return Decoded(
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
    records: int32 [_RECORDS, S, chunk]: `unpack_decoded`'s records.
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

  entries: Any  # int32 [S, QUEUE_COLUMNS + view]
  length: Any  # int32: entries queued
  logits: Any  # float32 [2C, V]
  states: Any  # [L, 2C, ...]


def _copy_partial_pages(pool, queue: _Queue):
  """The queued continuations' partial pages, copied once at the call's
  start, before any step.

  Every entry of the queue is a continuation no slot has taken yet, so its
  context's partial page holds the context's positions (a continuation
  that owns that page is queued after the ones that copy it, and at worst
  wrote positions past the context's, which the copy's own continuation
  overwrites before it reads them). An entry without a copy names page N
  (one past the replica's pages), which the scatter drops. Copying here
  rather than when a slot takes the entry keeps the pool out of the decode
  loop's conditional: with the pool in both branches of a `lax.cond` the
  TPU compiler copied the whole pool twice a step to reconcile the
  branches' layouts (`tools/benchmarks/decode_memory_test` counts the
  pool's copies in the program compiled for a v5e).
  """
  copy_to = queue.entries[:, Q_COPY_TO]
  copy_from = queue.entries[:, Q_COPY_FROM]
  return jax.tree_util.tree_map(
      lambda x: x.at[:, copy_to].set(x[:, copy_from], mode="drop"), pool
  )


def _take_queued(carry: _DecodeCarry, queue: _Queue, refill: bool):
  """The free slots take the queue's next continuations, in slot order:
  their values, pages, logits and states (their partial pages were copied
  at the call's start, `_copy_partial_pages`). A step that frees no slot,
  or leaves the queue empty, changes nothing (`lax.cond`: no copies run);
  the pool does not pass through the conditional."""
  free = ~carry.active
  index = carry.taken + jnp.cumsum(free) - 1
  take = free & (index < queue.length)

  def start(carry):
    entry = queue.entries[jnp.clip(index, 0, queue.entries.shape[0] - 1)]
    source = entry[:, Q_SOURCE]
    # The taking slots' rows of [L, S, ...] from [L, 2C, ...]; a slot that
    # takes nothing scatters to row S, which is dropped.
    into = jnp.where(take, jnp.arange(take.shape[0]), take.shape[0])

    def per_slot(x, ready):
      return x.at[:, into].set(ready[:, source], mode="drop")

    count = jnp.sum(take).astype(jnp.int32)
    return carry._replace(
        states=jax.tree_util.tree_map(per_slot, carry.states, queue.states),
        logits=jnp.where(take[:, None], queue.logits[source], carry.logits),
        steps=jnp.where(take, 0, carry.steps),
        positions=jnp.where(take, entry[:, Q_POSITION], carry.positions),
        budgets=jnp.where(take, entry[:, Q_BUDGET], carry.budgets),
        rows=jnp.where(take, entry[:, Q_ROW], carry.rows),
        tables=jnp.where(take[:, None], entry[:, QUEUE_COLUMNS:], carry.tables),
        active=carry.active | take,
        refilled=carry.refilled + count if refill else carry.refilled,
        taken=carry.taken + count,
    )

  taken = jax.lax.cond(
      jnp.any(take), start, lambda carry: carry, carry._replace(pool=None)
  )
  return taken._replace(pool=carry.pool)


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
  """One replica's `decode` on its blocks (its slots' rows of
  `slot_inputs`, its ready buffers).

  The queued continuations' partial pages are copied, the free slots take
  queued continuations, then a while loop of
  `_decode_step`s, each followed by the freed slots taking the queue's
  next ones, as long as `_keep_decoding` says.
  """
  view = (slot_inputs.shape[1] - SLOT_COLUMNS - QUEUE_COLUMNS) // 2
  queue = _Queue(
      entries=slot_inputs[:, SLOT_COLUMNS + view :],
      length=slot_inputs[0, QUEUED],
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
      stop_after=slot_inputs[0, STOP_AFTER],
      chunk=chunk,
      replicas=replicas,
  )
  carry = _first_carry(
      _copy_partial_pages(pool, queue),
      states,
      logits,
      slot_inputs[:, : SLOT_COLUMNS + view],
      chunk,
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
  values and tables (`slot_inputs` [S, SLOT_COLUMNS + view])."""
  column = functools.partial(jnp.take, slot_inputs, axis=1)
  return _DecodeCarry(
      k=jnp.int32(0),
      pool=pool,
      states=states,
      logits=logits,
      steps=column(STEPS),
      positions=column(POSITIONS),
      budgets=column(BUDGETS),
      rows=column(ROWS),
      tables=slot_inputs[:, SLOT_COLUMNS:],
      active=column(ACTIVE) > 0,
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
  [S, _RECORDS * chunk + _FINALS] (`unpack_decoded`)."""
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
      and states [L, R * 2C, ...] (`stage`), which queued continuations
      start from.
    slot_inputs: int32 [S, SLOT_COLUMNS + W + QUEUE_COLUMNS + W]: each
      slot's values in the columns `STEPS` .. `QUEUED` (the call returns
      once any replica has left its slots' stop_after finished sequences
      without a successor), then its page table (W pages, local ids of the
      slot's replica), then its replica's queue (`Q_POSITION` ..; one
      continuation a row).
    seed_key, temperature, top_k, top_p, stop_ids, allowed_vocab: as
      `decoder._generate`.
    config, chunk, greedy, filtered: static.
    layout: static (`replica_layout.Layout`): every [S, ...] array split
      over the replicas on its slot dimension, the pool on its pages.
    attention: static: `paged_decoder.attention_of`'s.

  Returns:
    (pool, states, logits, decoded): decoded is the int32 [S, _RECORDS *
    chunk + _FINALS] of `unpack_decoded`, whole on every device.
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


decode = jax.jit(
    _decode,
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


def _decode_per_replica(
    layout, config: model_config.ModelConfig, chunk, greedy, filtered, attention
):
  """`_decode_body` run on each replica's blocks of `decode`'s arguments.

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


def sampling_args(options, allowed_vocab: int, layout) -> tuple:
  """The decode program's sampling values on the engine's devices: the
  seed's key, temperature, top_k, top_p, stop ids (padded with -1 to a
  multiple of `STOP_SLOTS`) and allowed_vocab."""
  stop_slots = -(-max(len(options.stop_ids), 1) // STOP_SLOTS) * STOP_SLOTS
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
