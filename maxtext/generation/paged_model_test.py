"""Tests for paged_model: the pool read through a view and in place."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel
import ml_collections
import numpy as np

from maxtext.generation import cached_model
from maxtext.generation import kv_cache
from maxtext.generation import paged_model
from maxtext.model import transformer
from testing import tiny_configs


def ragged_reference(
    q, pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, sm_scale
):
  """The ragged paged attention kernel's arithmetic, traceable, for rows
  of equal query counts (as `paged_model.ragged_attend` calls it): row b's
  queries are the last S of its kv_lens[b] positions, which lie in pages
  page_indices[b] in order; key head h of a page is its combined head 2h,
  value head h its 2h + 1; query head j reads kv head j // (H / K)."""
  del cu_q_lens, num_seqs  # Every row a sequence of S queries.
  rows = page_indices.shape[0]
  steps = q.shape[0] // rows
  heads, width = q.shape[1], q.shape[2]
  kv = pages[page_indices].reshape(rows, -1, pages.shape[2], width)
  group = heads // (pages.shape[2] // 2)
  k = jnp.repeat(kv[..., 0::2, :], group, axis=2)
  v = jnp.repeat(kv[..., 1::2, :], group, axis=2)
  queries = q.reshape(rows, steps, heads, width)
  scores = jnp.einsum("bshd,bthd->bhst", queries, k).astype(jnp.float32)
  at = kv_lens[:, None] - steps + jnp.arange(steps)[None]
  visible = jnp.arange(k.shape[1])[None, None, :] <= at[:, :, None]
  scores = jnp.where(visible[:, None], scores * sm_scale, -1e30)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bhst,bthd->bshd", probs, v)
  return out.reshape(q.shape).astype(q.dtype)


class RaggedReferenceTest(parameterized.TestCase):

  @parameterized.parameters(1, 3)
  def test_the_reference_is_the_kernel_packages_own(self, steps):
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    rows, heads, kv_heads, width, page = 3, 4, 2, 8, 4
    q = jax.random.normal(keys[0], (rows * steps, heads, width))
    pages = jax.random.normal(keys[1], (12, page, 2 * kv_heads, width))
    kv_lens = jnp.asarray([3, 9, 16], jnp.int32)
    tables = jnp.asarray([[5, 0, 0, 0], [2, 7, 1, 0], [4, 3, 9, 11]])
    args = (
        q,
        pages,
        kv_lens,
        tables.astype(jnp.int32),
        jnp.arange(rows + 1, dtype=jnp.int32) * steps,
        jnp.asarray([rows], jnp.int32),
    )
    np.testing.assert_allclose(
        ragged_reference(*args, sm_scale=0.3),
        kernel.ref_ragged_paged_attention(*args, sm_scale=0.3),
        atol=1e-5,
    )


_KINDS = {
    "dense": ((), dict(num_kv_heads=4)),
    "gqa": ((), {}),
    "shared_kv_heads": ((), dict(num_kv_heads=1)),
    "mla": ((tiny_configs.TINY_MLA,), {}),
    "moe": ((tiny_configs.TINY_MOE,), {}),
    # Qwen3.5's hybrid: per-slot Gated DeltaNet states beside the pages,
    # its attention layers a second stack.
    "hybrid": ((tiny_configs.TINY_QWEN35,), {}),
}
# Each kind read through the gathered view and in place (MLA's latents are
# always gathered).
_CASES = tuple(
    (f"{name}_{how}", name, attention)
    for name in _KINDS
    for how, attention in (("gather", "gather"), ("in_place", None))
)
# Two rows of 12 random ids: prompts of 5 and 8 ids, then 4 decode steps.
_PROMPT = np.array([5, 8])
_DECODE_STEPS = 4


# The forward passes jitted, each for its config (and attention): an eager
# call traces its layer scan's body anew and compiles it again, once a call.
_dense_forward = jax.jit(cached_model.forward, static_argnames="config")
_paged_forward = jax.jit(
    paged_model.forward, static_argnames=("config", "attention")
)


@functools.cache
def _dense_reference(kind):
  """(config, params, ids, hidden states of the prompts, logits of each
  decode step) of the kind's model over the dense cache: the reference of
  both of its cases, computed once."""
  presets, overrides = _KINDS[kind]
  config = ml_collections.FrozenConfigDict(
      tiny_configs.model_config(*presets, max_sequence_length=64, **overrides)
  )
  params = transformer.init_params(config, jax.random.PRNGKey(0))
  rng = np.random.default_rng(2)
  ids = rng.integers(0, config.vocab_size, size=(2, 12)).astype(np.int32)
  dense = kv_cache.init(config, 2, 16)
  positions = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8))
  tokens = jnp.asarray(np.where(positions < _PROMPT[:, None], ids[:, :8], 0))
  prefill, dense = _dense_forward(
      params, tokens, positions, dense, config, lengths=jnp.asarray(_PROMPT)
  )
  steps = []
  for step in range(_DECODE_STEPS):
    at = jnp.asarray(_PROMPT + step, jnp.int32)[:, None]
    token = jnp.asarray(ids[np.arange(2), _PROMPT + step])[:, None]
    hidden, dense = _dense_forward(params, token, at, dense, config)
    steps.append(cached_model.logits(params, hidden))
  return config, params, ids, prefill, steps


class RaggedAttendTest(parameterized.TestCase):

  @parameterized.named_parameters(*_CASES)
  def test_paged_logits_equal_the_dense_cache(self, kind, attention):
    attention = attention or ragged_reference
    config, params, ids, want, want_steps = _dense_reference(kind)
    prompt = _PROMPT
    # Pages of 4 positions, each row's scattered over the pool; the unused
    # table entry 99 lies outside it.
    tables = jnp.asarray([[6, 1, 3, 99], [2, 7, 4, 5]], jnp.int32)
    pool = paged_model.init_pool(config, 8, 4, attention)
    states = kv_cache.init_states(config, 2)
    positions = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8))
    tokens = jnp.asarray(np.where(positions < prompt[:, None], ids[:, :8], 0))
    got, pool, states = _paged_forward(
        params,
        tokens,
        positions,
        positions < prompt[:, None],
        pool,
        tables,
        config,
        states,
        attention=attention,
    )
    for row, length in enumerate(prompt):
      np.testing.assert_allclose(
          got[row, :length], want[row, :length], atol=1e-4
      )
    for step in range(_DECODE_STEPS):
      at = jnp.asarray(prompt + step, jnp.int32)[:, None]
      token = jnp.asarray(ids[np.arange(2), prompt + step])[:, None]
      got, pool, states = _paged_forward(
          params,
          token,
          at,
          jnp.ones_like(at, bool),
          pool,
          tables,
          config,
          states,
          attention=attention,
      )
      np.testing.assert_allclose(
          cached_model.logits(params, got), want_steps[step], atol=1e-4
      )

  def test_kernel_query_blocks_hold_a_sequences_share_of_the_queries(self):
    # A decode step (one query a sequence) gets blocks of one query: the
    # kernel computes each sequence against every row of its block.
    self.assertEqual(paged_model.kernel_queries_per_block(64, 64), 1)
    self.assertEqual(paged_model.kernel_queries_per_block(16, 64), 1)
    # Prefill: a power of two holding one sequence's mean share, at most
    # `_KERNEL_QUERIES` and the call's rows.
    self.assertEqual(paged_model.kernel_queries_per_block(12, 2), 8)
    self.assertEqual(paged_model.kernel_queries_per_block(2048, 1), 32)
    self.assertEqual(paged_model.kernel_queries_per_block(6, 1), 6)
    for tokens in range(1, 70):
      for sequences in range(1, 9):
        q = paged_model.kernel_queries_per_block(tokens, sequences)
        # A power of two, or all of the call's rows.
        self.assertTrue(q == tokens or q & (q - 1) == 0, (tokens, q))
        self.assertLessEqual(q, min(tokens, 32))
        self.assertGreaterEqual(q, min(tokens, 32, -(-tokens // sequences)))

  def test_a_kernels_pool_keeps_keys_and_values_in_one_leaf(self):
    config = ml_collections.FrozenConfigDict(
        tiny_configs.model_config(max_sequence_length=64)
    )
    self.assertEqual(
        set(paged_model.init_pool(config, 3, 4)["layers"]), {"k", "v"}
    )
    pool = paged_model.init_pool(config, 3, 4, ragged_reference)
    self.assertEqual(set(pool["layers"]), {"kv"})
    # Heads padded to the TPU's 128 lanes (the tiny heads are narrower).
    self.assertLess(config.head_dim, 128)
    self.assertEqual(paged_model.kernel_head_dim(config.head_dim), 128)
    self.assertEqual(paged_model.kernel_head_dim(128), 128)
    self.assertEqual(paged_model.kernel_head_dim(192), 256)
    self.assertEqual(
        pool["layers"]["kv"].shape,
        (config.num_layers, 3, 4, 2 * config.num_kv_heads, 128),
    )
    self.assertEqual(
        kv_cache.total_bytes(pool),
        paged_model.pool_bytes(config, 3, 4, ragged_reference),
    )
    self.assertEqual(
        paged_model.pool_bytes(config, 3, 4),
        kv_cache.bytes_per_token(config) * 3 * 4,
    )


if __name__ == "__main__":
  absltest.main()
