"""Tests of maxtext/model/gated_deltanet.py: the Gated DeltaNet layer.

The chunked layer is checked against the layer written here in NumPy
(float64) straight from the formulas, one token at a time; the token-by-token
decoding `step` against the chunked forward at every position, also after a
chunked prefill; the gradients of the two forms against each other. The
layer against transformers' own is //maxtext/hf:gated_deltanet_hf_test.
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
