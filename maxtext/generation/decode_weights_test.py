"""Tests for decode_weights: the decoder's copy of the parameters gives the
same bits as the parameters it was made from."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.generation import decode_weights
from maxtext.generation import decoder
from maxtext.generation import sampling
from maxtext.model import transformer
from testing import tiny_configs

# Every kind of parameter the model holds: dense and grouped-query attention,
# multi-head latent attention, experts with a shared one and DeepSeek-V3's
# sigmoid router with its float32 bias, Qwen3's q/k norms, Qwen3.5's hybrid
# (Gated DeltaNet projections, convolution kernels and decay parameters, a
# gated shared expert, zero-centred norms), tied embeddings.
_KINDS = (
    ("gqa", (), {}),
    ("tied", (), dict(tie_word_embeddings=True)),
    ("mla", (tiny_configs.TINY_MLA,), {}),
    (
        "moe_router_bias",
        (tiny_configs.TINY_MOE,),
        dict(router_score="sigmoid", router_bias=True),
    ),
    ("qwen3", (tiny_configs.TINY_QWEN3,), {}),
    ("hybrid", (tiny_configs.TINY_QWEN35,), {}),
)


def _model(presets, overrides):
  """A tiny config computing in bfloat16 from float32 weights, and its
  parameters."""
  config = tiny_configs.model_config(
      *presets,
      compute_dtype="bfloat16",
      weight_dtype="float32",
      **overrides,
  )
  params = transformer.init_params(config, jax.random.key(0))
  # Norm scales and biases away from their starting 1 and 0, with bits a
  # bfloat16 copy would lose: a leaf cast that should not be shows. The
  # noise is drawn on the host: JAX's draws, adds and products compile a
  # program for each distinct leaf shape (13 s of the 23 s of CPU the six
  # models took to make).
  rng = np.random.default_rng(1)
  leaves, tree = jax.tree.flatten(params)
  leaves = [
      jnp.asarray(
          np.asarray(x) + 1e-3 * rng.standard_normal(x.shape).astype(x.dtype)
      )
      for x in leaves
  ]
  return config, jax.tree.unflatten(tree, leaves)


class DecodeWeightsTest(parameterized.TestCase):

  @parameterized.named_parameters(*_KINDS)
  def test_the_copy_gives_the_same_logits(self, presets, overrides):
    config, params = _model(presets, overrides)
    tokens = jnp.asarray(
        np.random.default_rng(0).integers(0, config.vocab_size, (2, 12)),
        jnp.int32,
    )
    np.testing.assert_array_equal(
        np.asarray(
            transformer.apply(
                decode_weights.cast(params, config.compute_dtype),
                tokens,
                config,
            )
        ),
        np.asarray(transformer.apply(params, tokens, config)),
    )

  # The decoders' own layer code: a cache of keys and values, of latents,
  # and recurrent states.
  @parameterized.named_parameters(
      *(kind for kind in _KINDS if kind[0] in ("gqa", "mla", "hybrid"))
  )
  def test_the_copy_gives_the_same_ids_and_log_probs(self, presets, overrides):
    config, params = _model(presets, overrides)
    options = sampling.SamplingOptions(max_new_tokens=3, num_samples=2)
    prompts = [[1, 2, 3], [4, 5]]
    ours = decoder.generate(
        decode_weights.cast(params, config.compute_dtype),
        config,
        prompts,
        options,
    )
    theirs = decoder.generate(params, config, prompts, options)
    np.testing.assert_array_equal(ours.ids, theirs.ids)
    np.testing.assert_array_equal(ours.log_probs, theirs.log_probs)

  @parameterized.named_parameters(*_KINDS)
  def test_matrices_are_cast_and_the_rest_kept(self, presets, overrides):
    config, params = _model(presets, overrides)
    copy = decode_weights.cast(params, config.compute_dtype)
    flat = dict(jax.tree_util.tree_leaves_with_path(copy))
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
      name = jax.tree_util.keystr(path)
      kept = leaf.ndim < 2 or "norm" in name or "conv_" in name
      kept = kept or name.endswith(("['router_bias']", "['a_log']"))
      kept = kept or name.endswith(("['dt_bias']", "['shared_gate']"))
      want = jnp.float32 if kept else jnp.bfloat16
      self.assertEqual(flat[path].dtype, want, name)
      if kept:
        self.assertIs(flat[path], leaf, name)
    self.assertEqual(
        jax.tree.map(lambda x: x.dtype, copy),
        decode_weights.dtypes(params, config.compute_dtype),
    )

  def test_parameters_already_in_the_compute_dtype_are_returned_as_they_are(
      self,
  ):
    config, params = _model((), {})
    copy = decode_weights.cast(params, config.compute_dtype)
    self.assertIs(decode_weights.cast(copy, config.compute_dtype), copy)


if __name__ == "__main__":
  absltest.main()
