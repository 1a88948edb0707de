"""The paged decoder's host scheduler: slots, pages and waiting sequences.

`Scheduler` runs one `paged_decoder.generate` call: it keeps the host's
books and calls the device programs (`paged_programs`) until every row
has finished.

* Decode slots. A fixed number of slots
  (`paged_decoder.EngineOptions.num_slots`) decode together, one token per
  slot per step. A sequence that stops (a stop id, or its own
  `max_new_tokens`) leaves its slot, and the next waiting sequence takes it
  at once: no slot steps on after its sequence ended while others go on,
  which in a static batch costs as many padding steps as the longest row is
  longer than the others.
* Pages. Keys and values live in fixed-size pages of one pool
  (`paged_model`); each slot has a page table. Pages are taken from the
  pool (`page_pool.PagePool`) as a sequence grows and go back when it ends,
  so the pool holds what running sequences use, not rows x the longest
  length.
* Shared prefixes. A context is prefilled once; its `num_samples`
  continuations list the context's full pages in their tables (each page
  counts its holders). The last, partial page is written by every
  continuation, so each gets its own copy (copy on write; the last one to
  start takes the context's own page, with no copy), made on the device at
  the start of each decode call whose queue holds it.
  A context whose length is a multiple of the page size shares every page.

Calls: a prefill call writes as many waiting contexts as a replica's free
slots take (up to `prefill_tokens` tokens), and one stage
call copies their logits and recurrent states into the engine's ready
buffers; their continuations wait in the replica's queue, which the
decode call's free slots take from on the device. A decode call returns
early once `refill` sequences (1 by default) have finished
with no queued continuation to take their slots while others wait for a
prefill, so a slot waits at most a step for a context the host has yet to
prefill, and none for one already prefilled. A rollout whose rows all
have slots is thus one prefill, one stage and one decode call, however
many contexts and samples it has. While a decode call runs, the host
prefills ahead the contexts whose continuations its queue may run out
of (`Scheduler.prefill_ahead`), so a call that returns for them is
followed by the next without a prefill between the two. Between two
decode calls the host makes a transfer each way and bookkeeping whose
loops run over the sequences that finished or started, and the slots
that take pages (the new ids go into their rows as whole arrays).

Admission reserves, for every admitted sequence, the pages it may still
need (its context plus its `max_new_tokens`), so a running sequence never
waits for a page; a sequence waits for a slot and for its pages. A context
whose pages cannot fit even into the empty pool is refused in one line.

Data-parallel replicas (R, `replica_layout`). The host keeps one
`page_pool.PagePool` and reservation count per replica. A waiting context
is prefilled into the replica, among those with free slots and no
continuation ready, that has the most free (unreserved) pages, until each
has contexts for its free slots; one prefill call takes them all. Its
continuations run in that replica's slots only, sharing its pages, and
each replica fills its own free slots from its own ready continuations.
The run's pages and bytes are summed over the replicas (`pages_used`: the
sum of each replica's most pages in use, the pages the replicas' blocks
must hold).
"""

import collections
import dataclasses
from typing import Any, Optional

import jax
import numpy as np

from maxtext.generation import kv_cache
from maxtext.generation import page_pool
from maxtext.generation import paged_model
from maxtext.generation import paged_programs
from maxtext.generation import paged_sizes
from maxtext.generation import sampling
from maxtext.model import model_config


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


def _signature(tree: Any) -> tuple:
  """What a program compiled for `tree`'s arrays depends on: its
  structure, shapes, dtypes and placements."""
  leaves, structure = jax.tree_util.tree_flatten(tree)
  return structure, tuple(
      (x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves
  )


# The engine shapes whose programs a call in this process has run once
# (`Scheduler.warm_up`): a later call of the same shapes finds them compiled.
_WARM: set = set()


def _committed(arrays: tuple, params, layout) -> tuple:
  """The engine's first pool, states and logits, placed as its programs'
  outputs will be.

  On a mesh the programs that make them place them. On one device
  without a mesh a program with no committed input returns uncommitted
  arrays, while the decode, prefill and stage programs return committed
  ones once the parameters are (a trainer's are): a warm-up on the first
  arrays would then compile programs that later calls, given the outputs,
  compile again. Committed here, to the parameters' device (or the default
  one), every call sees them placed alike.
  """
  if layout.mesh is not None:
    return arrays
  leaf = jax.tree_util.tree_leaves(params)[0]
  committed = getattr(leaf, "committed", False)
  device = next(iter(leaf.devices())) if committed else jax.devices()[0]
  return jax.device_put(arrays, device)


class Scheduler:
  """One `paged_decoder.generate` call: the host's books (slots, pages,
  waiting sequences, the rows' ids) and the device's pool, states and
  logits.

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
    self.slots = paged_sizes.replica_slots(
        self.engine.num_slots or rows, replicas
    )
    self.local_slots = self.slots // replicas
    longest = max(len(c) for c in contexts)
    # The widest table: the pages of the longest sequence's length bucket
    # (the static decoder's).
    self.width = paged_sizes.table_width(
        config, longest + options.max_new_tokens, size
    )
    self.num_pages = paged_sizes.pool_pages(
        self.engine, self.slots, self.width, replicas
    )
    self.local_pages = self.num_pages // replicas
    # One prefill length per call: the longest context's length bucket,
    # prefilled in chunks of `self.chunk` positions.
    self.bucket = paged_sizes.prefill_length(config, longest, size)
    self.chunk = paged_sizes.prefill_chunk(self.engine, self.bucket)
    self.most_contexts = paged_sizes.prefill_contexts(
        self.engine, self.chunk, self.local_slots, self.g
    )
    self.books = [page_pool.PagePool(self.local_pages) for _ in range(replicas)]
    # Pages promised to each replica's admitted sequences, not yet taken.
    self.reserved = [0] * replicas
    # Slot s belongs to replica s // local_slots; its table holds local
    # ids. The decode program's per-slot values and tables are one array
    # (`paged_programs.SLOT_COLUMNS`), of which these are views.
    self.slot_inputs = np.zeros(
        (self.slots, paged_programs.SLOT_COLUMNS + self.width), np.int32
    )
    self.slot_values = self.slot_inputs[:, : paged_programs.SLOT_COLUMNS]
    self.tables = self.slot_inputs[:, paged_programs.SLOT_COLUMNS :]
    self.slot_values[:, paged_programs.BUDGETS] = 1
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
    (
        self.pool,
        self.states,
        self.logits,
        self.ready_states,
        self.ready_logits,
        self.sampling_args,
    ) = self._device_arrays(allowed_vocab)

  def _device_arrays(self, allowed_vocab: int) -> tuple:
    """The engine's arrays on its devices at the start: the empty pool,
    the slots' and ready buffers' zero states and logits, and the decode
    program's sampling values."""
    pool = paged_programs.empty_pool(
        config=self.config,
        num_pages=self.num_pages,
        page_size=self.engine.page_size,
        layout=self.layout,
        attention=self.attention,
    )
    slots = paged_programs.empty_slots(
        config=self.config,
        slots=self.slots,
        ready=self.layout.replicas * 2 * self.most_contexts,
        layout=self.layout,
    )
    sampling_args = paged_programs.sampling_args(
        self.options, allowed_vocab, self.layout
    )
    return _committed((pool,) + slots, self.params, self.layout) + (
        sampling_args,
    )

  def free(self, replica: int) -> int:
    """A replica's pages neither held nor promised."""
    return self.books[replica].free - self.reserved[replica]

  def new_pages(self, context: _Context, budget: int) -> int:
    """Pages a continuation takes from the pool over its life."""
    size = self.engine.page_size
    # The last id is never written: positions 0..length + budget - 2.
    lifetime = paged_sizes.page_count(context.length + budget - 1, size)
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
      self.pool, logits, states = paged_programs.prefill(
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
    self.ready_logits, self.ready_states = paged_programs.stage(
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
        if free > len(queued) and not ready and self.writable(replica):
          wanting[replica] = free - len(queued)
      if not self.prefill_assigned(wanting):
        return

  def prefill_ahead(self) -> None:
    """Prefills, while a decode call runs, waiting contexts for each
    replica whose queue the call may empty: as many continuations as its
    slots less those that stay queued once the call's free slots have
    taken theirs, for a replica with none ready. Their continuations are
    ready when the call returns, so the host queues them and starts the
    next call without a prefill between the two (the prefill's programs
    run after the call's: they take its pool)."""
    wanting = {}
    for replica in range(self.layout.replicas):
      first = replica * self.local_slots
      free = sum(
          self.in_slot[s] is None
          for s in range(first, first + self.local_slots)
      )
      staying = max(len(self.queued[replica]) - free, 0)
      if (
          staying < self.local_slots
          and not self.ready[replica]
          and self.writable(replica)
      ):
        wanting[replica] = self.local_slots - staying
    self.prefill_assigned(wanting)

  def writable(self, replica: int) -> bool:
    """Whether a prefill may write the replica's next generation of ready
    rows: no queued continuation still starts from them."""
    rows = range(
        self.generation[replica] * self.most_contexts,
        (self.generation[replica] + 1) * self.most_contexts,
    )
    return not any(q.source in rows for q in self.queued[replica])

  def prefill_assigned(self, wanting: dict) -> bool:
    """Prefills the waiting contexts `assign` gives the wanting replicas
    in one call; returns whether it gave any."""
    assigned = self.assign(wanting)
    if not assigned:
      return False
    most = max(len(taken) for taken in assigned.values())
    self.prefill(assigned, paged_sizes.power_bucket(most, self.most_contexts))
    return True

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
          paged_sizes.page_count(length + self.options.max_new_tokens - 1, size)
          - length // size
      )

    assigned = {}
    while self.to_prefill and wanting:
      replica = max(wanting, key=self.free)
      length = len(self.contexts[self.to_prefill[0]])
      need = paged_sizes.page_count(length, size)
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
    (`paged_programs.QUEUE_COLUMNS` and `view` pages): its first
    local_slots queued continuations, one a row of its slots' block."""
    columns = paged_programs.QUEUE_COLUMNS
    rows = np.zeros((self.slots, columns + view), np.int32)
    rows[:, paged_programs.Q_COPY_TO] = self.local_pages
    for replica, queued in enumerate(self.queued):
      first = replica * self.local_slots
      for i, entry in enumerate(queued):
        seq, at = entry.seq, first + i
        rows[at, paged_programs.Q_POSITION] = seq.length
        rows[at, paged_programs.Q_BUDGET] = seq.budget
        rows[at, paged_programs.Q_ROW] = seq.row
        rows[at, paged_programs.Q_SOURCE] = entry.source
        if entry.copy is not None:
          rows[
              at, paged_programs.Q_COPY_FROM : paged_programs.Q_COPY_TO + 1
          ] = entry.copy
        pages = seq.pages[:view]
        rows[at, columns : columns + len(pages)] = pages
      self.slot_values[
          first : first + self.local_slots, paged_programs.QUEUED
      ] = len(queued)
    return rows

  def decode(self, view: int, stop_after) -> jax.Array:
    """One `paged_programs.decode` call over the tables' first `view`
    pages, each replica's free slots taking its queued continuations, each
    replica returning once stop_after[r] of its sequences have finished
    with no queued successor; returns its packed results
    (`paged_programs.unpack_decoded`)."""
    self.slot_values[:, paged_programs.STOP_AFTER] = np.repeat(
        stop_after, self.local_slots
    )
    queue = self.queue_inputs(view)
    inputs = np.concatenate(
        [self.slot_inputs[:, : paged_programs.SLOT_COLUMNS + view], queue],
        axis=1,
    )
    self.pool, self.states, self.logits, out = paged_programs.decode(
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
    for view in paged_sizes.power_buckets(self.width):
      self.decode(view, idle)
    # A first chunk's program, and one running on from a chunk before.
    calls = 1 if self.bucket <= self.chunk else 2
    for count in paged_sizes.power_buckets(self.most_contexts):
      self.prefill({}, count, calls)
    _WARM.add(key)

  def reserve_chunk(self, running: list) -> None:
    """Takes from the pool the pages the running slots' next chunk may
    write (reserved for them at admission)."""
    size = self.engine.page_size
    last = np.minimum(
        self.slot_values[running, paged_programs.POSITIONS] + self.engine.chunk,
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
          int(self.slot_values[slot, paged_programs.POSITIONS])
          + self.engine.chunk,
      )
      self.tables[slot, before : before + count] = seq.pages[before:]
      self.slot_pages[slot] += count

  def collect(self, out) -> None:
    """A decode call's new ids into their rows; the queued continuations
    it started into their slots; finished sequences leave their slots
    and pages."""
    decoded = paged_programs.unpack_decoded(
        jax.device_get(out), self.engine.chunk
    )
    finals = decoded.finals
    self.figures["decode_calls"] += 1
    self.figures["decode_steps"] += int(
        np.max(finals[:, paged_programs.FINAL_CALL_STEPS])
    )
    drawn = decoded.rows >= 0
    rows, at = decoded.rows[drawn], decoded.steps[drawn]
    self.ids[rows, at] = decoded.ids[drawn]
    self.log_probs[rows, at] = decoded.log_probs[drawn]
    # The sequences that ran in this call: those in slots before it, and
    # those it took from the queues.
    running = {seq.row: seq for seq in self.in_slot if seq is not None}
    for replica, queued in enumerate(self.queued):
      taken = int(
          finals[replica * self.local_slots, paged_programs.FINAL_TAKEN]
      )
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
    active = finals[:, paged_programs.FINAL_ACTIVE] > 0
    for slot in range(self.slots):
      seq = (
          running.get(int(finals[slot, paged_programs.FINAL_ROWS]))
          if active[slot]
          else None
      )
      if seq is self.in_slot[slot]:
        continue
      self.in_slot[slot] = seq
      self.tables[slot] = 0
      if seq is None:
        self.slot_pages[slot] = 0
        self.slot_values[slot, paged_programs.BUDGETS] = 1
        continue
      self.tables[slot, : len(seq.pages)] = seq.pages
      self.slot_pages[slot] = len(seq.pages)
      self.slot_ends[slot] = seq.length + seq.budget - 1
      self.slot_values[slot, paged_programs.BUDGETS] = seq.budget
      self.slot_values[slot, paged_programs.ROWS] = seq.row
    self.slot_values[:, paged_programs.STEPS] = finals[
        :, paged_programs.FINAL_STEPS
    ]
    self.slot_values[:, paged_programs.POSITIONS] = finals[
        :, paged_programs.FINAL_POSITIONS
    ]
    self.slot_values[:, paged_programs.ACTIVE] = active

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
      out = self.decode(
          paged_sizes.power_bucket(widest, self.width), self.stop_after()
      )
      self.prefill_ahead()
      self.collect(out)

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

  def result(self) -> dict:
    """The rows and the run's figures: `paged_decoder.EngineGeneration`'s
    fields, by name."""
    page_bytes = paged_model.pool_bytes(
        self.config, 1, self.engine.page_size, self.attention
    )
    state_bytes = kv_cache.state_bytes_per_row(self.config) * self.slots
    pages_used = sum(book.peak_in_use for book in self.books)
    return dict(
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
