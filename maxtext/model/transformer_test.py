"""Tests for the decoder-only transformer in maxtext/model/transformer.py."""

import functools
import math

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.core import choices
from maxtext.data import builtin_datasets
from maxtext.data import data_config
from maxtext.engine import engine as engine_lib
from maxtext.config import optimizer
from maxtext.model import layers
from maxtext.model import transformer
from maxtext.configs import default
from maxtext.metrics import recorder as metrics_recorder
from maxtext.runtime import axis_rules
from maxtext.storage import checkpointing
from testing import tiny_configs


def _jit_apply(config):
  return jax.jit(functools.partial(transformer.apply, config=config))


def _assert_same_logits(config, params, reference, reference_params, tokens):
  """Asserts two models' logits for `tokens` agree (rtol and atol 1e-5).

  Args:
    config: the model under test.
    params: its parameters.
    reference: the model it must match.
    reference_params: the reference's parameters.
    tokens: [B, S] token ids.
  """
  np.testing.assert_allclose(
      _jit_apply(config)(params, tokens),
      _jit_apply(reference)(reference_params, tokens),
      rtol=1e-5,
      atol=1e-5,
  )


def _jit_loss(config):
  return jax.jit(functools.partial(transformer.loss_fn, config=config))


def _tokens(config, batch=2, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(
      rng.integers(0, config.vocab_size, (batch, config.max_sequence_length)),
      jnp.int32,
  )


def _batch(config, batch=2, weights=False):
  """A random batch of inputs and targets, with loss weights if `weights`."""
  out = {
      "inputs": _tokens(config, batch=batch, seed=1),
      "targets": _tokens(config, batch=batch, seed=2),
  }
  if weights:
    rng = np.random.default_rng(3)
    out["weights"] = jnp.asarray(
        rng.integers(0, 2, (batch, config.max_sequence_length)), jnp.float32
    )
  return out


def _jitted_loss_and_grads(config):
  """The jitted ((loss, aux), grads) of `config`'s loss_fn."""
  return jax.jit(
      jax.value_and_grad(
          functools.partial(transformer.loss_fn, config=config), has_aux=True
      )
  )


def _loss_and_grads(config, params, batch):
  return _jitted_loss_and_grads(config)(params, batch)


# value_and_grad of the loss, compiled once per process for each (batch,
# overrides): the cases that run a config and those that read its compiled
# temp memory share one program (each compile is seconds of CPU).
_COMPILED_LOSS_AND_GRADS = {}


def _compiled_loss_and_grads(batch, **overrides):
  """`model_config(**overrides)` and its compiled loss value_and_grad.

  Args:
    batch: the batch size of the [batch, S] inputs, targets and weights
      (`_batch(config, batch, weights=True)`) it takes.
    **overrides: tiny_configs.model_config's overrides.

  Returns:
    (config, compiled): compiled(params, batch) is `_loss_and_grads`'s
    ((loss, aux), grads); compiled.memory_analysis() its temp memory.
  """
  key = (batch, tuple(sorted(overrides.items())))
  if key not in _COMPILED_LOSS_AND_GRADS:
    config = tiny_configs.model_config(**overrides)
    params = jax.eval_shape(
        lambda: transformer.init_params(config, jax.random.PRNGKey(0))
    )
    tokens = jax.ShapeDtypeStruct(
        (batch, config.max_sequence_length), jnp.int32
    )
    weights = jax.ShapeDtypeStruct(tokens.shape, jnp.float32)
    _COMPILED_LOSS_AND_GRADS[key] = (
        config,
        _jitted_loss_and_grads(config)
        .lower(
            params, {"inputs": tokens, "targets": tokens, "weights": weights}
        )
        .compile(),
    )
  return _COMPILED_LOSS_AND_GRADS[key]


# (name, seq, heads, kv_heads, head_dim): grouped, one kv head, full heads;
# sequence lengths that are no multiple of 8 or of the splash block.
_ATTENTION_SHAPES = (
    ("grouped", 16, 4, 2, 8),
    ("one_kv_head", 13, 4, 1, 8),
    ("full_heads", 9, 3, 3, 4),
)


class AttentionImplementationTest(parameterized.TestCase):

  def _check_matches_einsum(
      self, implementation, seq, heads, kv_heads, head_dim
  ):
    """Checks `implementation` matches einsum's outputs, loss and grads."""
    shape = dict(
        max_sequence_length=seq,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
    )
    reference = tiny_configs.model_config(attention="einsum", **shape)
    config = tiny_configs.model_config(attention=implementation, **shape)
    params = transformer.init_params(reference, jax.random.PRNGKey(4))
    _assert_same_logits(
        config, params, reference, params, _tokens(reference, batch=2)
    )
    # Three rows, as ChunkedLossTest's: the tiny model's shape ("grouped")
    # then shares its einsum gradient program.
    batch = _batch(reference, batch=3, weights=True)
    (loss, _), grads = _loss_and_grads(config, params, batch)
    (ref_loss, _), ref_grads = _loss_and_grads(reference, params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-4, atol=1e-6)

  @parameterized.named_parameters(*_ATTENTION_SHAPES)
  def test_dot_product_matches_einsum(self, seq, heads, kv_heads, head_dim):
    self._check_matches_einsum("dot_product", seq, heads, kv_heads, head_dim)

  # The Pallas kernel runs in interpret mode on the CPU (seconds per shape),
  # so two shapes: one padded to a block, one spanning two blocks.
  @parameterized.named_parameters(
      ("one_kv_head_padded", 13, 4, 1, 8), ("grouped_two_blocks", 130, 4, 2, 8)
  )
  def test_splash_matches_einsum(self, seq, heads, kv_heads, head_dim):
    self._check_matches_einsum("splash", seq, heads, kv_heads, head_dim)

  @parameterized.named_parameters(("gqa", "gqa"), ("mla", "mla"))
  def test_auto_is_the_einsum_reference_on_cpu(self, attention_type):
    self.assertEqual(jax.default_backend(), "cpu")
    config = tiny_configs.model_config(attention_type=attention_type)
    self.assertEqual(config.attention, "auto")
    self.assertEqual(transformer.attention_implementation(config), "einsum")
    for name in ("einsum", "dot_product", "splash"):
      config.attention = name
      self.assertEqual(transformer.attention_implementation(config), name)

  @parameterized.named_parameters(
      ("cudnn_float32", "cudnn", "float32", "compute_dtype"),
      ("cudnn_off_gpu", "cudnn", "bfloat16", "GPU backend"),
      ("unknown", "flash", "float32", "must be one of"),
  )
  def test_refused_implementations(self, attention, compute_dtype, message):
    config = tiny_configs.model_config(
        attention=attention, compute_dtype=compute_dtype
    )
    with self.assertRaisesRegex(ValueError, f"attention.*{message}"):
      transformer.attention_implementation(config)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    with self.assertRaisesRegex(ValueError, message):
      transformer.apply(params, _tokens(config), config)


# Activations dominate: wide MLP, several layers, no big vocabulary, short
# rows (at 64 positions the [S, S] scores full remat recomputes in the
# backward pass outweigh the context save_context keeps instead). The
# gradient cases run the programs whose temp memory the ordering case reads.
_REMAT_SHAPE = dict(
    num_layers=4, emb_dim=64, mlp_dim=512, max_sequence_length=16
)
_REMAT_BATCH = 8


class RematTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("full", "full"),
      ("save_dots", "save_dots"),
      ("save_named", "save_named"),
      ("save_context", "save_context"),
  )
  def test_grads_match_no_remat(self, policy):
    reference, reference_fn = _compiled_loss_and_grads(
        _REMAT_BATCH, remat_policy="none", **_REMAT_SHAPE
    )
    config, fn = _compiled_loss_and_grads(
        _REMAT_BATCH, remat_policy=policy, **_REMAT_SHAPE
    )
    self.assertEqual(config.remat_policy, policy)
    self.assertEqual(reference.remat_policy, "none")
    params = transformer.init_params(reference, jax.random.PRNGKey(5))
    batch = _batch(reference, batch=_REMAT_BATCH, weights=True)
    (loss, aux), grads = fn(params, batch)
    (ref_loss, ref_aux), ref_grads = reference_fn(params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    chex.assert_trees_all_close(aux, ref_aux, rtol=1e-6)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-7)

  def test_unknown_policy_is_refused(self):
    config = tiny_configs.model_config(remat_policy="some")
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    with self.assertRaisesRegex(ValueError, "remat_policy='some'"):
      transformer.apply(params, _tokens(config), config)

  def test_policies_order_compiled_temp_memory(self):
    # Each saving policy keeps more than full and less than none (were the
    # block's names missing, save_named and save_context would equal full),
    # and the context alone is less than save_named's six names.
    temp = {
        policy: _compiled_loss_and_grads(
            _REMAT_BATCH, remat_policy=policy, **_REMAT_SHAPE
        )[1]
        .memory_analysis()
        .temp_size_in_bytes
        for policy in choices.REMAT_POLICIES
    }
    for policy in ("save_dots", "save_named", "save_context"):
      self.assertLess(temp["full"], temp[policy], policy)
      self.assertLess(temp[policy], temp["none"], policy)
    self.assertLess(temp["save_context"], temp["save_named"])


# (batch, overrides) where logits dominate the gradient's temp memory:
# [4, 64, 4096] float32 is 4 MiB, the rest is small.
_LOGITS_MEMORY = (
    4,
    dict(vocab_size=4096, num_layers=1, max_sequence_length=64),
)


class ChunkedLossTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # At the temp memory case's shape (64 positions), running its programs.
      ("divides", 8, _LOGITS_MEMORY),
      ("does_not_divide", 5),
      ("whole_sequence", 16),
      ("longer_than_sequence", 40),
  )
  def test_same_loss_accuracy_and_grads(self, chunk, shape=(3, {})):
    batch_size, overrides = shape
    reference, reference_fn = _compiled_loss_and_grads(batch_size, **overrides)
    config, fn = _compiled_loss_and_grads(
        batch_size, loss_chunk_size=chunk, **overrides
    )
    self.assertEqual(config.loss_chunk_size, chunk)
    params = transformer.init_params(reference, jax.random.PRNGKey(6))
    batch = _batch(reference, batch=batch_size, weights=True)
    (loss, aux), grads = fn(params, batch)
    (ref_loss, ref_aux), ref_grads = reference_fn(params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    np.testing.assert_allclose(aux["loss_sum"], ref_aux["loss_sum"], rtol=1e-6)
    for key in ("num_tokens", "num_correct", "accuracy"):
      self.assertEqual(float(aux[key]), float(ref_aux[key]), key)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-7)

  def test_tied_embedding_chunked_as_unchunked(self):
    # The chunked loss takes a tied embedding as stored ([V, E]); its
    # gradient joins the lookup's, as the unchunked loss's transpose does.
    reference = tiny_configs.model_config(tie_word_embeddings=True)
    config = tiny_configs.model_config(
        tie_word_embeddings=True, loss_chunk_size=4
    )
    params = transformer.init_params(reference, jax.random.PRNGKey(6))
    self.assertEqual(transformer.stored_output_projection(params)[1], True)
    batch = _batch(reference, batch=3, weights=True)
    (loss, aux), grads = _loss_and_grads(config, params, batch)
    (ref_loss, ref_aux), ref_grads = _loss_and_grads(reference, params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    self.assertEqual(float(aux["num_correct"]), float(ref_aux["num_correct"]))
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-7)

  def test_bfloat16_logits_chunked_as_unchunked(self):
    # Both loss paths write the logits in config.logits_dtype: the chunked
    # loss is the unchunked one of the same rounded logits, and the
    # rounding moves the loss off the float32 logits' loss.
    def config(**kwargs):
      return tiny_configs.model_config(
          tie_word_embeddings=True, compute_dtype="bfloat16", **kwargs
      )

    reference = config(logits_dtype="bfloat16")
    params = transformer.init_params(reference, jax.random.PRNGKey(6))
    batch = _batch(reference, batch=3, weights=True)
    (loss, aux), _ = _loss_and_grads(
        config(logits_dtype="bfloat16", loss_chunk_size=4), params, batch
    )
    # The unchunked losses differentiate as written: their gradient
    # programs compute the loss as the loss alone does (seconds less to
    # compile); the chunked one computes it in its own forward rule.
    ref_loss, ref_aux = _jit_loss(reference)(params, batch)
    f32_loss, _ = _jit_loss(config())(params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    self.assertEqual(float(aux["num_correct"]), float(ref_aux["num_correct"]))
    self.assertNotEqual(float(loss), float(f32_loss))
    np.testing.assert_allclose(loss, f32_loss, rtol=1e-2)

  def test_negative_chunk_is_refused(self):
    config = tiny_configs.model_config(loss_chunk_size=-1)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    with self.assertRaisesRegex(ValueError, "loss_chunk_size=-1"):
      transformer.loss_fn(params, _batch(config), config)

  def test_chunked_loss_compiles_to_less_temp_memory(self):
    batch, kwargs = _LOGITS_MEMORY
    whole = _compiled_loss_and_grads(batch, **kwargs)[1]
    chunked = _compiled_loss_and_grads(batch, loss_chunk_size=8, **kwargs)[1]
    whole = whole.memory_analysis().temp_size_in_bytes
    chunked = chunked.memory_analysis().temp_size_in_bytes
    self.assertLess(chunked, whole)
    self.assertLess(chunked, 4 * 64 * 4096 * 4)


# (batch, overrides) where the MLP's hidden activations dominate the
# gradient's temp memory: [4, 64, 2048] float32 is 2 MiB each. Two layers,
# as the tiny model, so the full-remat gradient cases here scan as it does.
_MLP_MEMORY = (4, dict(mlp_dim=2048, max_sequence_length=64))


class MlpChunksTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("divides", 4, "none"),
      ("does_not_divide", 5, "none"),
      # At the temp memory case's shape (64 positions), running its programs.
      ("divides_full_remat", 4, "full", _MLP_MEMORY),
      ("does_not_divide_full_remat", 3, "full", _MLP_MEMORY),
      ("one_position_a_group", 16, "save_dots"),
      ("more_groups_than_positions", 40, "none"),
  )
  def test_same_loss_and_grads(self, chunks, policy, shape=(3, {})):
    batch_size, overrides = shape
    reference, reference_fn = _compiled_loss_and_grads(
        batch_size, remat_policy=policy, **overrides
    )
    config, fn = _compiled_loss_and_grads(
        batch_size, remat_policy=policy, mlp_chunks=chunks, **overrides
    )
    self.assertEqual(config.mlp_chunks, chunks)
    params = transformer.init_params(reference, jax.random.PRNGKey(7))
    batch = _batch(reference, batch=batch_size, weights=True)
    (loss, aux), grads = fn(params, batch)
    (ref_loss, ref_aux), ref_grads = reference_fn(params, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    np.testing.assert_allclose(aux["loss_sum"], ref_aux["loss_sum"], rtol=1e-6)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-5, atol=1e-6)

  def test_groups_are_strided_positions(self):
    # Each output position is the MLP of that position's input alone, so a
    # position's output does not depend on which group it fell in; a wrong
    # regrouping (a transposed reshape) would move rows between positions.
    config = tiny_configs.model_config()
    layer = jax.tree.map(
        lambda a: a[0],
        transformer.init_params(config, jax.random.PRNGKey(1))["layers"],
    )
    x = jax.random.normal(
        jax.random.PRNGKey(2), (2, 11, config.emb_dim), jnp.float32
    )
    whole = transformer.mlp(x, layer)
    for chunks in (2, 3, 4):
      np.testing.assert_allclose(
          transformer.mlp(x, layer, chunks), whole, rtol=1e-6, atol=1e-6
      )
      # Changing one position changes that position's output alone.
      moved = transformer.mlp(x.at[1, 5].add(1.0), layer, chunks)
      changed = np.any(np.abs(np.asarray(moved - whole)) > 0, axis=-1)
      self.assertEqual(np.argwhere(changed).tolist(), [[1, 5]], chunks)

  def test_chunked_mlp_compiles_to_less_temp_memory(self):
    batch, kwargs = _MLP_MEMORY
    whole = _compiled_loss_and_grads(batch, remat_policy="full", **kwargs)[1]
    chunked = _compiled_loss_and_grads(
        batch, remat_policy="full", mlp_chunks=4, **kwargs
    )[1]
    whole = whole.memory_analysis().temp_size_in_bytes
    chunked = chunked.memory_analysis().temp_size_in_bytes
    self.assertLess(chunked, whole)


class ModelTest(parameterized.TestCase):

  def test_param_shapes_and_dtype(self):
    config = tiny_configs.model_config()
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    l, e, h, k, d, m, v = 2, 32, 4, 2, 8, 64, 32
    chex.assert_trees_all_equal_shapes(
        params,
        {
            "embedding": jnp.zeros((v, e)),
            "layers": {
                "attn_norm": jnp.zeros((l, e)),
                "wq": jnp.zeros((l, e, h, d)),
                "wk": jnp.zeros((l, e, k, d)),
                "wv": jnp.zeros((l, e, k, d)),
                "wo": jnp.zeros((l, h, d, e)),
                "mlp_norm": jnp.zeros((l, e)),
                "w_gate": jnp.zeros((l, e, m)),
                "w_up": jnp.zeros((l, e, m)),
                "w_down": jnp.zeros((l, m, e)),
            },
            "final_norm": jnp.zeros((e,)),
            "unembedding": jnp.zeros((e, v)),
        },
    )
    chex.assert_trees_all_equal_dtypes(
        params, jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)
    )
    self.assertEqual(
        transformer.num_params(params),
        sum(x.size for x in jax.tree_util.tree_leaves(params)),
    )

  def test_tied_embeddings_use_the_embedding_transposed(self):
    untied = tiny_configs.model_config()
    tied = tiny_configs.model_config(tie_word_embeddings=True)
    params = transformer.init_params(tied, jax.random.PRNGKey(0))
    self.assertNotIn("unembedding", params)
    self.assertNotIn("unembedding", transformer.param_logical_axes(params))
    # The same model untied, its unembedding set to the embedding transposed.
    reference = dict(params, unembedding=params["embedding"].T)
    tokens = _tokens(tied)
    # Equal up to float32 rounding: XLA may order the contraction of a
    # transposed operand differently.
    np.testing.assert_allclose(
        _jit_apply(tied)(params, tokens),
        _jit_apply(untied)(reference, tokens),
        rtol=1e-5,
        atol=1e-5,
    )
    # ChunkedLossTest's batch: its unchunked programs compile once (the
    # persistent compilation cache) for both tests.
    batch = _batch(tied, batch=3, weights=True)
    (loss, _), grads = _loss_and_grads(tied, params, batch)
    (reference_loss, _), _ = _loss_and_grads(untied, reference, batch)
    self.assertAlmostEqual(float(loss), float(reference_loss), places=5)
    self.assertNotIn("unembedding", grads)

  @parameterized.named_parameters(
      (f"{kind}_{'tied' if tied else 'untied'}", preset, tied)
      for kind, preset in (
          ("dense", {}),
          ("moe", tiny_configs.TINY_MOE),
          ("mla", tiny_configs.TINY_MLA),
          ("hybrid", tiny_configs.TINY_QWEN35),
      )
      for tied in (False, True)
  )
  def test_first_loss_on_random_tokens_is_about_ln_vocab(self, preset, tied):
    # The output projection's init gives logits of standard deviation about
    # 0.9, which puts the expected first loss between ln(V) and ln(V) + 0.4
    # (a tied embedding drawn with standard deviation 1 gave about 3 ln(V)).
    config = tiny_configs.model_config(
        preset, vocab_size=1024, tie_word_embeddings=tied
    )
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    _, aux = _jit_loss(config)(params, _batch(config, batch=8))
    cross_entropy = float(aux["loss_sum"] / aux["num_tokens"])
    ln_vocab = math.log(config.vocab_size)
    self.assertBetween(cross_entropy, 0.9 * ln_vocab, 1.1 * ln_vocab)

  def test_init_is_deterministic_by_key(self):
    config = tiny_configs.model_config()
    a = transformer.init_params(config, jax.random.PRNGKey(1))
    b = transformer.init_params(config, jax.random.PRNGKey(1))
    c = transformer.init_params(config, jax.random.PRNGKey(2))
    chex.assert_trees_all_equal(a, b)
    self.assertFalse(np.array_equal(a["embedding"], c["embedding"]))

  @parameterized.named_parameters(
      ("float32", "float32", "float32"),
      ("bf16_compute", "float32", "bfloat16"),
      ("bf16_weights", "bfloat16", "bfloat16"),
  )
  def test_logits_shape_and_dtype(self, weight_dtype, compute_dtype):
    config = tiny_configs.model_config(
        weight_dtype=weight_dtype, compute_dtype=compute_dtype
    )
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    for leaf in jax.tree_util.tree_leaves(params):
      self.assertEqual(leaf.dtype, jnp.dtype(weight_dtype))
    logits = jax.jit(lambda p, t: transformer.apply(p, t, config))(
        params, _tokens(config, batch=3)
    )
    chex.assert_shape(
        logits, (3, config.max_sequence_length, config.vocab_size)
    )
    chex.assert_type(logits, jnp.float32)
    chex.assert_tree_all_finite(logits)

  def test_attention_is_causal(self):
    config = tiny_configs.model_config()
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    tokens = _tokens(config, batch=1)
    changed = tokens.at[0, 10].set((tokens[0, 10] + 1) % config.vocab_size)
    apply = _jit_apply(config)
    a = apply(params, tokens)
    b = apply(params, changed)
    np.testing.assert_allclose(a[:, :10], b[:, :10], rtol=1e-5, atol=1e-5)
    self.assertGreater(float(jnp.max(jnp.abs(a[:, 10:] - b[:, 10:]))), 1e-4)

  def test_grouped_kv_heads_equal_repeated_full_heads(self):
    """K kv heads behave as H heads whose k/v weights repeat per group."""
    grouped = tiny_configs.model_config(num_heads=4, num_kv_heads=2)
    full = tiny_configs.model_config(num_heads=4, num_kv_heads=4)
    params = transformer.init_params(grouped, jax.random.PRNGKey(3))
    group = grouped.num_heads // grouped.num_kv_heads
    expanded = jax.tree_util.tree_map(lambda x: x, params)
    for name in ("wk", "wv"):
      expanded["layers"][name] = jnp.repeat(
          params["layers"][name], group, axis=2
      )
    _assert_same_logits(
        grouped, params, full, expanded, _tokens(grouped, batch=2)
    )

  def test_rope_rows_carry_their_own_positions(self):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(1, 10, 2, 8)), jnp.float32)
    whole = layers.rope(x, layers.positions_from_zero(10), 10000.0)
    # Row 0 holds tokens 0..5 at positions 0..5, row 1 tokens 4..9 at 4..9.
    rows = jnp.concatenate([x[:, :6], x[:, 4:]], axis=0)
    positions = jnp.asarray([np.arange(6), np.arange(4, 10)], jnp.int32)
    got = layers.rope(rows, positions, 10000.0)
    np.testing.assert_allclose(got[0], whole[0, :6], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], whole[0, 4:], rtol=1e-6, atol=1e-6)
    self.assertGreater(float(jnp.max(jnp.abs(got[1] - whole[0, :6]))), 1e-3)

  def test_llama3_scaling_follows_the_published_rule(self):
    # Llama 3.1 8B's rotary settings; the rule as Meta's reference code
    # states it, one frequency at a time.
    theta, head_dim = 500000.0, 128
    factor, low, high, original = 8.0, 1.0, 4.0, 8192
    scaling = layers.Llama3Scaling(factor, low, high, original)
    expected = []
    for i in range(head_dim // 2):
      freq = 1.0 / theta ** (2 * i / head_dim)
      wavelength = 2 * math.pi / freq
      if wavelength < original / high:
        expected.append(freq)
      elif wavelength > original / low:
        expected.append(freq / factor)
      else:
        smooth = (original / wavelength - low) / (high - low)
        expected.append((1 - smooth) * freq / factor + smooth * freq)
    got = layers.rope_frequencies(head_dim, theta, scaling)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    plain = np.asarray(layers.rope_frequencies(head_dim, theta))
    ratio = plain / np.asarray(got)
    # All three bands occur: kept, divided by the factor, and in between.
    self.assertEqual(ratio[0], 1.0)
    self.assertAlmostEqual(float(ratio[-1]), factor, places=4)
    self.assertTrue(np.any((ratio > 1.01) & (ratio < factor - 0.01)))

  def test_yarn_scaling_follows_the_published_rule(self):
    # DeepSeek-V3's rotary part: 64 dimensions, base 10000, factor 40 over
    # 4096; the rule as the YaRN paper states it, one pair at a time.
    theta, dim, factor, original = 10000.0, 64, 40.0, 4096
    scaling = layers.YarnScaling(factor, original, 32.0, 1.0, 1.0, 1.0)

    def turning(rotations):
      return (
          dim
          * math.log(original / (rotations * 2 * math.pi))
          / (2 * math.log(theta))
      )

    low, high = max(math.floor(turning(32.0)), 0), min(
        math.ceil(turning(1.0)), dim - 1
    )
    expected = []
    for i in range(dim // 2):
      freq = 1.0 / theta ** (2 * i / dim)
      ramp = min(max((i - low) / (high - low), 0.0), 1.0)
      expected.append(freq / factor * ramp + freq * (1 - ramp))
    got = np.asarray(layers.rope_frequencies(dim, theta, scaling))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    plain = np.asarray(layers.rope_frequencies(dim, theta))
    ratio = plain / got
    self.assertEqual(ratio[0], 1.0)
    self.assertAlmostEqual(float(ratio[-1]), factor, places=3)
    self.assertTrue(np.any((ratio > 1.01) & (ratio < factor - 0.01)))
    # mscale = mscale_all_dim: cosines unscaled, softmax scale corrected.
    self.assertEqual(scaling.magnitude, 1.0)
    self.assertAlmostEqual(
        layers.softmax_scale(192, scaling),
        (0.1 * math.log(40.0) + 1.0) ** 2 / math.sqrt(192),
        places=9,
    )
    # Without mscale fields: the cosines carry 0.1 ln(factor) + 1, the
    # softmax scale is plain.
    bare = layers.YarnScaling(factor, original, 32.0, 1.0, 0.0, 0.0)
    self.assertAlmostEqual(bare.magnitude, 0.1 * math.log(40.0) + 1.0)
    self.assertEqual(layers.softmax_scale(16, bare), 0.25)

  def test_yarn_on_mla_changes_the_logits(self):
    config = tiny_configs.model_config(
        attention_type="mla",
        q_lora_rank=8,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
    )
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    tokens = _tokens(config, batch=2)
    plain = transformer.apply(params, tokens, config)
    config.update(
        rope_scaling="yarn",
        rope_scaling_factor=4.0,
        rope_original_max_position=4,
        rope_yarn_mscale=1.0,
        rope_yarn_mscale_all_dim=1.0,
    )
    scaled = transformer.apply(params, tokens, config)
    self.assertGreater(float(jnp.max(jnp.abs(scaled - plain))), 1e-4)

  def test_rope_scaling_is_read_from_the_config(self):
    config = tiny_configs.model_config()
    self.assertIsNone(layers.rope_scaling(config))
    config.rope_scaling = "llama3"
    config.rope_original_max_position = 16
    scaling = layers.rope_scaling(config)
    self.assertEqual(scaling, layers.Llama3Scaling(8.0, 1.0, 4.0, 16))
    # The model uses it: its logits change, its shapes do not.
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    tokens = _tokens(config, batch=2)
    scaled = transformer.apply(params, tokens, config)
    config.rope_scaling = "none"
    plain = transformer.apply(params, tokens, config)
    self.assertEqual(scaled.shape, plain.shape)
    self.assertGreater(float(jnp.max(jnp.abs(scaled - plain))), 1e-4)

  def test_rope_scores_depend_only_on_relative_position(self):
    rng = np.random.default_rng(0)
    q = jnp.asarray(
        np.broadcast_to(rng.normal(size=(1, 1, 1, 8)), (1, 12, 1, 8)),
        jnp.float32,
    )
    k = jnp.asarray(
        np.broadcast_to(rng.normal(size=(1, 1, 1, 8)), (1, 12, 1, 8)),
        jnp.float32,
    )
    positions = layers.positions_from_zero(12)
    rq = layers.rope(q, positions, 10000.0)
    rk = layers.rope(k, positions, 10000.0)
    scores = jnp.einsum("bsnd,btnd->st", rq, rk)
    np.testing.assert_allclose(scores[5, 2], scores[9, 6], rtol=1e-5)
    np.testing.assert_allclose(scores[3, 3], scores[11, 11], rtol=1e-5)
    self.assertGreater(abs(float(scores[5, 2] - scores[5, 4])), 1e-4)
    # Rotation keeps norms.
    np.testing.assert_allclose(
        jnp.linalg.norm(rq, axis=-1), jnp.linalg.norm(q, axis=-1), rtol=1e-5
    )

  def test_loss_matches_reference_cross_entropy(self):
    config = tiny_configs.model_config()
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    inputs = _tokens(config, batch=2, seed=1)
    targets = _tokens(config, batch=2, seed=2)
    loss, aux = _jit_loss(config)(
        params, {"inputs": inputs, "targets": targets}
    )
    logits = np.asarray(_jit_apply(config)(params, inputs), np.float64)
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, np.asarray(targets)[..., None], -1)[
        ..., 0
    ]
    np.testing.assert_allclose(loss, nll.mean(), rtol=1e-5)
    np.testing.assert_allclose(aux["loss_sum"], nll.sum(), rtol=1e-5)
    self.assertEqual(float(aux["num_tokens"]), nll.size)
    hits = (logits.argmax(-1) == np.asarray(targets)).sum()
    self.assertEqual(float(aux["num_correct"]), hits)
    np.testing.assert_allclose(aux["accuracy"], hits / nll.size, rtol=1e-6)
    for value in aux.values():
      chex.assert_shape(value, ())

  def test_loss_weights_mask_positions(self):
    config = tiny_configs.model_config()
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    inputs = _tokens(config, batch=2, seed=1)
    targets = _tokens(config, batch=2, seed=2)
    weights = np.zeros(inputs.shape, np.float32)
    weights[0, :] = 1.0
    loss = _jit_loss(config)
    masked, aux = loss(
        params, {"inputs": inputs, "targets": targets, "weights": weights}
    )
    first, _ = _jit_loss(config)(
        params, {"inputs": inputs[:1], "targets": targets[:1]}
    )
    np.testing.assert_allclose(masked, first, rtol=1e-5)
    self.assertEqual(float(aux["num_tokens"]), config.max_sequence_length)
    empty, aux = loss(
        params,
        {
            "inputs": inputs,
            "targets": targets,
            "weights": np.zeros(inputs.shape, np.float32),
        },
    )
    self.assertEqual(float(empty), 0.0)
    self.assertEqual(float(aux["accuracy"]), 0.0)

  @parameterized.named_parameters(
      ("dense", {}), ("moe", {"load_balance_loss_weight": 0.5})
  )
  def test_eval_is_the_cross_entropy_alone(self, moe_overrides):
    config = (
        _moe_config(**moe_overrides)
        if moe_overrides
        else tiny_configs.model_config()
    )
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    batch = _batch(config)
    # One program for both (the same forward pass twice, one compile).
    (loss, aux), metrics = jax.jit(
        lambda params, batch: (
            transformer.loss_fn(params, batch, config),
            transformer.eval_fn(params, batch, config),
        )
    )(params, batch)
    self.assertEqual(set(metrics), set(transformer.EVAL_DIRECTIONS))
    cross_entropy = aux["loss_sum"] / aux["num_tokens"]
    np.testing.assert_allclose(metrics["loss"], cross_entropy, rtol=1e-6)
    if moe_overrides:
      # The training loss also holds the weighted load-balancing loss.
      self.assertGreater(float(loss), float(metrics["loss"]))
    else:
      self.assertEqual(float(loss), float(metrics["loss"]))

  def test_jitted_step_lowers_loss_on_synthetic_data(self):
    config = tiny_configs.model_config(num_layers=1)
    dataset = builtin_datasets.SyntheticDataset(
        data_config.DataConfig.from_config(config)
    )
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
      (loss, _), grads = jax.value_and_grad(transformer.loss_fn, has_aux=True)(
          params, batch, config
      )
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    eval_batch = dataset.get_eval_batch(0)
    eval_loss = _jit_loss(config)
    before, _ = eval_loss(params, eval_batch)
    for i in range(40):
      params, opt_state, loss = step(params, opt_state, dataset.get_batch(i))
    after, _ = eval_loss(params, eval_batch)
    chex.assert_tree_all_finite(params)
    self.assertTrue(np.isfinite(float(loss)))
    self.assertLess(float(after), 0.5 * float(before))


class ShardingTest(parameterized.TestCase):

  def _shapes(self, config):
    return jax.eval_shape(
        lambda: transformer.init_params(config, jax.random.PRNGKey(0))
    )

  def test_logical_axes_name_every_dimension(self):
    shapes = self._shapes(tiny_configs.model_config())
    axes = transformer.param_logical_axes(shapes)
    jax.tree_util.tree_map(
        lambda x, names: self.assertLen(names, len(x.shape)),
        shapes,
        axes,
        is_leaf=lambda x: isinstance(x, tuple),
    )

  def test_weight_decay_spares_stacked_norm_scales(self):
    config = tiny_configs.model_config(num_experts=4, num_dense_layers=1)
    shapes = self._shapes(config)
    mask = transformer.weight_decay_mask(shapes)
    # Stacked, a norm scale is [layers, embed]: two dimensions, no decay.
    self.assertLen(shapes["layers"]["attn_norm"].shape, 2)
    self.assertFalse(mask["layers"]["attn_norm"])
    self.assertFalse(mask["moe_layers"]["mlp_norm"])
    self.assertFalse(mask["final_norm"])
    self.assertTrue(mask["layers"]["wq"])
    self.assertTrue(mask["moe_layers"]["w_up"])
    self.assertTrue(mask["moe_layers"]["router"])
    self.assertTrue(mask["embedding"])
    # The mask the engine's optimizer gets: a zero gradient moves the
    # decayed matrices and leaves the norm scales where they are.
    optimizer_config = optimizer.OptimizerConfig.from_config(
        default.get_config(),
        learning_rate=0.1,
        warmup_steps=0,
        weight_decay=0.5,
        grad_clip_norm=0.0,
    )
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    tx = optimizer.make_optimizer(
        optimizer_config,
        optimizer.make_schedule(optimizer_config),
        decay_mask=transformer.weight_decay_mask,
    )
    # Jitted, as the engine's step runs it: one compile, not one per
    # operation and leaf shape.
    updates = jax.jit(
        lambda params: tx.update(
            jax.tree_util.tree_map(jnp.zeros_like, params),
            tx.init(params),
            params,
        )[0]
    )(params)
    np.testing.assert_array_equal(updates["layers"]["attn_norm"], 0.0)
    np.testing.assert_allclose(
        updates["layers"]["wq"], -0.1 * 0.5 * params["layers"]["wq"], rtol=1e-5
    )

  def test_logical_axes_reject_other_structures(self):
    with self.assertRaisesRegex(ValueError, "structure"):
      transformer.param_logical_axes({"w": jnp.zeros((2, 2))})
    # A stack mixing the two attention types is no model's.
    shapes = self._shapes(tiny_configs.model_config())
    shapes["layers"]["wkv_a"] = shapes["layers"]["wq"]
    with self.assertRaisesRegex(ValueError, "structure"):
      transformer.param_logical_axes(shapes)

  @parameterized.named_parameters(("low_rank_q", 8), ("full_rank_q", 0))
  def test_mla_logical_axes_and_specs(self, q_lora_rank):
    config = tiny_configs.model_config(
        attention_type="mla",
        q_lora_rank=q_lora_rank,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
    )
    shapes = self._shapes(config)
    self.assertNotIn("wk", shapes["layers"])
    self.assertEqual(shapes["layers"]["wkv_a"].shape, (2, 32, 20))
    axes = transformer.param_logical_axes(shapes)
    self.assertEqual(
        axes["layers"]["wkv_b"], ("layers", "kv_lora", "heads", "head_dim")
    )
    specs = transformer.param_partition_specs(shapes, 4)
    p = jax.sharding.PartitionSpec
    self.assertEqual(specs["layers"]["wkv_a"], p(None, "fsdp", None))
    self.assertEqual(specs["layers"]["wo"], p(None, None, None, "fsdp"))

  def test_unknown_attention_type_is_refused(self):
    with self.assertRaisesRegex(ValueError, "attention_type='mha'"):
      transformer.init_params(
          tiny_configs.model_config(attention_type="mha"), jax.random.PRNGKey(0)
      )

  @parameterized.named_parameters(
      ("one", 1), ("two", 2), ("four", 4), ("three", 3), ("sixty_four", 64)
  )
  def test_fsdp_axis_is_divisible_and_never_layers(self, fsdp):
    config = tiny_configs.model_config()
    shapes = self._shapes(config)
    dims = transformer.param_fsdp_axis(shapes, fsdp)
    axes = transformer.param_logical_axes(shapes)

    def check(x, dim, names):
      if fsdp == 1:
        self.assertIsNone(dim)
        return
      candidates = [
          i
          for i, (size, name) in enumerate(zip(x.shape, names))
          if name != "layers" and size % fsdp == 0
      ]
      if not candidates:
        self.assertIsNone(dim)
      else:
        self.assertIn(dim, candidates)
        self.assertEqual(x.shape[dim], max(x.shape[i] for i in candidates))

    jax.tree_util.tree_map(
        check, shapes, dims, axes, is_leaf=lambda x: x is None
    )

  def test_fsdp_axis_rejects_bad_size(self):
    with self.assertRaisesRegex(ValueError, "fsdp_size"):
      transformer.param_fsdp_axis(self._shapes(tiny_configs.model_config()), 0)

  def test_partition_specs_place_params_on_a_mesh(self):
    config = tiny_configs.model_config()
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp")
    )
    specs = transformer.param_partition_specs(params, 1)
    sharded = jax.tree_util.tree_map(
        lambda x, spec: jax.device_put(
            x, jax.sharding.NamedSharding(mesh, spec)
        ),
        params,
        specs,
    )
    chex.assert_trees_all_equal(sharded, params)
    specs = transformer.param_partition_specs(self._shapes(config), 4)
    self.assertEqual(
        specs["layers"]["w_up"], jax.sharding.PartitionSpec(None, None, "fsdp")
    )


# The default config's parameters for PRNGKey(0) as the code before mixture of
# experts initialised them: (path, shape, sum of the leaf). A dense model's
# tree, shapes and values must not change, so its checkpoints still restore.
_DENSE_DEFAULT_PARAMS = (
    ("['embedding']", (256, 128), -155.815),
    ("['final_norm']", (128,), 128.0),
    ("['layers']['attn_norm']", (2, 128), 256.0),
    ("['layers']['mlp_norm']", (2, 128), 256.0),
    ("['layers']['w_down']", (2, 512, 128), 0.702),
    ("['layers']['w_gate']", (2, 128, 512), -11.417),
    ("['layers']['w_up']", (2, 128, 512), -8.073),
    ("['layers']['wk']", (2, 128, 2, 32), -3.091),
    ("['layers']['wo']", (2, 4, 32, 128), 23.085),
    ("['layers']['wq']", (2, 128, 4, 32), 13.562),
    ("['layers']['wv']", (2, 128, 2, 32), -9.404),
    ("['unembedding']", (128, 256), -9.369),
)


def _moe_config(**overrides):
  """The tiny test model with TINY_MOE's experts, then `overrides`."""
  return tiny_configs.model_config(tiny_configs.TINY_MOE, **overrides)


class MoeModelTest(parameterized.TestCase):

  def test_dense_tree_is_unchanged(self):
    params = transformer.init_params(
        default.get_config(), jax.random.PRNGKey(0)
    )
    got = tuple(
        (
            jax.tree_util.keystr(path),
            x.shape,
            round(float(np.asarray(x, np.float64).sum()), 3),
        )
        for path, x in jax.tree_util.tree_leaves_with_path(params)
    )
    self.assertEqual(
        [(p, s) for p, s, _ in got],
        [(p, s) for p, s, _ in _DENSE_DEFAULT_PARAMS],
    )
    np.testing.assert_allclose(
        [v for _, _, v in got],
        [v for _, _, v in _DENSE_DEFAULT_PARAMS],
        atol=2e-3,
    )

  def test_dense_checkpoint_restores(self):
    config = tiny_configs.model_config()
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    directory = self.create_tempdir().full_path
    saver = checkpointing.Checkpointer(directory, save_period=1, max_to_keep=0)
    saver.save(1, {"params": params}, {"step": 1}, force=True)
    saver.wait()
    abstract = jax.eval_shape(
        lambda: transformer.init_params(config, jax.random.PRNGKey(1))
    )
    cpu = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=cpu), abstract
    )
    chex.assert_trees_all_equal(
        checkpointing.restore_params_only(directory, abstract), params
    )

  def test_moe_tree_has_dense_then_moe_stacks(self):
    params = jax.eval_shape(
        lambda: transformer.init_params(_moe_config(), jax.random.PRNGKey(0))
    )
    self.assertEqual(params["layers"]["w_up"].shape, (1, 32, 64))
    self.assertEqual(params["moe_layers"]["w_up"].shape, (1, 4, 32, 16))
    self.assertEqual(params["moe_layers"]["router"].shape, (1, 32, 4))
    self.assertEqual(params["moe_layers"]["shared_w_up"].shape, (1, 32, 16))
    no_dense = jax.eval_shape(
        lambda: transformer.init_params(
            _moe_config(num_dense_layers=0), jax.random.PRNGKey(0)
        )
    )
    self.assertNotIn("layers", no_dense)
    self.assertEqual(no_dense["moe_layers"]["wq"].shape[0], 2)
    transformer.param_logical_axes(no_dense)

  def test_loss_adds_weighted_balance_loss(self):
    # Remat "full": the MoE block's statistics come out of a checkpointed scan.
    config = _moe_config(load_balance_loss_weight=0.5, remat_policy="full")
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    batch = _batch(config)
    (loss, aux), grads = _loss_and_grads(config, params, batch)
    cross_entropy = aux["loss_sum"] / aux["num_tokens"]
    np.testing.assert_allclose(
        loss, cross_entropy + 0.5 * aux["moe"]["aux_loss"], rtol=1e-6
    )
    # The balance loss trains the router.
    config.load_balance_loss_weight = 0.0
    _, grads_without = _loss_and_grads(config, params, batch)
    self.assertGreater(
        float(
            jnp.abs(
                grads["moe_layers"]["router"]
                - grads_without["moe_layers"]["router"]
            ).max()
        ),
        0.0,
    )

  def test_expert_partition_specs(self):
    shapes = jax.eval_shape(
        lambda: transformer.init_params(_moe_config(), jax.random.PRNGKey(0))
    )
    specs = transformer.param_partition_specs(shapes, 2, expert_size=2)
    p = jax.sharding.PartitionSpec
    self.assertEqual(
        specs["moe_layers"]["w_up"], p(None, "expert", "fsdp", None)
    )
    self.assertEqual(specs["moe_layers"]["router"], p(None, "fsdp", "expert"))
    # Weights without an experts dimension: over every batch axis but data.
    self.assertEqual(specs["layers"]["w_up"], p(None, None, ("fsdp", "expert")))
    self.assertEqual(
        specs["moe_layers"]["wq"], p(None, ("fsdp", "expert"), None, None)
    )
    # The layout before: those over fsdp only, the experts as now.
    old = transformer.param_partition_specs(
        shapes, 2, expert_size=2, rules=axis_rules.FSDP_ONLY
    )
    self.assertEqual(old["layers"]["w_up"], p(None, None, "fsdp"))
    self.assertEqual(old["moe_layers"]["w_up"], specs["moe_layers"]["w_up"])
    with self.assertRaisesRegex(ValueError, "expert_parallelism=3"):
      transformer.param_partition_specs(shapes, 1, expert_size=3)

  def test_engine_sums_dropped_tokens_over_micro_batches(self):
    # Capacity 0.25 drops assignments; K = 2 micro-batches per step.
    config = _moe_config(capacity_factor=0.25, gradient_accumulation_steps=2)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    loss_fn = functools.partial(transformer.loss_fn, config=config)
    micro = [
        _batch(config),
        {"inputs": _tokens(config, seed=5), "targets": _tokens(config, seed=6)},
    ]
    # Each micro-batch reports its own count, declared a sum.
    dropped = [
        float(jax.jit(loss_fn)(params, b)[1]["moe"]["dropped_tokens"].value)
        for b in micro
    ]
    self.assertGreater(min(dropped), 0.0)
    engine = engine_lib.Engine(
        loss_fn,
        params,
        optax.sgd(0.0),
        0.0,
        metrics_recorder.MetricsRecorder(),
        2,
    )
    for batch in micro:
      engine.fwd_bwd(batch)
    reduced = metrics_recorder.reduce_buffer(engine.update())
    self.assertAlmostEqual(
        reduced["moe/dropped_tokens"], sum(dropped), places=3
    )
    for name in transformer.MOE_METRICS:
      self.assertIn(f"moe/{name}", reduced)


if __name__ == "__main__":
  absltest.main()
