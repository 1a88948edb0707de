"""The paged decoder's programs lowered ahead of time, for abstract arguments.

`lower` lowers the prefill and decode programs (`paged_programs`) that
`paged_decoder.generate` runs for given slots and lengths, from the
parameters' shapes and shardings alone, without running them: the
arrays' shapes and placements are the ones `generate` would build
(`paged_sizes`, `replica_layout`), so compiling the result for a device
kind (a TPU slice described on this host) gives the memory and programs a
rollout on those devices would have.
"""

import contextlib
import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from maxtext.core import checks
from maxtext.generation import kv_cache
from maxtext.generation import paged_decoder
from maxtext.generation import paged_model
from maxtext.generation import paged_programs
from maxtext.generation import paged_sizes
from maxtext.generation import replica_layout
from maxtext.model import model_config

P = jax.sharding.PartitionSpec


@dataclasses.dataclass(frozen=True)
class LoweredEngine:
  """The engine's programs lowered for abstract arguments (`lower`).

  Attributes:
    programs: "prefill" (a chunk of `paged_sizes.prefill_chunk` positions
      of its most contexts per data replica, `paged_sizes.prefill_contexts`
      for one sample a context, running on from a chunk before where
      `paged_sizes.prefill_length` takes more than one) and "decode"
      (`chunk` steps of every slot over the widest table), as
      `jax.stages.Lowered`.
    pool: the page pool's shapes and shardings.
    states: the slots' recurrent states' ({} without recurrent layers).
    logits: the slots' next-token logits'.
    num_slots: the slots (`paged_sizes.replica_slots`: a multiple of the
      replicas).
    num_pages: the pool's pages (all replicas').
    width: pages of a slot's table.
    prefill_length: tokens of the prefill program.
    chunk: most steps of a decode call (`paged_decoder.configured`).
  """

  programs: dict
  pool: Any
  states: Any
  logits: Any
  num_slots: int
  num_pages: int
  width: int
  prefill_length: int
  chunk: int


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
    engine: paged_decoder.EngineOptions = paged_decoder.EngineOptions(),
    mesh: Optional[jax.sharding.Mesh] = None,
) -> LoweredEngine:
  """Lowers `paged_decoder.generate`'s prefill and decode programs, unrun.

  The arguments are the ones `paged_decoder.generate` passes for `num_slots`
  slots (rounded up to a multiple of the mesh's data replicas,
  `paged_sizes.replica_slots`) of sequences of up to `length` positions
  (context plus max_new_tokens) and contexts of up to `prompt_length` ids: the
  pool and the per-slot arrays split over the replicas as `replica_layout`
  says, the parameters as `params`' shapes and shardings say. Prefill takes
  its most contexts per replica (`paged_sizes.prefill_contexts`, one sample
  each: the most memory of its sizes). Decode is the widest view's (every page
  of a table: the most memory of the view buckets), drawing by temperature
  without top-k or top-p (as a rollout at temperature 1 and top-p 1 does).

  Args:
    params: the parameters' `jax.ShapeDtypeStruct`s (with shardings on
      `mesh`).
    config: the model's config or the run's.
    num_slots: sequences decoded together (>= 1).
    length: positions of the longest sequence (<= max_sequence_length).
    prompt_length: ids of the longest context (< length).
    engine: page size, pages (0 = `paged_sizes.pool_pages`' default) and
      chunk; its num_slots is not read.
    mesh: the devices' mesh; None = one device.

  Returns:
    The programs and the engine's arrays' shapes.

  Raises:
    ValueError: a length or slot count out of range (one line).
  """
  config = model_config.of(config)
  check_lowering(config, num_slots, length, prompt_length)
  layout = replica_layout.for_model(config, mesh)
  engine, attention = paged_decoder.configured(engine, config, layout)
  num_slots = paged_sizes.replica_slots(num_slots, layout.replicas)
  width = paged_sizes.table_width(config, length, engine.page_size)
  num_pages = paged_sizes.pool_pages(engine, num_slots, width, layout.replicas)
  bucket = paged_sizes.prefill_length(config, prompt_length, engine.page_size)
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
      chunk=engine.chunk,
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
  chunk = paged_sizes.prefill_chunk(engine, bucket)
  replicas = layout.replicas
  rows = replicas * paged_sizes.prefill_contexts(
      engine, chunk, num_slots // replicas, 1
  )
  abstract, split, i32 = _Abstract(layout), layout.split, jnp.int32
  first = chunk == bucket
  return paged_programs.prefill.lower(
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
  replicas = layout.replicas
  chunk = paged_sizes.prefill_chunk(engine, bucket)
  most = paged_sizes.prefill_contexts(engine, chunk, num_slots // replicas, 1)
  ready = replicas * 2 * most
  return paged_programs.decode.lower(
      params,
      pool,
      states,
      logits,
      abstract.array(jnp.float32, ready, config.vocab_size, spec=split(0)),
      abstract.states(config, ready),
      abstract.array(
          i32,
          num_slots,
          paged_programs.SLOT_COLUMNS
          + paged_programs.QUEUE_COLUMNS
          + 2 * width,
          spec=split(0),
      ),
      abstract.array(key.dtype, *key.shape),
      abstract.array(jnp.float32),  # temperature
      abstract.array(i32),  # top_k
      abstract.array(jnp.float32),  # top_p
      abstract.array(i32, paged_programs.STOP_SLOTS),
      abstract.array(i32),  # allowed_vocab
      config=config,
      chunk=engine.chunk,
      greedy=False,
      filtered=False,
      layout=layout,
      attention=attention,
  )
