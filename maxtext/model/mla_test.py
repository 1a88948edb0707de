"""Tests of maxtext/model/mla.py: the multi-head latent attention layer.

The layer is checked, values and gradients, against a reference written
here with explicit per-head loops, keys materialised per head and an
explicit causal mask; the fused implementations against the einsum one.
The model with MLA is tested in mla_model_test.py.
"""

import math

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maxtext.model import mla
from testing import random_init

_THETA = 10000.0
_EPS = 1e-5


def _layer_config(**overrides) -> ml_collections.ConfigDict:
  """The fields `mla.attention` reads, small, updated by `overrides`."""
  config = ml_collections.ConfigDict(
      dict(
          emb_dim=16,
          num_heads=3,
          q_lora_rank=6,
          kv_lora_rank=5,
          qk_nope_head_dim=4,
          qk_rope_head_dim=4,
          v_head_dim=3,
          rope_theta=_THETA,
          rope_scaling="none",
          norm_epsilon=_EPS,
      )
  )
  config.update(overrides)
  return config


def _layer(config, seed=0):
  """One layer's parameters, the norm scales random too (so they matter)."""
  normal = random_init.scaled_normal(seed, count=16)
  params = mla.init_params(config, 1, normal, jnp.float32)
  params = jax.tree.map(lambda x: x[0], params)
  for name in ("q_norm", "kv_norm"):
    if name in params:
      params[name] = 1.0 + 0.5 * normal(params[name].shape, 1)
  return params


def _rotate(x):
  """Reference RoPE of [B, S, R]: pair (i, i + R/2) at angle t theta^(-2i/R)."""
  seq, width = x.shape[1], x.shape[2]
  half = width // 2
  angle = np.arange(seq)[:, None] * _THETA ** (-2.0 * np.arange(half) / width)
  cos, sin = jnp.asarray(np.cos(angle)), jnp.asarray(np.sin(angle))
  first, second = x[..., :half], x[..., half:]
  return jnp.concatenate(
      [first * cos - second * sin, second * cos + first * sin], axis=-1
  )


def _reference(x, p, config):
  """MLA written out: per-head loop, explicit keys, explicit causal mask."""
  _, seq, _ = x.shape
  nope, kv_rank = config.qk_nope_head_dim, config.kv_lora_rank

  def norm(a, scale):
    return a / jnp.sqrt(jnp.mean(a * a, axis=-1, keepdims=True) + _EPS) * scale

  q_in = norm(x @ p["wq_a"], p["q_norm"]) if "wq_a" in p else x
  kv_a = x @ p["wkv_a"]
  latent = norm(kv_a[..., :kv_rank], p["kv_norm"])
  shared_rope_key = _rotate(kv_a[..., kv_rank:])
  mask = np.tril(np.ones((seq, seq), bool))
  out = jnp.zeros_like(x)
  for h in range(config.num_heads):
    w_q = p["wq_b"][:, h] if "wq_a" in p else p["wq"][:, h]
    q = q_in @ w_q
    q = jnp.concatenate([q[..., :nope], _rotate(q[..., nope:])], axis=-1)
    kv = latent @ p["wkv_b"][:, h]
    k = jnp.concatenate([kv[..., :nope], shared_rope_key], axis=-1)
    v = kv[..., nope:]
    scores = jnp.einsum("bsd,btd->bst", q, k) / math.sqrt(q.shape[-1])
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = out + (probs @ v) @ p["wo"][h]
  return out


def _value_and_grads(fn, x, params, probe):
  """fn's output and the gradients of <fn(x, params), probe>."""

  def objective(x, params):
    out = fn(x, params)
    return jnp.sum(out * probe), out

  (_, out), grads = jax.jit(
      jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)
  )(x, params)
  return out, grads


# (name, overrides): queries with and without the low-rank bottleneck, one
# and several heads, value width below and above the query/key width.
_SHAPES = (
    ("low_rank_q_three_heads", dict()),
    ("full_rank_q_one_head", dict(q_lora_rank=0, num_heads=1)),
    (
        "low_rank_q_one_head_wide_v",
        dict(num_heads=1, v_head_dim=10, qk_rope_head_dim=2),
    ),
    (
        "full_rank_q_two_heads",
        dict(q_lora_rank=0, num_heads=2, qk_nope_head_dim=2, v_head_dim=6),
    ),
)


class MlaLayerTest(parameterized.TestCase):

  @parameterized.named_parameters(*_SHAPES)
  def test_values_and_gradients_match_reference(self, overrides):
    config = _layer_config(**overrides)
    params = _layer(config)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 7, config.emb_dim))
    probe = jax.random.normal(jax.random.PRNGKey(2), x.shape)
    out, grads = _value_and_grads(
        lambda x, p: mla.attention(x, p, config, "einsum"), x, params, probe
    )
    ref, ref_grads = _value_and_grads(
        lambda x, p: _reference(x, p, config), x, params, probe
    )
    chex.assert_shape(out, x.shape)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-4, atol=1e-5)
    # Every parameter gets a gradient (none is silently unused).
    for name, grad in grads[1].items():
      self.assertGreater(float(jnp.abs(grad).max()), 0.0, name)

  @parameterized.named_parameters(
      ("narrow_v", dict()), ("wide_v", dict(v_head_dim=10, q_lora_rank=0))
  )
  def test_dot_product_matches_einsum(self, overrides):
    config = _layer_config(**overrides)
    params = _layer(config, seed=3)
    x = jax.random.normal(jax.random.PRNGKey(4), (2, 9, config.emb_dim))
    probe = jax.random.normal(jax.random.PRNGKey(5), x.shape)
    implementation = "dot_product"
    out, grads = _value_and_grads(
        lambda x, p: mla.attention(x, p, config, implementation),
        x,
        params,
        probe,
    )
    ref, ref_grads = _value_and_grads(
        lambda x, p: mla.attention(x, p, config, "einsum"), x, params, probe
    )
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(grads, ref_grads, rtol=1e-4, atol=1e-5)

  def test_splash_matches_einsum(self):
    # Pallas interpret mode on the CPU is slow: the forward pass of one
    # shape. The padding it shares with dot_product is checked with grads.
    config = _layer_config(q_lora_rank=0)
    params = _layer(config, seed=8)
    x = jax.random.normal(jax.random.PRNGKey(9), (1, 9, config.emb_dim))
    np.testing.assert_allclose(
        jax.jit(lambda x, p: mla.attention(x, p, config, "splash"))(x, params),
        jax.jit(lambda x, p: mla.attention(x, p, config, "einsum"))(x, params),
        rtol=1e-5,
        atol=1e-5,
    )

  def test_unknown_implementation_is_refused(self):
    config = _layer_config()
    x = jnp.zeros((1, 4, config.emb_dim))
    with self.assertRaisesRegex(ValueError, "'flash'"):
      mla.attention(x, _layer(config), config, "flash")


if __name__ == "__main__":
  absltest.main()
