"""The Gated DeltaNet layer against transformers' Qwen3.5-MoE layer.

A tiny random `Qwen3_5MoeGatedDeltaNet` (transformers, CPU torch: its torch
fallbacks `torch_chunk_gated_delta_rule`, `causal_conv1d_fn`, chunk 64)
has its weights copied into `maxtext.model.gated_deltanet`'s parameters;
both run the same float32 inputs and the outputs must agree to 1e-5 of the
output's largest magnitude, for lengths below, at and across transformers'
chunk of 64, with the layer's chunks of another size. `A_log`, `dt_bias` and
the output norm's weight are random too, so the decay, the softplus bias and
the norm's plain (not 1 + w) scale all matter.

The delta rule alone is compared as well: `torch_chunk_gated_delta_rule`
and `torch_recurrent_gated_delta_rule` with a random initial state against
`chunked_delta_rule` and `recurrent_delta_rule`, outputs and final states.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp
import numpy as np

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import torch

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

from maxtext.model import gated_deltanet

_HK, _HV, _DK, _DV, _KERNEL, _EMB = 2, 4, 8, 6, 4, 24


def _hf_config():
  return transformers.Qwen3_5MoeTextConfig(
      hidden_size=_EMB,
      num_hidden_layers=1,
      linear_num_key_heads=_HK,
      linear_num_value_heads=_HV,
      linear_key_head_dim=_DK,
      linear_value_head_dim=_DV,
      linear_conv_kernel_dim=_KERNEL,
      rms_norm_eps=1e-6,
  )


def _our_config(chunk_size):
  """The fields `gated_deltanet` reads, as a plain namespace."""
  return type(
      "Config",
      (),
      dict(
          emb_dim=_EMB,
          norm_epsilon=1e-6,
          linear_num_key_heads=_HK,
          linear_num_value_heads=_HV,
          linear_key_head_dim=_DK,
          linear_value_head_dim=_DV,
          linear_conv_kernel_dim=_KERNEL,
          linear_chunk_size=chunk_size,
      ),
  )()


def _hf_layer(seed):
  """A tiny Qwen3_5MoeGatedDeltaNet with every parameter random."""
  torch.manual_seed(seed)
  config = _hf_config()
  assert config.layer_types[0] == "linear_attention", config.layer_types
  layer = modeling_qwen3_5_moe.Qwen3_5MoeGatedDeltaNet(config, layer_idx=0)
  with torch.no_grad():
    for linear in (
        layer.in_proj_qkv,
        layer.in_proj_z,
        layer.in_proj_a,
        layer.in_proj_b,
        layer.out_proj,
    ):
      linear.weight.normal_(0.0, linear.weight.shape[1] ** -0.5)
    layer.conv1d.weight.normal_(0.0, 0.5)
    layer.A_log.copy_(torch.empty(_HV).uniform_(0.01, 16).log())
    layer.dt_bias.normal_(0.0, 1.0)
    layer.norm.weight.normal_(1.0, 0.5)
  return layer.eval()


def _converted(layer):
  """transformers' weights as `gated_deltanet` parameters (float32)."""

  def array(t):
    return t.detach().numpy().astype(np.float32)

  kd = _HK * _DK
  qkv = array(layer.in_proj_qkv.weight).T  # [E, 2 kd + Hv Dv]
  conv = array(layer.conv1d.weight)[:, 0, :].T  # [K, 2 kd + Hv Dv]
  return {
      "wq": jnp.asarray(qkv[:, :kd].reshape(_EMB, _HK, _DK)),
      "wk": jnp.asarray(qkv[:, kd : 2 * kd].reshape(_EMB, _HK, _DK)),
      "wv": jnp.asarray(qkv[:, 2 * kd :].reshape(_EMB, _HV, _DV)),
      "conv_q": jnp.asarray(conv[:, :kd].reshape(_KERNEL, _HK, _DK)),
      "conv_k": jnp.asarray(conv[:, kd : 2 * kd].reshape(_KERNEL, _HK, _DK)),
      "conv_v": jnp.asarray(conv[:, 2 * kd :].reshape(_KERNEL, _HV, _DV)),
      "wz": jnp.asarray(
          array(layer.in_proj_z.weight).T.reshape(_EMB, _HV, _DV)
      ),
      "wa": jnp.asarray(array(layer.in_proj_a.weight).T),
      "wb": jnp.asarray(array(layer.in_proj_b.weight).T),
      "a_log": jnp.asarray(array(layer.A_log)),
      "dt_bias": jnp.asarray(array(layer.dt_bias)),
      "out_norm": jnp.asarray(array(layer.norm.weight)),
      "wo": jnp.asarray(array(layer.out_proj.weight).T.reshape(_HV, _DV, _EMB)),
  }


def _assert_close(got, want, what):
  got, want = np.asarray(got), np.asarray(want)
  scale = float(np.abs(want).max())
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale, err_msg=what)


class GatedDeltaNetHfTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("short", 5, 4),
      ("one_hf_chunk", 64, 16),
      ("across_hf_chunks", 70, 16),
      ("across_hf_chunks_odd_chunk", 150, 24),
  )
  def test_layer_equals_transformers(self, seq, chunk_size):
    layer = _hf_layer(seed=seq)
    x = torch.randn(2, seq, _EMB, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
      want = layer(x).numpy()
    params = _converted(layer)
    config = _our_config(chunk_size)
    got, _ = gated_deltanet.apply(jnp.asarray(x.numpy()), params, config)
    _assert_close(got, want, "chunked")
    got, _ = gated_deltanet.apply(
        jnp.asarray(x.numpy()), params, config, recurrent=True
    )
    _assert_close(got, want, "recurrent")

  @parameterized.named_parameters(("grouped", _HK, _HV), ("equal", 3, 3))
  def test_delta_rule_equals_transformers(self, hk, hv):
    gen = torch.Generator().manual_seed(2)
    b, t = 2, 45
    q = torch.randn(b, t, hk, _DK, generator=gen)
    k = torch.randn(b, t, hk, _DK, generator=gen)
    v = torch.randn(b, t, hv, _DV, generator=gen)
    g = -torch.rand(b, t, hv, generator=gen) * 2.0
    beta = torch.rand(b, t, hv, generator=gen)
    state = torch.randn(b, hv, _DK, _DV, generator=gen)
    kwargs = dict(
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    with torch.no_grad():
      want_chunk = modeling_qwen3_5_moe.torch_chunk_gated_delta_rule(
          q, k, v, g, beta, chunk_size=16, **kwargs
      )
      want_recurrent = modeling_qwen3_5_moe.torch_recurrent_gated_delta_rule(
          q, k, v, g, beta, **kwargs
      )

    def normalized(x):
      x = jnp.asarray(x.numpy())
      return x * (jnp.sum(x * x, -1, keepdims=True) + 1e-6) ** -0.5

    ours = (
        normalized(q) * _DK**-0.5,
        normalized(k),
        jnp.asarray(v.numpy()),
        jnp.asarray(g.numpy()),
        jnp.asarray(beta.numpy()),
    )
    init = jnp.asarray(state.numpy())
    chunked = gated_deltanet.chunked_delta_rule(*ours, 8, init)
    recurrent = gated_deltanet.recurrent_delta_rule(*ours, init)
    for name, want in (("chunk", want_chunk), ("recurrent", want_recurrent)):
      for form, got in (("chunked", chunked), ("recurrent", recurrent)):
        _assert_close(got[0], want[0].numpy(), f"{form} vs {name}: output")
        _assert_close(got[1], want[1].numpy(), f"{form} vs {name}: state")


if __name__ == "__main__":
  absltest.main()
