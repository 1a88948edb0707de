"""The paged decoder's sizes: slots, pages, tables and the programs' buckets.

Every size here is a function of the engine's options
(`paged_decoder.EngineOptions`, the `engine` argument below) and of the
requests' longest lengths, never of a request itself, so the programs the
engine compiles depend on buckets only. Prefill is compiled once per
length bucket of a call's longest context (the decoder's `cache_length`
buckets, `prefill_length`) and power-of-two number of contexts
(`prefill_contexts`); the decode program once per power-of-two number of
pages a slot may see (`power_buckets` up to the pages of the longest
sequence's bucket, `table_width`): all of them on a process's first call
of its shapes (`paged_scheduler.Scheduler.warm_up`).

On a mesh of R data-parallel replicas the slot count is rounded up to a
multiple of R (`replica_slots`), and so is the page count (the default
pool is (S + R) x the widest table: each replica's slots' longest
sequences plus one waiting context, `pool_pages`).
"""

from maxtext.generation import decoder
from maxtext.model import model_config


def page_count(positions: int, page_size: int) -> int:
  """The pages that hold `positions` positions."""
  return -(-positions // page_size)


def table_width(
    config: model_config.ModelConfig, length: int, page_size: int
) -> int:
  """The pages of a slot's table for sequences of up to `length` positions
  (context plus max_new_tokens): the pages of the length bucket
  (`decoder.cache_length`), so the pool's and tables' shapes, and the
  programs, depend on the bucket only."""
  return page_count(
      decoder.cache_length(length, config.max_sequence_length), page_size
  )


def _round_up(count: int, multiple: int) -> int:
  return -(-count // multiple) * multiple


def replica_slots(slots: int, replicas: int) -> int:
  """The engine's slots for `slots` asked of `replicas` data-parallel
  replicas: rounded up to a multiple of them, so each replica has the
  same number (S / R)."""
  return _round_up(slots, replicas)


def pool_pages(engine, slots: int, width: int, replicas: int = 1) -> int:
  """The pool's pages over all replicas: `engine.num_pages` rounded up to
  a multiple of `replicas`, or by default (slots + replicas) x the widest
  table: each replica's slots' longest sequences plus one waiting context
  (`paged_decoder.EngineOptions.num_pages`)."""
  if engine.num_pages:
    return _round_up(engine.num_pages, replicas)
  return (slots + replicas) * width


def prefill_length(
    config: model_config.ModelConfig, longest: int, page_size: int
) -> int:
  """The prefill program's tokens for contexts of up to `longest` ids: their
  length bucket, in whole pages."""
  bucket = decoder.cache_length(longest, config.max_sequence_length)
  return page_count(bucket, page_size) * page_size


def prefill_chunk(engine, length: int) -> int:
  """The positions of a context one prefill call writes, for contexts of
  the length bucket `length`: all of them, or `engine.prefill_tokens` (a
  longer context is prefilled by several calls)."""
  return min(length, engine.prefill_tokens)


def prefill_contexts(
    engine, length: int, local_slots: int, num_samples: int
) -> int:
  """The most contexts one prefill call writes per replica: enough to fill
  a replica's slots with their `num_samples` continuations each, within
  `engine.prefill_tokens` tokens of `length` (the prefill chunk); at
  least one."""
  return power_bucket(
      -(-local_slots // num_samples), max(engine.prefill_tokens // length, 1)
  )


def power_bucket(count: int, limit: int) -> int:
  """The smallest power of two >= count, at most `limit`."""
  return min(1 << max(count - 1, 0).bit_length(), limit)


def power_buckets(limit: int) -> list[int]:
  """Every value `power_bucket(count, limit)` takes: 1, 2, 4, .. up to limit."""
  sizes = [1]
  while sizes[-1] < limit:
    sizes.append(min(2 * sizes[-1], limit))
  return sizes
