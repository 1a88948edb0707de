"""The paged, continuous-batching engine against the static decoder.

The static decoder (`decoder.generate`) is the reference: on the same
contexts and `SamplingOptions` the engine must return the same ids, lengths
and (within float32 summation order, `_ATOL`) log-probabilities, for dense,
grouped-query, multi-head latent, mixture-of-experts and Qwen3.5 hybrid
models, greedy and
sampled (temperature, top-k, top-p, stop ids). Each row's draws are keyed by
(seed, row, step), so the ids also do not depend on the number of slots.
"""

import dataclasses
import time

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maxtext.generation import decoder
from maxtext.generation import paged_decoder
from maxtext.generation import kv_cache
from maxtext.generation import paged_model
from maxtext.generation import replica_layout
from maxtext.generation import sampling
from maxtext.model import model_config
from maxtext.model import transformer
from testing import compile_counter
from testing import dispatch_counter
from testing import tiny_configs

_ATOL = 1e-4

# (name, presets, overrides, committed): the kinds whose config no other
# case uses take their parameters committed to their device, as a trainer's
# are (`test_greedy_equals_the_static_decoder`).
_KINDS = (
    ("dense", (), dict(num_kv_heads=4), True),
    ("gqa", (), {}, False),
    ("mla", (tiny_configs.TINY_MLA,), {}, False),
    ("moe", (tiny_configs.TINY_MOE,), {}, False),
    # Qwen3.5's hybrid: per-slot Gated DeltaNet states beside the pages.
    ("hybrid", (tiny_configs.TINY_QWEN35,), {}, True),
)

# Contexts longer than 6 ids are prefilled in chunks of 6 positions, which
# end inside pages of 4: each call runs on from the one before (its pages,
# its recurrent states).
_SMALL = paged_decoder.EngineOptions(
    num_slots=3, page_size=4, chunk=5, prefill_tokens=6
)

# The greedy cases' contexts, 2 rows each, 12 new ids: sequences of up to
# 28 positions (the 32-position bucket).
_GREEDY_LENGTHS = (5, 16, 9, 2)


def _model(presets=(), seed=0, **overrides):
  overrides.setdefault("max_sequence_length", 64)
  config = ml_collections.FrozenConfigDict(
      tiny_configs.model_config(*presets, **overrides)
  )
  return config, transformer.init_params(config, jax.random.PRNGKey(seed))


def _prompts(rng, lengths, vocab=32):
  return [[int(i) for i in rng.integers(0, vocab, size=n)] for n in lengths]


class PagedModelTest(parameterized.TestCase):

  def test_invalid_tokens_write_nothing(self):
    config, params = _model()
    pool = paged_model.init_pool(config, 3, 4)
    tables = jnp.asarray([[1, 2]], jnp.int32)
    positions = jnp.arange(8, dtype=jnp.int32)[None]
    _, pool, _ = paged_model.forward(
        params,
        jnp.ones((1, 8), jnp.int32),
        positions,
        positions < 3,
        pool,
        tables,
        config,
        {},
    )
    k = np.asarray(pool["layers"]["k"])
    self.assertTrue(np.all(k[:, 0] == 0))  # not in the table
    self.assertTrue(np.all(k[:, 2] == 0))  # positions 4..7: padding
    self.assertTrue(np.all(np.any(k[:, 1, :3] != 0, axis=(-1, -2))))
    self.assertTrue(np.all(k[:, 1, 3] == 0))  # position 3: padding


class EngineTest(parameterized.TestCase):

  def _assert_same(self, got, want):
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_allclose(got.log_probs, want.log_probs, atol=_ATOL)

  @parameterized.named_parameters(*_KINDS)
  def test_greedy_equals_the_static_decoder(
      self, presets, overrides, committed
  ):
    config, params = _model(presets, **overrides)
    if committed:
      # Parameters committed to their device (as a trainer's are): the
      # engine's first arrays must be placed as its programs' outputs are,
      # or a later call meets them placed otherwise than its warm-up did and
      # compiles its programs again. (Their own case once: the same
      # engine's programs compiled for each placement cost as much again.)
      params = jax.device_put(params, jax.devices()[0])
      compile_counter.install()
    prompts = _prompts(np.random.default_rng(0), _GREEDY_LENGTHS)
    options = sampling.SamplingOptions(max_new_tokens=12, num_samples=2)
    start = time.monotonic()
    got = paged_decoder.generate(
        params, config, prompts, options, engine=_SMALL
    )
    first = compile_counter.backend_compiles_after(start)
    self._assert_same(got, decoder.generate(params, config, prompts, options))
    # One context a call (6 positions), 5, 16, 9 and 2 ids in chunks of 6.
    self.assertEqual(got.prefill_calls, 1 + 3 + 2 + 1)
    if committed:
      middle = time.monotonic()
      paged_decoder.generate(
          params,
          config,
          _prompts(np.random.default_rng(1), _GREEDY_LENGTHS),
          options,
          engine=_SMALL,
      )
      again = compile_counter.backend_compiles_after(middle)
      # One decode program per page view (1, 2, 4 and 8 pages), none twice.
      self.assertEqual(first.count("jit(_decode)"), 4, first)
      self.assertNotIn("jit(_decode)", again)
      self.assertNotIn("jit(_stage)", again)

  @parameterized.named_parameters(
      ("temperature", dict(temperature=1.0)),
      ("top_k_stop", dict(temperature=0.7, top_k=5, stop_ids=(3, 7))),
      ("top_p", dict(temperature=1.3, top_p=0.8, stop_ids=(1,))),
  )
  def test_sampling_equals_the_static_decoder(self, kwargs):
    config, params = _model((tiny_configs.TINY_MLA,))
    prompts = _prompts(np.random.default_rng(1), (3, 11, 4))
    options = sampling.SamplingOptions(
        max_new_tokens=10, num_samples=4, seed=5, **kwargs
    )
    got = paged_decoder.generate(
        params, config, prompts, options, engine=_SMALL
    )
    self._assert_same(got, decoder.generate(params, config, prompts, options))
    if options.stop_ids:
      # The options stop some rows early: the engine refilled their slots.
      self.assertLess(int(np.min(got.lengths)), 10)

  def test_ids_do_not_depend_on_the_slots(self):
    config, params = _model((tiny_configs.TINY_MOE,))
    # Sequences of up to 16 positions, the shortest cache length bucket:
    # tables of 8, 4 and 2 pages for the three page sizes (the 32-position
    # bucket would add a decode program of twice the view to each engine).
    # The context of 8 ids fills whole pages of every size, the one of 2
    # those of 2, the one of 7 none.
    prompts = _prompts(np.random.default_rng(3), (7, 2, 8))
    options = sampling.SamplingOptions(
        max_new_tokens=8,
        num_samples=3,
        temperature=1.0,
        seed=11,
        stop_ids=(4,),
    )
    runs = [
        paged_decoder.generate(
            params,
            config,
            prompts,
            options,
            engine=paged_decoder.EngineOptions(
                num_slots=slots, page_size=size, chunk=chunk
            ),
        )
        for slots, size, chunk in ((1, 4, 3), (4, 8, 32), (9, 2, 1))
    ]
    for run in runs[1:]:
      self._assert_same(run, runs[0])

  def test_refilling_several_slots_a_call_keeps_the_ids_in_fewer_calls(self):
    # One sample a prompt: every slot a finished sequence frees waits for
    # a prefill, which the host runs between calls (a queued continuation
    # of a prefilled context takes a freed slot within the call).
    config, params = _model()
    prompts = _prompts(
        np.random.default_rng(5), (3, 5, 2, 4, 6, 3, 2, 5, 4, 3, 5, 2)
    )
    options = sampling.SamplingOptions(
        max_new_tokens=12,
        num_samples=1,
        temperature=1.0,
        seed=2,
        stop_ids=(4, 9),
    )
    runs = [
        paged_decoder.generate(
            params,
            config,
            prompts,
            options,
            engine=paged_decoder.EngineOptions(
                num_slots=4, page_size=4, refill=refill
            ),
        )
        for refill in (1, 4)
    ]
    self._assert_same(runs[1], runs[0])
    # Rows stop early and the slots are refilled: waiting for four
    # finished sequences a call takes fewer calls (and more steps).
    self.assertLess(int(np.min(runs[0].lengths)), 12)
    self.assertLess(runs[1].decode_calls, runs[0].decode_calls)
    self.assertGreaterEqual(runs[1].decode_steps, runs[0].decode_steps)

  def test_each_context_is_prefilled_once_and_shares_its_pages(self):
    config, params = _model()
    # Lengths 5 and 9 end in a partial page of 4, 8 fills two pages.
    prompts = _prompts(np.random.default_rng(4), (5, 8, 9))
    g = 4
    options = sampling.SamplingOptions(max_new_tokens=6, num_samples=g)
    slots = 2 * g
    got = paged_decoder.generate(
        params,
        config,
        prompts,
        options,
        engine=paged_decoder.EngineOptions(
            num_slots=slots, page_size=4, chunk=8
        ),
    )
    self.assertEqual(got.prefill_passes, 3)
    # The first call prefills the two contexts the 8 free slots take; the
    # third waits for slots.
    self.assertEqual(got.prefill_calls, 2)
    # Each of G continuations but the last copies a partial last page.
    self.assertEqual(got.page_copies, 2 * (g - 1))
    # At most 2 contexts' rows run at once (8 slots, G = 4). Without
    # sharing a row needs ceil((9 + 6 - 1) / 4) = 4 pages, 32 for 8 rows.
    self.assertLess(got.pages_used, 32)
    self.assertEqual(
        got.peak_bytes, got.pages_used * 4 * kv_cache.bytes_per_token(config)
    )

  def test_a_chunk_of_zero_follows_the_attention_path(self):
    config = model_config.of(_model()[0])
    layout = replica_layout.for_model(config, None)
    engine, attention = paged_decoder.configured(
        paged_decoder.EngineOptions(), config, layout
    )
    # On this CPU host the layers gather their pages: 32-step calls.
    self.assertEqual((attention, engine.chunk), ("gather", 32))
    self.assertEqual(
        engine, dataclasses.replace(paged_decoder.EngineOptions(), chunk=32)
    )
    engine, _ = paged_decoder.configured(
        paged_decoder.EngineOptions(chunk=7), config, layout
    )
    self.assertEqual(engine.chunk, 7)
    with self.assertRaisesRegex(ValueError, "chunk must be >= 0"):
      paged_decoder.EngineOptions(chunk=-1)

  def test_a_rollout_that_fits_its_slots_is_a_few_launches(self):
    # A GRPO step's rollout: every completion has a slot. Warm, the call
    # launches a zero pool, zero slots, the draws' key (its seed staged and
    # hashed), one prefill of every context, one stage of their logits and
    # one decode call, whose slots start every continuation: the same
    # count for any number of contexts and samples that fit (no launch per
    # context, per continuation or per page copy).
    config, params = _model(num_layers=1)
    prompts = _prompts(np.random.default_rng(7), (3, 5, 2, 6, 4, 3, 5, 1))
    options = sampling.SamplingOptions(max_new_tokens=4, num_samples=4)
    engine = paged_decoder.EngineOptions(page_size=4)
    paged_decoder.generate(params, config, prompts, options, engine=engine)
    with dispatch_counter.record_launches() as names:
      got = paged_decoder.generate(
          params, config, prompts, options, engine=engine
      )
    programs = sorted(names)
    self.assertEqual(
        programs,
        [
            "jit(_decode)",
            "jit(_empty_pool)",
            "jit(_empty_slots)",
            "jit(_prefill)",
            "jit(_stage)",
            "jit(_threefry_seed)",
            "jit(stage)",
        ],
    )
    self.assertEqual((got.prefill_calls, got.decode_calls), (1, 1))
    self.assertEqual(got.prefill_passes, len(prompts))
    # Every context's length but 4 leaves a partial page: G - 1 copies.
    self.assertEqual(got.page_copies, 7 * 3)

  def test_each_row_has_its_own_max_new_tokens(self):
    # The shapes of the gqa kind's greedy case (contexts, rows, length
    # buckets, engine): its programs, compiled once for both.
    config, params = _model()
    prompts = _prompts(np.random.default_rng(5), _GREEDY_LENGTHS)
    options = sampling.SamplingOptions(max_new_tokens=12, num_samples=2)
    want = decoder.generate(params, config, prompts, options)
    budgets = [12, 4, 3, 3, 1, 7, 10, 2]
    got = paged_decoder.generate(
        params,
        config,
        prompts,
        options,
        max_new_tokens=budgets,
        engine=_SMALL,
    )
    np.testing.assert_array_equal(got.lengths, budgets)
    for row, length in enumerate(got.lengths):
      np.testing.assert_array_equal(
          got.ids[row, :length], want.ids[row, :length]
      )
      self.assertTrue(np.all(got.ids[row, length:] == sampling.PAD_ID))

  def test_a_context_leaves_room_for_its_own_rows_budgets(self):
    # A long context with a small budget beside a short one with a large
    # budget (an episode near its end beside one starting): only each
    # context's own rows must fit the model's length.
    config, params = _model(max_sequence_length=32)
    prompts = _prompts(np.random.default_rng(6), (28, 4))
    options = sampling.SamplingOptions(max_new_tokens=10)
    got = paged_decoder.generate(
        params, config, prompts, options, max_new_tokens=(4, 10), engine=_SMALL
    )
    np.testing.assert_array_equal(got.lengths, [4, 10])
    with self.assertRaisesRegex(
        ValueError,
        "^prompt 0 of 28 tokens [+] max_new_tokens=5 = 33 exceeds the "
        "model's max_sequence_length 32",
    ):
      paged_decoder.generate(
          params, config, prompts, options, max_new_tokens=(5, 10)
      )

  def test_programs_compile_once_per_bucket(self):
    # Start from empty caches: a program another test of this process
    # compiled for the same shapes (the stage program's do not depend on
    # the model's layers) would not compile again, and the counts would
    # depend on which tests ran first (in a run of the whole file, not in
    # Bazel's shards).
    jax.clear_caches()
    config, params = _model(num_layers=1)
    compile_counter.install()
    names = (
        "jit(_decode)",
        "jit(_prefill)",
        "jit(_stage)",
        "jit(_empty_pool)",
        "jit(_empty_slots)",
    )

    def run(lengths, seed, **kw):
      paged_decoder.generate(
          params,
          config,
          _prompts(np.random.default_rng(seed), lengths),
          sampling.SamplingOptions(num_samples=3, seed=seed, **kw),
          engine=paged_decoder.EngineOptions(num_slots=5, page_size=4, chunk=4),
      )

    start = time.monotonic()
    run((9, 3, 12, 5), 1, max_new_tokens=20, temperature=1.0)
    first = compile_counter.backend_compiles_after(start)
    # Other contexts, lengths, limits, seeds, temperatures and stop ids in
    # the same buckets (contexts up to 16 tokens, sequences up to 32):
    # nothing new.
    middle = time.monotonic()
    run((1, 14, 2), 2, max_new_tokens=15, temperature=0.5, stop_ids=(2,))
    run((6,), 3, max_new_tokens=18, temperature=2.0)
    self.assertEqual(
        [
            n
            for n in compile_counter.backend_compiles_after(middle)
            if n in names
        ],
        [],
    )
    # One prefill program per number of contexts a call may take (1 or 2:
    # 5 slots take 2 contexts of 3 samples), and its stage program.
    self.assertEqual(first.count("jit(_prefill)"), 2)
    self.assertEqual(first.count("jit(_stage)"), 2)
    # One decode program per page-view bucket: 1, 2, 4, 8 pages (sequences
    # up to 32 positions), all compiled by the first call.
    self.assertEqual(first.count("jit(_decode)"), 4)

  def test_a_pool_too_small_for_one_sequence_is_refused(self):
    config, params = _model()
    with self.assertRaisesRegex(ValueError, "num_pages=2 pages of 4 cannot"):
      paged_decoder.generate(
          params,
          config,
          [[1] * 9],
          sampling.SamplingOptions(max_new_tokens=4),
          engine=paged_decoder.EngineOptions(
              num_slots=2, page_size=4, num_pages=2
          ),
      )

  def test_bad_options_are_refused_in_one_line(self):
    config, params = _model()
    options = sampling.SamplingOptions(max_new_tokens=4)
    with self.assertRaisesRegex(ValueError, "max_new_tokens 5 exceeds"):
      paged_decoder.generate(params, config, [[1]], options, max_new_tokens=[5])
    with self.assertRaisesRegex(ValueError, "has 2 entries for 1 rows"):
      paged_decoder.generate(
          params, config, [[1]], options, max_new_tokens=[1, 2]
      )
    with self.assertRaisesRegex(ValueError, "page_size=3"):
      paged_decoder.EngineOptions(page_size=3)
    with self.assertRaisesRegex(ValueError, "refill"):
      paged_decoder.EngineOptions(refill=0)


if __name__ == "__main__":
  absltest.main()
