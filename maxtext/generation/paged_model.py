"""The model over a paged key/value cache: one pool of pages, a table per row.

The pool has the dense cache's pytree (`kv_cache`) with pages in place of
rows: each leaf is [L, N, P, ...] (L layers of the stack, N pages, P
positions a page). A grouped-query pool read by the ragged paged attention
kernel keeps keys and values in one leaf "kv" [L, N, P, 2K, D'], key head h
at 2h and its value at 2h + 1, D' the head dimension rounded up to the
TPU's 128 lanes (zero columns): the layout that kernel reads. Row b's page
table `tables[b]` lists its pages in position order, so its position p lies
in page tables[b, p // P] at offset p % P. Rows that continue one prompt
list the same pages for the prompt's positions, so the prompt's keys and
values are stored once.

`forward` is `cached_model.forward` (the same layers, the same arithmetic)
with `paged_store`: each layer scatters the new tokens' entries into their
pages of its layer of the pool (in place: the pool is never copied), then
gathers each row's pages of that layer into a [B, T' * P, ...] view that
attention reads exactly as it reads the dense cache (a query at position p
sees view slots 0..p, which are the row's positions 0..p). Tokens marked
invalid (prefill padding, empty decode slots, a row's last token) write
nothing. The gather costs one copy of the visible pages per layer and call;
a TPU kernel that reads the pages in place (ragged paged attention) is the
faster way and computes the same thing: with `attention` set to it (a
function of `ragged_paged_attention`'s signature), grouped-query layers
write their pages as above and the kernel reads each row's own pages of
the pool in place (`ragged_attend`), without a view.

A hybrid model's Gated DeltaNet layers keep no pages: their states are one
per row of the call (`kv_cache.init_states`), passed and returned beside
the pool; a row's state advances over its valid tokens only.
"""

from typing import Any, Callable, Union

import jax
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel
import jax.numpy as jnp

from maxtext.generation import cached_model
from maxtext.generation import kv_cache
from maxtext.model import layers
from maxtext.model import model_config

# A ragged paged attention function: (queries [T, H, D], pages [N, P, 2K,
# D], kv_lens [B], page_indices [B, W], cu_q_lens [B + 1], num_seqs [1],
# *, sm_scale) -> [T, H, D]; the Pallas TPU kernel
# `jax.experimental.pallas.ops.tpu.ragged_paged_attention` or its
# reference. "gather": the gathered view and `layers.attend_cached`.
Attention = Union[str, Callable[..., jax.Array]]


# Bytes of pages one block of the kernel copies into VMEM (it holds two,
# double-buffered, within its 16 MiB of scoped VMEM beside the queries and
# accumulators).
_KERNEL_BLOCK_BYTES = 4 * 2**20
# Positions of a block at most: the kernel copies a whole block's pages
# for every sequence, needed or not (a sequence shorter than a block has
# its missing pages fetched as page 0), so a block much longer than the
# rows' sequences reads mostly pages it throws away.
_KERNEL_BLOCK_POSITIONS = 256
# Queries of a block at most. The kernel computes every sequence of a
# block against all of the block's query rows (masked), so a block of 32
# queries over 32 decode sequences (one query each) does 32 times the
# work of its one real row per sequence.
_KERNEL_QUERIES = 32


def kernel_queries_per_block(tokens: int, sequences: int) -> int:
  """Query rows of a kernel block for a call of `tokens` query rows over
  `sequences` table rows: the power of two that holds one sequence's mean
  share of the queries (1 for a decode step, one query a sequence), at
  most `_KERNEL_QUERIES` and the call's own rows."""
  per_sequence = -(-tokens // max(sequences, 1))
  return max(
      1, min(tokens, _KERNEL_QUERIES, 1 << (per_sequence - 1).bit_length())
  )


def ragged_kernel(
    q, pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, sm_scale
):
  """The Pallas TPU ragged paged attention kernel, with block sizes chosen
  here: as many pages a block as fit `_KERNEL_BLOCK_BYTES` and
  `_KERNEL_BLOCK_POSITIONS` (a power of two, at most the table's width)
  and `kernel_queries_per_block` queries. The kernel's own tuned table
  keys on the host's device and lists no entry for the engine's
  16-position pages, where its default (128 pages a block) does not fit
  the 16 MiB of scoped VMEM; choosing here also lets a program for a TPU
  be compiled on a CPU host."""
  page_bytes = pages[0].size * pages.dtype.itemsize
  fit = min(
      max(_KERNEL_BLOCK_BYTES // page_bytes, 1),
      max(_KERNEL_BLOCK_POSITIONS // pages.shape[1], 1),
      page_indices.shape[1],
  )
  blocks = 1 << (fit.bit_length() - 1)
  return kernel.ragged_paged_attention(
      q,
      pages,
      kv_lens,
      page_indices,
      cu_q_lens,
      num_seqs,
      sm_scale=sm_scale,
      num_kv_pages_per_block=blocks,
      num_queries_per_block=kernel_queries_per_block(
          q.shape[0], page_indices.shape[0]
      ),
  )


# The TPU's lanes: the kernel's head dimension is a multiple of them.
_LANES = 128


def kernel_head_dim(head_dim: int) -> int:
  """The head dimension of a kernel's pool: `head_dim` rounded up to a
  multiple of the TPU's 128 lanes (the kernel's layout); the padding
  holds zeros, which add nothing to a query's dot product with a key and
  give output columns that are dropped."""
  return -(-head_dim // _LANES) * _LANES


def _combined(entries: dict) -> dict:
  """A stack's entries with grouped-query "k" and "v" [..., K, D] as one
  "kv" [..., 2K, D'] leaf, D' = `kernel_head_dim(D)` (MLA's entries
  unchanged)."""
  if "k" not in entries:
    return entries
  k = entries["k"]
  shape = k.shape[:-2] + (2 * k.shape[-2], kernel_head_dim(k.shape[-1]))
  return {"kv": jnp.zeros(shape, k.dtype)}


def _lanes(x: jax.Array, width: int) -> jax.Array:
  """`x` with its last dimension zero-padded to `width`."""
  pad = width - x.shape[-1]
  if not pad:
    return x
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])


def _interleaved(k: jax.Array, v: jax.Array, width: int) -> jax.Array:
  """[..., K, D] keys and values as [..., 2K, width]: key h at 2h, value
  at 2h + 1, zero-padded to `width` columns."""
  both = jnp.stack([k, v], axis=-2)
  return _lanes(
      both.reshape(k.shape[:-2] + (2 * k.shape[-2], k.shape[-1])), width
  )


def init_pool(
    config: model_config.ModelConfig,
    num_pages: int,
    page_size: int,
    attention: Attention = "gather",
) -> kv_cache.Cache:
  """A zero pool of `num_pages` pages of `page_size` positions, laid out
  for `attention` (`forward`'s): a kernel's keeps grouped-query keys and
  values in one "kv" leaf; the gather's keeps "k" and "v" apart, each
  gathered by one gather."""
  entries = kv_cache.init_entries(config, num_pages, page_size)
  if attention == "gather":
    return entries
  return {stack: _combined(leaves) for stack, leaves in entries.items()}


def page_size_of(pool: kv_cache.Cache) -> int:
  """The positions a page of `pool` holds."""
  return jax.tree_util.tree_leaves(pool)[0].shape[2]


def pool_bytes(
    config: model_config.ModelConfig,
    num_pages: int,
    page_size: int,
    attention: Attention = "gather",
) -> int:
  """Bytes of a pool of `num_pages` pages of `page_size` positions, laid
  out for `attention` (`init_pool`: a kernel's grouped-query heads padded
  to whole lanes). From the config alone: nothing is traced."""
  per_token = kv_cache.bytes_per_token(config)
  if attention != "gather" and config.attention_type != "mla":
    per_token = per_token * kernel_head_dim(config.head_dim) // config.head_dim
  return per_token * num_pages * page_size


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
    head_dim = new["k"].shape[-1] if "k" in new else 0
    if "kv" in entries:
      new = {"kv": _interleaved(new["k"], new["v"], entries["kv"].shape[-1])}
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
    if "kv" in view:  # Read only by a test's gather over a kernel's pool.
      kv = view.pop("kv")[..., :head_dim]
      view["k"], view["v"] = kv[..., 0::2, :], kv[..., 1::2, :]
    return written, view

  return store


def ragged_attend(
    tables: jax.Array,
    positions: jax.Array,
    scale: float,
    attention: Callable[..., jax.Array],
) -> cached_model.Attend:
  """Grouped-query attention over the pool read in place by `attention`
  (the ragged paged attention kernel, or its reference).

  The stack's pool [L, N, P, 2K, D] is the kernel's [L * N, P, 2K, D]
  pages (a reshape, no copy), layer l's page p being page l * N + p. Row
  b's S queries are the last S of its kv_lens[b] = positions[b, 0] + S
  positions (its call's positions run on from positions[b, 0], as every
  prefill and decode call's do), so the kernel's causal mask is the
  view's: a query at position p sees positions 0..p. A padded query (a
  prefill past its context, an empty slot) attends to what its row's
  pages hold and its output is never read.

  Args:
    tables: int32 [B, W] the rows' page tables (ids past a row's last
      page may be any id; they are clipped into the pool).
    positions: int32 [B, S] the call's positions.
    scale: the scores' scale (`layers.softmax_scale`).
    attention: the ragged paged attention function.

  Returns:
    `cached_model.Attend`: (the stack's entries, the layer index, q [B,
    S, H, D]) -> [B, S, H, D].
  """
  rows, width = tables.shape
  steps = positions.shape[1]

  def attend(entries, index, q):
    kv = entries["kv"]
    depth, num_pages = kv.shape[:2]
    pages = kv.reshape((depth * num_pages,) + kv.shape[2:])
    page_size = kv.shape[2]
    kv_lens = jnp.clip(positions[:, 0] + steps, steps, width * page_size)
    queries = _lanes(q, kv.shape[-1])
    out = attention(
        queries.reshape((rows * steps,) + queries.shape[2:]),
        pages,
        kv_lens.astype(jnp.int32),
        (jnp.clip(tables, 0, num_pages - 1) + index * num_pages).astype(
            jnp.int32
        ),
        jnp.arange(rows + 1, dtype=jnp.int32) * steps,
        jnp.array([rows], jnp.int32),
        sm_scale=scale,
    )
    return out[..., : q.shape[-1]].reshape(q.shape)

  return attend


def forward(
    params: Any,
    tokens: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    pool: kv_cache.Cache,
    tables: jax.Array,
    config: model_config.ModelConfig,
    states: kv_cache.Cache,
    attention: Attention = "gather",
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
    attention: "gather" (each layer reads a gathered view of the rows'
      pages) or a ragged paged attention function (`ragged_attend`; for
      grouped-query layers, whose call positions run on from each row's
      first); the pool's layout must be `init_pool`'s for it.

  Returns:
    (hidden, pool, states): as `cached_model.forward`; the pool with the
    valid tokens' entries written, each row's states after its valid
    tokens.
  """
  store = paged_store(tables, valid, page_size_of(pool))
  attend = None
  if attention != "gather" and config.attention_type != "mla":
    scale = layers.softmax_scale(config.head_dim, layers.rope_scaling(config))
    attend = ragged_attend(tables, positions, scale, attention)
  hidden, cache = cached_model.forward(
      params,
      tokens,
      positions,
      {**pool, **states},
      config,
      store,
      lengths=jnp.sum(valid, axis=1, dtype=jnp.int32),
      attend=attend,
  )
  return (
      hidden,
      {name: cache[name] for name in pool},
      {name: cache[name] for name in states},
  )
