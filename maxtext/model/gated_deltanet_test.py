"""Tests of maxtext/model/gated_deltanet.py: the Gated DeltaNet layer.

The chunked layer is checked against the layer written here in NumPy
(float64) straight from the formulas, one token at a time; the token-by-token
decoding `step` against the chunked forward at every position, also after a
chunked prefill; a right-padded batch's states after each row's real tokens;
the gradients of the two forms against each other. The layer against
transformers' own is //maxtext/hf:gated_deltanet_hf_test.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maxtext.model import gated_deltanet
from testing import random_init

_EPS = 1e-6


def _layer_config(**overrides) -> ml_collections.ConfigDict:
  """The fields the layer reads, small, updated by `overrides`."""
  config = ml_collections.ConfigDict(
      dict(
          emb_dim=12,
          norm_epsilon=_EPS,
          linear_num_key_heads=2,
          linear_num_value_heads=4,
          linear_key_head_dim=8,
          linear_value_head_dim=6,
          linear_conv_kernel_dim=4,
          linear_chunk_size=8,
      )
  )
  config.update(overrides)
  return config


def _layer(config, seed=0):
  """One layer's parameters, the vectors random too (so they matter)."""
  normal = random_init.scaled_normal(seed, count=16)
  params = gated_deltanet.init_params(config, 1, normal, jnp.float32)
  params = jax.tree.map(lambda x: x[0], params)
  hv = config.linear_num_value_heads
  params["a_log"] = params["a_log"] + 0.5 * normal((hv,), 1)
  params["dt_bias"] = params["dt_bias"] + normal((hv,), 1)
  params["out_norm"] = 1.0 + 0.5 * normal(params["out_norm"].shape, 1)
  return params


def _inputs(config, batch, seq, seed=1):
  return jax.random.normal(
      jax.random.PRNGKey(seed), (batch, seq, config.emb_dim), jnp.float32
  )


def _apply(config, recurrent=False):
  """The layer jitted: (x, params, state) -> (out, state)."""
  return jax.jit(
      lambda x, p, state=None: gated_deltanet.apply(
          x, p, config, state, recurrent=recurrent
      )
  )


def _softplus(x):
  return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0.0)


def _silu(x):
  return x / (1.0 + np.exp(-x))


def _reference(x, p, config):
  """The layer in NumPy float64, token by token, from the formulas."""
  p = {name: np.asarray(value, np.float64) for name, value in p.items()}
  x = np.asarray(x, np.float64)
  batch, seq, _ = x.shape
  hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
  dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
  kernel = config.linear_conv_kernel_dim
  group = hv // hk
  out = np.zeros((batch, seq, config.emb_dim))
  for b in range(batch):
    xq = np.einsum("se,ehd->shd", x[b], p["wq"])
    xk = np.einsum("se,ehd->shd", x[b], p["wk"])
    xv = np.einsum("se,ehd->shd", x[b], p["wv"])
    state = np.zeros((hv, dk, dv))
    for t in range(seq):

      def conv(seq_in, weight, t=t):
        total = 0.0
        for i in range(kernel):
          source = t - (kernel - 1) + i
          if source >= 0:
            total = total + weight[i] * seq_in[source]
        return _silu(total)

      q, k, v = (
          conv(xq, p["conv_q"]),
          conv(xk, p["conv_k"]),
          conv(xv, p["conv_v"]),
      )
      q = q / np.sqrt(np.sum(q * q, -1, keepdims=True) + 1e-6) / np.sqrt(dk)
      k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + 1e-6)
      a = x[b, t] @ p["wa"]
      g = -np.exp(p["a_log"]) * _softplus(a + p["dt_bias"])
      beta = 1.0 / (1.0 + np.exp(-(x[b, t] @ p["wb"])))
      z = np.einsum("e,ehd->hd", x[b, t], p["wz"])
      o = np.zeros((hv, dv))
      for h in range(hv):
        kh, qh = k[h // group], q[h // group]
        s = np.exp(g[h]) * state[h]
        s = s + np.outer(kh, beta[h] * (v[h] - s.T @ kh))
        state[h] = s
        o[h] = s.T @ qh
      normed = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + _EPS)
      gated = normed * p["out_norm"] * _silu(z)
      out[b, t] = np.einsum("hd,hde->e", gated, p["wo"])
  return out


class GatedDeltaNetTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("one_token", 1, 8),
      ("shorter_than_a_chunk", 5, 8),
      ("one_chunk", 8, 8),
      ("chunks_and_a_part", 21, 8),
      ("many_chunks", 40, 8),
      ("chunk_of_one", 7, 1),
      ("chunk_longer_than_sequence", 13, 64),
      ("chunks_of_64", 150, 64),
      ("chunks_of_48", 100, 48),
  )
  def test_chunked_equals_numpy_recurrence(self, seq, chunk):
    config = _layer_config(linear_chunk_size=chunk)
    p = _layer(config)
    x = _inputs(config, 2, seq)
    got, _ = _apply(config)(x, p)
    want = _reference(x, p, config)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)

  def test_recurrent_equals_numpy_recurrence(self):
    config = _layer_config()
    p = _layer(config)
    x = _inputs(config, 2, 19)
    got, _ = _apply(config, recurrent=True)(x, p)
    np.testing.assert_allclose(
        np.asarray(got), _reference(x, p, config), atol=1e-5, rtol=1e-5
    )

  @parameterized.named_parameters(
      ("grouped_heads", 2, 4, 2),
      ("equal_heads", 3, 3, 4),
      ("one_key_head", 1, 4, 3),
  )
  def test_decode_steps_equal_chunked_forward(self, hk, hv, kernel):
    config = _layer_config(
        linear_num_key_heads=hk,
        linear_num_value_heads=hv,
        linear_conv_kernel_dim=kernel,
        linear_chunk_size=4,
    )
    p = _layer(config, seed=2)
    seq = 11
    x = _inputs(config, 2, seq, seed=3)
    full, full_state = _apply(config)(x, p)
    step = jax.jit(lambda x_t, s: gated_deltanet.step(x_t, p, config, s))
    state = gated_deltanet.init_state(config, 2, jnp.float32)
    for t in range(seq):
      out, state = step(x[:, t], state)
      np.testing.assert_allclose(
          np.asarray(out),
          np.asarray(full[:, t]),
          atol=1e-5,
          rtol=1e-5,
          err_msg=f"position {t}",
      )
    for got, want, name in zip(state, full_state, gated_deltanet.State._fields):
      np.testing.assert_allclose(
          np.asarray(got), np.asarray(want), atol=1e-5, err_msg=name
      )

  def test_chunked_prefill_then_decode(self):
    config = _layer_config(linear_chunk_size=4)
    p = _layer(config, seed=4)
    x = _inputs(config, 2, 14, seed=5)
    full, _ = _apply(config)(x, p)
    prefix = 9  # Not a multiple of the chunk.
    out, state = _apply(config)(x[:, :prefix], p)
    step = jax.jit(lambda x_t, s: gated_deltanet.step(x_t, p, config, s))
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(full[:, :prefix]), atol=1e-5, rtol=1e-5
    )
    for t in range(prefix, 14):
      out, state = step(x[:, t], state)
      np.testing.assert_allclose(
          np.asarray(out),
          np.asarray(full[:, t]),
          atol=1e-5,
          rtol=1e-5,
          err_msg=f"position {t}",
      )

  @parameterized.named_parameters(("chunked", False), ("recurrent", True))
  def test_padding_after_lengths_changes_no_state(self, recurrent):
    # Rows of 9, 1, 0 and 12 real tokens right-padded with other inputs
    # to 12: each row's state is the state after its real tokens alone,
    # continued from a state that is not zero.
    config = _layer_config(linear_chunk_size=4)
    p = _layer(config, seed=8)
    x = _inputs(config, 4, 12, seed=9)
    _, start = _apply(config)(_inputs(config, 4, 5, seed=10), p)
    lengths = np.array([9, 1, 0, 12], np.int32)
    _, padded = jax.jit(
        lambda x, s, n: gated_deltanet.apply(
            x, p, config, s, recurrent=recurrent, lengths=n
        )
    )(x, start, jnp.asarray(lengths))
    for row, n in enumerate(lengths):
      alone = jax.tree.map(lambda a, row=row: a[row : row + 1], start)
      if n:
        _, alone = _apply(config, recurrent)(x[row : row + 1, :n], p, alone)
      for name, want, got in zip(gated_deltanet.State._fields, alone, padded):
        np.testing.assert_allclose(
            np.asarray(got[row]),
            np.asarray(want[0]),
            atol=1e-5,
            rtol=1e-5,
            err_msg=f"row {row} ({n} real tokens): {name}",
        )

  def test_gradients_of_both_forms_agree(self):
    config = _layer_config(linear_chunk_size=4)
    p = _layer(config, seed=6)
    x = _inputs(config, 2, 10, seed=7)

    def loss(p, x, recurrent):
      out, _ = gated_deltanet.apply(x, p, config, recurrent=recurrent)
      return jnp.sum(jnp.sin(out))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    chunked, recurrent = grad(p, x, False), grad(p, x, True)
    for got, want in zip(jax.tree.leaves(chunked), jax.tree.leaves(recurrent)):
      np.testing.assert_allclose(
          np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-4
      )
    for leaf in jax.tree.leaves(chunked):
      self.assertTrue(np.all(np.isfinite(np.asarray(leaf))))

  def test_bfloat16_compute_keeps_a_float32_state(self):
    config = _layer_config()
    p = _layer(config)
    x = _inputs(config, 2, 12).astype(jnp.bfloat16)
    out, state = _apply(config)(x, p)
    self.assertEqual(out.dtype, jnp.bfloat16)
    self.assertEqual(state.recurrent.dtype, jnp.float32)
    self.assertEqual(state.conv_q.dtype, jnp.bfloat16)
    want = _reference(x.astype(jnp.float32), p, config)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), want, atol=0.05 * np.abs(want).max()
    )

  @parameterized.named_parameters(
      # Lengths 5, 11, 3, 7 (26 tokens): starts inside chunks, one on a
      # chunk boundary (16), a chunk with three starts, a padded end.
      dict(testcase_name="chunked", recurrent=False, lengths=(5, 11, 3, 7)),
      dict(testcase_name="recurrent", recurrent=True, lengths=(5, 11, 3, 7)),
      dict(testcase_name="starts_on_chunks", recurrent=False, lengths=(8, 8)),
  )
  def test_packed_row_restarts_at_each_sequence(self, recurrent, lengths):
    # A row of several sequences with segment ids gives each sequence what
    # the layer gives it alone: convolution and state restart at its start.
    config = _layer_config()
    p = _layer(config)
    x = _inputs(config, 1, sum(lengths))
    segment_ids = jnp.asarray(
        np.repeat(np.arange(1, len(lengths) + 1), lengths)[None], jnp.int32
    )
    packed, state = jax.jit(
        lambda x, p, ids: gated_deltanet.apply(
            x, p, config, recurrent=recurrent, segment_ids=ids
        )
    )(x, p, segment_ids)
    # Without the ids, in one call: the row as it is, then each sequence but
    # the last at the start of a row of its own, the rest of the row after
    # it (wrapped round). The layer is causal, so a sequence's outputs there
    # are those it has alone; one shape, not one program per length.
    starts = np.cumsum((0,) + lengths[:-1])
    plain, _ = _apply(config, recurrent)(
        jnp.concatenate([x] + [jnp.roll(x, -n, axis=1) for n in starts[:-1]]),
        p,
    )
    unpacked = plain[:1]
    for i, (start, length) in enumerate(zip(starts[:-1], lengths[:-1])):
      np.testing.assert_allclose(
          packed[:, start : start + length],
          plain[i + 1 : i + 2, :length],
          rtol=2e-5,
          atol=2e-5,
      )
    # The last sequence alone, for its state too: the state after the row is
    # the last sequence's own.
    alone, alone_state = _apply(config, recurrent)(x[:, starts[-1] :], p)
    np.testing.assert_allclose(
        packed[:, starts[-1] :], alone, rtol=2e-5, atol=2e-5
    )
    np.testing.assert_allclose(
        state.recurrent, alone_state.recurrent, rtol=2e-5, atol=2e-5
    )
    # Without the ids the sequences see each other: the test can fail.
    self.assertGreater(
        float(
            jnp.max(
                jnp.abs(unpacked[:, lengths[0] :] - packed[:, lengths[0] :])
            )
        ),
        1e-3,
    )

  def test_parameter_shapes_and_axes(self):
    config = _layer_config()
    params = gated_deltanet.init_params(
        config, 3, random_init.scaled_normal(0, count=16), jnp.float32
    )
    self.assertEqual(set(params), set(gated_deltanet.LOGICAL_AXES))
    for name, value in params.items():
      self.assertLen(gated_deltanet.LOGICAL_AXES[name], value.ndim, name)
      self.assertEqual(value.shape[0], 3, name)
    self.assertEqual(params["wv"].shape, (3, 12, 4, 6))
    self.assertEqual(params["conv_k"].shape, (3, 4, 2, 8))
    self.assertEqual(params["wo"].shape, (3, 4, 6, 12))
    np.testing.assert_array_equal(params["out_norm"], 1.0)

  def test_value_heads_must_group_key_heads(self):
    config = _layer_config(linear_num_key_heads=3, linear_num_value_heads=4)
    with self.assertRaisesRegex(ValueError, "multiple of"):
      gated_deltanet.init_state(config, 1, jnp.float32)

  def test_chunk_size_must_be_positive(self):
    config = _layer_config(linear_chunk_size=0)
    p = _layer(_layer_config())
    with self.assertRaisesRegex(ValueError, "chunk_size=0"):
      gated_deltanet.apply(_inputs(config, 1, 4), p, config)


if __name__ == "__main__":
  absltest.main()
