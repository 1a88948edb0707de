"""The model over a paged key/value cache: one pool of pages, a table per row.

The pool has the dense cache's pytree (`kv_cache`) with pages in place of
rows: each leaf is [L, N, P, ...] (L layers of the stack, N pages, P
positions a page). Row b's page table `tables[b]` lists its pages in
position order, so its position p lies in page tables[b, p // P] at offset
p % P. Rows that continue one prompt list the same pages for the prompt's
positions, so the prompt's keys and values are stored once.

`forward` is `cached_model.forward` (the same layers, the same arithmetic)
with `paged_store`: each layer scatters the new tokens' entries into their
pages of its layer of the pool (in place: the pool is never copied), then
gathers each row's pages of that layer into a [B, T' * P, ...] view that
attention reads exactly as it reads the dense cache (a query at position p
sees view slots 0..p, which are the row's positions 0..p). Tokens marked
invalid (prefill padding, empty decode slots, a row's last token) write
nothing. The gather costs one copy of the visible pages per layer and call;
a TPU kernel that reads the pages in place (ragged paged attention) is the
faster way and computes the same thing.

A hybrid model's Gated DeltaNet layers keep no pages: their states are one
per row of the call (`kv_cache.init_states`), passed and returned beside
the pool; a row's state advances over its valid tokens only.
"""

from typing import Any

import jax
import jax.numpy as jnp

from maxtext.generation import cached_model
from maxtext.generation import kv_cache


def init_pool(config, num_pages: int, page_size: int) -> kv_cache.Cache:
  """A zero pool of `num_pages` pages of `page_size` positions."""
  return kv_cache.init_entries(config, num_pages, page_size)


def page_size_of(pool: kv_cache.Cache) -> int:
  """The positions a page of `pool` holds."""
  return jax.tree_util.tree_leaves(pool)[0].shape[2]


def pool_bytes(config, num_pages: int, page_size: int) -> int:
  """Bytes of a pool of `num_pages` pages of `page_size` positions."""
  return kv_cache.bytes_per_token(config) * num_pages * page_size


def paged_store(
    tables: jax.Array, valid: jax.Array, page_size: int
) -> cached_model.Store:
  """The `cached_model.Store` of a paged pool.

  Args:
    tables: int32 [B, T'] page ids, the row's pages in position order
      (entries past the row's last page may be any page id: attention
      never sees their positions).
    valid: bool [B, S]: which of the call's tokens write their entries.
    page_size: positions per page.

  Returns:
    The store: writes each valid token's entries at (the layer, its page,
    its offset) of the [L, N, P, ...] pool leaves, and returns the layer's
    [B, T' * P, ...] view of each row's pages.
  """
  rows, width = tables.shape

  def store(entries, index, new, positions):
    num_pages = jax.tree_util.tree_leaves(entries)[0].shape[1]
    column = jnp.clip(positions // page_size, 0, width - 1)
    page = jnp.take_along_axis(tables, column, axis=1)
    # An out-of-range page id: the scatter drops these tokens' entries.
    page = jnp.where(valid, page, num_pages)
    offset = positions % page_size
    written, view = {}, {}
    for name, value in new.items():
      leaf = entries[name]
      leaf = leaf.at[index, page, offset].set(
          value.astype(leaf.dtype), mode="drop"
      )
      written[name] = leaf
      view[name] = leaf[index, tables].reshape(
          (rows, width * page_size) + leaf.shape[3:]
      )
    return written, view

  return store


def forward(
    params: Any,
    tokens: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    pool: kv_cache.Cache,
    tables: jax.Array,
    config,
    states: kv_cache.Cache,
) -> tuple[jax.Array, kv_cache.Cache, kv_cache.Cache]:
  """Runs the blocks over `tokens`, reading and extending the paged `pool`.

  Args:
    params: the parameter pytree (`transformer.init_params`).
    tokens: int32 [B, S] ids.
    positions: int32 [B, S] their positions (< T' * page_size); a row's
      earlier positions must already be in its pages (or in `tokens`).
    valid: bool [B, S]: tokens whose entries are written; each row's valid
      tokens come first (a right-padded prompt, or a decode slot's one).
    pool: `init_pool`'s pool or one a call returned.
    tables: int32 [B, T'] the rows' page tables.
    config: the model's config.
    states: the rows' Gated DeltaNet states (`kv_cache.init_states(config,
      B)` or ones a call returned; {} for a model without them).

  Returns:
    (hidden, pool, states): as `cached_model.forward`; the pool with the
    valid tokens' entries written, each row's states after its valid
    tokens.
  """
  store = paged_store(tables, valid, page_size_of(pool))
  hidden, cache = cached_model.forward(
      params,
      tokens,
      positions,
      {**pool, **states},
      config,
      store,
      lengths=jnp.sum(valid, axis=1, dtype=jnp.int32),
  )
  return (
      hidden,
      {name: cache[name] for name in pool},
      {name: cache[name] for name in states},
  )
