"""The cached decoder against the full forward pass and the windowed sampler.

Tolerance: float32 logits agree within `_ATOL` (absolute) with
`transformer.apply` over the same ids; the differences come only from the
order of float32 sums (the decoder attends over a cache of T slots, the
whole-sequence pass over S positions). Greedy ids equal the windowed
sampler's; where they differ, the full pass's top-2 logit gap at the first
differing position must be below `_ATOL` (a near-tie, which either choice
may break), and the test says so rather than hiding it.
"""

import time

from absl import logging
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maxtext.generation import cached_model
from maxtext.generation import decoder
from maxtext.generation import kv_cache
from maxtext.model import transformer
from maxtext.generation import sampling
from testing import compile_counter
from testing import tiny_configs

_ATOL = 1e-4

# The attention/feed-forward kinds: multi-head (as many kv heads as heads),
# grouped-query (fewer), multi-head latent, mixture of experts, Qwen3 dense
# and MoE; and multi-head latent attention with YaRN.
_KINDS = (
    ("dense", (), dict(num_kv_heads=4)),
    ("gqa", (), {}),
    ("mla", (tiny_configs.TINY_MLA,), {}),
    ("moe", (tiny_configs.TINY_MOE,), {}),
    # Qwen3: per-head q/k norms; Qwen3-MoE's renormalised softmax router.
    ("qwen3", (tiny_configs.TINY_QWEN3,), {}),
    ("qwen3_moe", (tiny_configs.TINY_QWEN3_MOE,), {}),
    # Qwen3.5's hybrid: Gated DeltaNet states carried beside the cache.
    ("hybrid", (tiny_configs.TINY_QWEN35,), {}),
    # DeepSeek-V3's rotary scaling: frequencies and the softmax scale.
    (
        "mla_yarn",
        (tiny_configs.TINY_MLA,),
        dict(
            rope_scaling="yarn",
            rope_scaling_factor=4.0,
            rope_original_max_position=4,
            rope_yarn_mscale=1.0,
            rope_yarn_mscale_all_dim=1.0,
        ),
    ),
)


def _model(presets=(), seed=0, **overrides):
  config = ml_collections.FrozenConfigDict(
      tiny_configs.model_config(*presets, **overrides)
  )
  return config, transformer.init_params(config, jax.random.PRNGKey(seed))


def _prompts(rng, lengths, vocab=32):
  return [list(rng.integers(0, vocab, size=n)) for n in lengths]


class ExactnessTest(parameterized.TestCase):

  @parameterized.named_parameters(*_KINDS)
  def test_cached_logits_equal_the_full_forward_pass(self, presets, overrides):
    config, params = _model(presets, **overrides)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, config.vocab_size, size=(3, 14)).astype(np.int32)
    full = np.asarray(transformer.apply(params, jnp.asarray(ids), config))
    # Rows prefill 5, 1 and 9 tokens (right-padded to the 16 slots), then
    # decode the rest of their ids one step at a time, each at its own
    # position.
    prompt = np.array([5, 1, 9])
    tokens = np.zeros((3, 16), np.int32)
    for row, n in enumerate(prompt):
      tokens[row, :n] = ids[row, :n]
    positions = np.broadcast_to(np.arange(16, dtype=np.int32), (3, 16))
    forward = jax.jit(cached_model.forward, static_argnames="config")
    hidden, cache = forward(
        params,
        jnp.asarray(tokens),
        jnp.asarray(positions),
        kv_cache.init(config, 3, 16),
        config=config,
        lengths=jnp.asarray(prompt, jnp.int32),
    )
    got = np.asarray(cached_model.logits(params, hidden))
    for row, n in enumerate(prompt):
      np.testing.assert_allclose(got[row, :n], full[row, :n], atol=_ATOL)
    rows = np.arange(3)
    checked = 0
    for step in range(14 - prompt.max()):
      at = prompt + step
      hidden, cache = forward(
          params,
          jnp.asarray(ids[rows, at][:, None]),
          jnp.asarray(at[:, None].astype(np.int32)),
          cache,
          config=config,
      )
      got = np.asarray(cached_model.logits(params, hidden))[:, 0]
      np.testing.assert_allclose(got, full[rows, at], atol=_ATOL)
      checked += 1
    self.assertEqual(checked, 5)

  @parameterized.named_parameters(*_KINDS)
  def test_greedy_ids_equal_the_windowed_samplers(self, presets, overrides):
    config, params = _model(presets, **overrides)
    prompts = _prompts(np.random.default_rng(2), (3, 7, 1))
    options = sampling.SamplingOptions(max_new_tokens=9)
    got = decoder.generate(params, config, prompts, options)
    ties = 0
    for row, prompt in enumerate(prompts):
      windowed = sampling.sample(params, config, prompt, options)[0]
      mine = got.ids[row]
      if np.array_equal(mine, windowed):
        continue
      first = int(np.argmax(mine != windowed))
      sequence = np.asarray([prompt + list(mine[:first])], np.int32)
      logits = np.asarray(
          transformer.apply(params, jnp.asarray(sequence), config)
      )[0, -1]
      top2 = np.sort(logits)[-2:]
      self.assertLess(
          top2[1] - top2[0],
          _ATOL,
          f"row {row}: ids differ at step {first} without a near-tie",
      )
      ties += 1
      logging.info("row %d: near-tie at step %d", row, first)
    # The tiny models have no near-ties at these seeds: every row matched.
    self.assertEqual(ties, 0)
    np.testing.assert_array_equal(got.lengths, [9, 9, 9])


class StopAndOptionsTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.config, cls.params = _model()
    cls.prompts = _prompts(np.random.default_rng(3), (4, 2))

  def test_a_stop_id_ends_its_row_only(self):
    free = decoder.generate(
        self.params,
        self.config,
        self.prompts,
        sampling.SamplingOptions(max_new_tokens=8),
    )
    stop = int(free.ids[0, 2])
    self.assertNotIn(stop, list(free.ids[0, :2]))
    stopped = decoder.generate(
        self.params,
        self.config,
        self.prompts,
        sampling.SamplingOptions(max_new_tokens=8, stop_ids=(stop,)),
    )
    self.assertEqual(stopped.lengths[0], 3)
    np.testing.assert_array_equal(stopped.ids[0, :3], free.ids[0, :3])
    np.testing.assert_array_equal(stopped.ids[0, 3:], sampling.PAD_ID)
    np.testing.assert_array_equal(stopped.log_probs[0, 3:], 0.0)
    self.assertTrue(np.all(stopped.log_probs[0, :3] < 0))
    other = list(free.ids[1]).index(stop) + 1 if stop in free.ids[1] else 8
    self.assertEqual(stopped.lengths[1], other)
    np.testing.assert_array_equal(stopped.ids[1, :other], free.ids[1, :other])

  def test_max_new_tokens_and_shapes(self):
    got = decoder.generate(
        self.params,
        self.config,
        self.prompts,
        sampling.SamplingOptions(max_new_tokens=3, num_samples=2),
    )
    self.assertEqual(got.ids.shape, (4, 3))
    self.assertEqual(got.log_probs.shape, (4, 3))
    np.testing.assert_array_equal(got.lengths, [3, 3, 3, 3])
    # Greedy samples of one prompt are equal.
    np.testing.assert_array_equal(got.ids[0], got.ids[1])
    self.assertEqual(got.cache_length, 16)
    self.assertEqual(
        got.cache_bytes, kv_cache.bytes_per_token(self.config) * 4 * 16
    )

  def test_seeds_and_per_row_randomness(self):
    def draw(seed, **kw):
      options = sampling.SamplingOptions(
          max_new_tokens=10, temperature=1.0, seed=seed, num_samples=4, **kw
      )
      return decoder.generate(
          self.params, self.config, self.prompts[:1], options
      ).ids

    np.testing.assert_array_equal(draw(5), draw(5))
    self.assertFalse(np.array_equal(draw(5), draw(6)))
    rows = draw(5)
    self.assertGreater(len({tuple(r) for r in rows}), 1)
    greedy = decoder.generate(
        self.params,
        self.config,
        self.prompts[:1],
        sampling.SamplingOptions(max_new_tokens=10, num_samples=4),
    ).ids
    # top_k 1 and a tiny nucleus leave only the argmax to draw.
    np.testing.assert_array_equal(draw(5, top_k=1), greedy)
    np.testing.assert_array_equal(draw(5, top_p=1e-6), greedy)

  def test_a_prompt_past_max_sequence_length_is_refused(self):
    with self.assertRaisesRegex(
        ValueError,
        r"prompt 1 of 2 tokens \+ max_new_tokens=15 = 17 exceeds the "
        r"model's max_sequence_length 16",
    ):
      decoder.generate(
          self.params,
          self.config,
          [[1], [1, 2]],
          sampling.SamplingOptions(max_new_tokens=15),
      )

  @parameterized.named_parameters(
      ("empty", [[]], "prompt 0 is empty"),
      ("outside", [[1, 40]], "prompt 0 id 40 is outside"),
      ("none", [], "give at least one prompt"),
  )
  def test_bad_prompts_are_named(self, prompts, message):
    with self.assertRaisesRegex(ValueError, message):
      decoder.generate(
          self.params,
          self.config,
          prompts,
          sampling.SamplingOptions(max_new_tokens=2),
      )

  @parameterized.named_parameters(
      ("bool", [[1, True]], "got True"),
      ("float", [[1, 2.0]], "got 2.0"),
      ("text", ["ab"], "got 'a'"),
      ("float_array", [np.array([1.0, 2.0])], "got np.float64"),
  )
  def test_an_id_that_is_not_an_int_is_named(self, prompts, message):
    with self.assertRaisesRegex(
        TypeError, "prompt 0 id must be an int, " + message
    ):
      decoder.check_prompts(prompts, self.config, 2)

  def test_integer_arrays_and_numpy_ids_are_read_as_ints(self):
    ids = np.array([3, 1, 4], np.int32)
    got = decoder.check_prompts(
        [ids, list(ids), [3, 1, 4], ids.astype(np.uint8)], self.config, 2
    )
    self.assertEqual(got, [[3, 1, 4]] * 4)
    self.assertTrue(
        all(
            isinstance(i, int) and not isinstance(i, bool)
            for prompt in got
            for i in prompt
        )
    )
    with self.assertRaisesRegex(ValueError, "prompt 1 id 40 is outside"):
      decoder.check_prompts([ids, np.array([1, 40])], self.config, 2)

  def test_a_stop_id_outside_the_vocabulary_is_named(self):
    with self.assertRaisesRegex(ValueError, "stop id 99 is outside"):
      decoder.generate(
          self.params,
          self.config,
          self.prompts,
          sampling.SamplingOptions(max_new_tokens=2, stop_ids=(99,)),
      )

  def test_a_cache_past_a_devices_memory_is_refused_naming_what_fits(self):
    per_row = kv_cache.bytes_per_token(self.config) * 64
    # 10 rows over 2 shards: 5 a device, room for 4.
    with self.assertRaisesRegex(
        ValueError, r"cache of 10 rows x 64 positions .* at most 8 rows fit"
    ):
      decoder.check_cache_fits(self.config, 10, 2, 64, 4 * per_row + 1)
    decoder.check_cache_fits(self.config, 8, 2, 64, 4 * per_row)
    decoder.check_cache_fits(self.config, 10**6, 1, 64, None)  # unknown

  def test_compiles_once_per_rows_length_bucket_and_options_shape(self):
    compile_counter.install()

    # Fresh rows count (3) so that earlier tests' programs do not count.
    def run(lengths, **kw):
      decoder.generate(
          self.params,
          self.config,
          _prompts(np.random.default_rng(sum(lengths)), lengths),
          sampling.SamplingOptions(**kw),
      )

    def compiles(since):
      return compile_counter.backend_compiles_after(since).count(
          "jit(_generate)"
      )

    start = time.monotonic()
    run((2, 3, 4), max_new_tokens=5, temperature=1.0, seed=1)
    self.assertEqual(compiles(start), 1)
    # Other prompt lengths, max_new_tokens, temperature, seed, top_k/top_p
    # values and stop ids in the same bucket: nothing new.
    run((6, 1, 2), max_new_tokens=9, temperature=0.5, seed=2)
    run((1, 1, 1), max_new_tokens=2, temperature=2.0, seed=3, stop_ids=(1, 2))
    self.assertEqual(compiles(start), 1)
    run((2, 3, 4), max_new_tokens=5, temperature=1.0, top_p=0.5)
    run((5, 3, 4), max_new_tokens=5, temperature=1.0, top_k=3, top_p=0.9)
    self.assertEqual(compiles(start), 2)  # filtered: a second program


if __name__ == "__main__":
  absltest.main()
