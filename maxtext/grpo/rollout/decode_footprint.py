"""The least a GRPO run's paged decoder takes, refused where it cannot fit.

The paged decoder (`paged_decoder.generate`) keeps every sequence's keys
and values in a pool of pages on the generation devices
(`paged_model.pool_bytes`, and a hybrid model's recurrent states per slot)
and books those pages on the host (`page_pool.PagePool`, the pages each
sequence holds, each slot's page table); every process holds the whole
book. `least` gives the smallest pool and book a run's rollouts and
evaluations can have, taking every favourable case: one data replica,
contexts of one id followed by the fewest new tokens a first call asks
for, `grpo_decode_slots` slots (0: one per row of the largest decode,
`RolloutConfig.decoded_rows`). Both read the run's generation settings
(`rollout_config.RolloutConfig`). `check` refuses, in one line naming the field
and before any parameter exists, settings for which even that cannot fit:

  grpo_decode_slots      the pool's share of one device (spread evenly
                         over every generation device) is more than the
                         device's memory; on the CPU, a process's share
                         more than the host's. The most slots that fit
                         are named.
  grpo_decode_page_size  the book is more than the host's memory and a
                         larger page would fit it: the smallest such page
                         is named (otherwise grpo_decode_slots, with the
                         most slots that fit).

Each is checked alone, beside nothing else (the parameters, the optimizer
state and the compiled programs take their own): passing says only that
the decoder is not sure to run out of memory.
"""

import dataclasses
from typing import Optional

from maxtext.generation import kv_cache
from maxtext.generation import page_pool
from maxtext.generation import paged_decoder
from maxtext.generation import paged_model
from maxtext.generation import paged_sizes
from maxtext.grpo.rollout import rollout_config

# Host bytes per page beside its book's: its entry in the list of pages
# its sequence holds.
_HELD_BYTES = 8
# Bytes of one page table entry (int32).
_TABLE_BYTES = 4
_GIB = float(1 << 30)


@dataclasses.dataclass(frozen=True)
class Footprint:
  """The smallest pool and book of a run's settings (module docstring).

  Attributes:
    slots: sequences decoded together.
    width: pages of a slot's table.
    pages: pages of the pool: (slots + 1) x width.
    pool_bytes: the pool's bytes over all devices, with the slots'
      recurrent states (a hybrid model's).
    book_bytes: the host's bytes for the pages' book and the tables.
  """

  slots: int
  width: int
  pages: int
  pool_bytes: int
  book_bytes: int


def fewest_new_tokens(settings: rollout_config.RolloutConfig) -> int:
  """The fewest new tokens a run's first decode call asks for: a text
  task's first turn gets grpo_max_turn_tokens (0: all of the completion),
  a single-turn rollout grpo_max_completion_length."""
  completion = settings.grpo_max_completion_length
  return min(settings.grpo_max_turn_tokens or completion, completion)


def least(
    settings: rollout_config.RolloutConfig, slots: int, page_size: int
) -> Footprint:
  """The smallest pool and book of `slots` slots (0: one per row) of pages
  of `page_size` positions, for a GRPO run's generation settings."""
  slots = slots or settings.decoded_rows()
  model = settings.model
  width = paged_sizes.table_width(
      model, 1 + fewest_new_tokens(settings), page_size
  )
  pages = paged_sizes.pool_pages(
      paged_decoder.EngineOptions(page_size=page_size), slots, width
  )
  pool = paged_model.pool_bytes(model, pages, page_size)
  pool += kv_cache.state_bytes_per_row(model) * slots
  book = pages * (page_pool.BOOK_BYTES_PER_PAGE + _HELD_BYTES)
  book += slots * width * _TABLE_BYTES
  return Footprint(slots, width, pages, pool, book)


def check(
    settings: rollout_config.RolloutConfig,
    *,
    devices: int,
    device_bytes: Optional[int],
    host_bytes: Optional[int],
    pool_on_host: bool = False,
    processes: int = 1,
) -> None:
  """Refuses paged decoder settings that cannot fit (module docstring).

  Args:
    settings: a GRPO run's generation settings, of a config validated by
      `config_lib.validate_grpo`.
    devices: the generation devices, all processes'.
    device_bytes: one generation device's memory; None: unknown (the
      devices are not checked).
    host_bytes: one host's memory; None: unknown (the host is not checked).
    pool_on_host: the devices are the hosts' CPUs: the pool lies in the
      hosts' memory, a process's share in each.
    processes: the job's processes, one a host.

  Raises:
    ValueError: one line naming grpo_decode_slots or grpo_decode_page_size.
  """
  if settings.grpo_decoder != "paged":
    return
  smallest = least(
      settings, settings.grpo_decode_slots, settings.grpo_decode_page_size
  )
  if pool_on_host:
    if host_bytes is not None:
      _check_pool(settings, smallest, processes, host_bytes, "host")
  elif device_bytes is not None:
    _check_pool(settings, smallest, devices, device_bytes, "device")
  if host_bytes is not None:
    _check_book(settings, smallest, host_bytes)


def _slots_text(
    settings: rollout_config.RolloutConfig, footprint: Footprint
) -> str:
  if settings.grpo_decode_slots:
    return f"{footprint.slots} slots"
  return f"{footprint.slots} slots (0: one per row)"


def _check_pool(
    settings: rollout_config.RolloutConfig,
    smallest: Footprint,
    ways: int,
    limit: int,
    what,
):
  """Refuses a pool whose share of each of `ways` memories of `limit`
  bytes is more than that."""
  share = -(-smallest.pool_bytes // ways)
  if share <= limit:
    return
  size = settings.grpo_decode_page_size
  # The pool is (slots + 1) tables of pages and a state per slot.
  table = paged_model.pool_bytes(settings.model, smallest.width, size)
  per_slot = table + kv_cache.state_bytes_per_row(settings.model)
  most = (limit * ways - table) // per_slot
  advice = (
      f"at most {most} slots fit beside nothing else"
      if most >= 1
      else "not one slot fits: fewer new tokens or more devices"
  )
  raise ValueError(
      f"config.grpo_decode_slots={settings.grpo_decode_slots}: the paged "
      f"decoder's page pool for {_slots_text(settings, smallest)} of "
      f"{smallest.width} pages of {size} positions takes at least "
      f"{smallest.pool_bytes / _GIB:.2f} GiB, {share / _GIB:.2f} GiB on each "
      f"of {ways} {what}(s), more than one's {limit / _GIB:.2f} GiB: {advice}"
  )


def _check_book(
    settings: rollout_config.RolloutConfig, smallest: Footprint, limit: int
) -> None:
  """Refuses a page book larger than the host's `limit` bytes, naming the
  smallest page that fits it, or else the most slots."""
  if smallest.book_bytes <= limit:
    return
  size, slots = settings.grpo_decode_page_size, settings.grpo_decode_slots
  text = (
      f"the paged decoder's page book of {smallest.pages} pages "
      f"({_slots_text(settings, smallest)} of {smallest.width} pages) takes at "
      f"least {smallest.book_bytes / _GIB:.2f} GiB, more than the host's "
      f"{limit / _GIB:.2f} GiB"
  )
  largest = settings.largest_decode_page()
  larger = size * 2
  while larger <= largest:
    if least(settings, slots, larger).book_bytes <= limit:
      raise ValueError(
          f"config.grpo_decode_page_size={size}: {text}: pages of {larger} "
          "positions or more fit"
      )
    larger *= 2
  # The book is (slots + 1) tables' pages and a table per slot.
  width = least(settings, slots, largest).width
  held = page_pool.BOOK_BYTES_PER_PAGE + _HELD_BYTES
  most = (limit - width * held) // (width * (held + _TABLE_BYTES))
  raise ValueError(
      f"config.grpo_decode_slots={slots}: {text}: at most {max(most, 0)} "
      f"slots fit beside nothing else, with pages of {largest} positions"
  )
