"""Tests for transformer.gradient_copy: the loss differentiated in a copy
whose layers' matrices are in the compute dtype has the same loss and the
same gradients, those leaves' in the compute dtype, for every model kind."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.model import transformer
from testing import tiny_configs


def _loss_and_grads(config, params):
  tokens = jax.random.randint(
      jax.random.PRNGKey(1),
      (2, config.max_sequence_length),
      0,
      config.vocab_size,
  )
  batch = {"inputs": tokens, "targets": tokens}
  return jax.jit(
      jax.value_and_grad(lambda p: transformer.loss_fn(p, batch, config)[0])
  )(params)


class GradientCopyTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("dense_tied", [], True, "none"),
      ("mla", [tiny_configs.TINY_MLA], False, "full"),
      ("qwen3_tied", [tiny_configs.TINY_QWEN3], True, "save_context"),
      # Gated DeltaNet layers and MoE layers (routed experts, router,
      # shared experts, convolution kernels).
      ("hybrid", [tiny_configs.TINY_QWEN35], False, "full"),
  )
  def test_same_loss_and_gradients(self, presets, tied, remat):
    config = tiny_configs.model_config(
        *presets,
        compute_dtype="bfloat16",
        tie_word_embeddings=tied,
        remat_policy=remat,
    )
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    copy = transformer.gradient_copy(params, config)
    loss, grads = _loss_and_grads(config, params)
    copy_loss, copy_grads = _loss_and_grads(config, copy)
    self.assertEqual(float(loss), float(copy_loss))
    mask = transformer.gradient_copy_mask(params)
    flat = jax.tree_util.tree_leaves_with_path(grads)
    for (path, g), c, masked in zip(
        flat, jax.tree.leaves(copy_grads), jax.tree.leaves(mask)
    ):
      name = jax.tree_util.keystr(path)
      self.assertEqual(c.dtype, jnp.bfloat16 if masked else g.dtype, name)
      np.testing.assert_array_equal(
          np.asarray(c.astype(g.dtype)), np.asarray(g), err_msg=name
      )
    # Every layer stack's matrices are in the copy, nothing outside them.
    masked = {
        jax.tree_util.keystr(path)
        for path, m in jax.tree_util.tree_leaves_with_path(mask)
        if m
    }
    self.assertTrue(any("'wq" in n or "'wkv" in n for n in masked), masked)
    self.assertFalse(any("embedding" in n or "norm" in n for n in masked))

  def test_a_float32_model_copies_nothing(self):
    config = tiny_configs.model_config(compute_dtype="float32")
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    copy = transformer.gradient_copy(params, config)
    self.assertEqual(
        jax.tree.map(lambda a: a.dtype, copy),
        jax.tree.map(lambda a: a.dtype, params),
    )


if __name__ == "__main__":
  absltest.main()
