"""Tests for the chunked cross entropy with gradients in the forward pass."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.model import vocab_loss

B, S, E, V = 3, 10, 16, 64


def _inputs(dtype=jnp.float32, seed=0):
  kx, ku, kt, kw = jax.random.split(jax.random.PRNGKey(seed), 4)
  x = jax.random.normal(kx, (B, S, E), jnp.float32).astype(dtype)
  unembedding = jax.random.normal(ku, (E, V), jnp.float32) / 4
  targets = jax.random.randint(kt, (B, S), 0, V)
  weights = (jax.random.uniform(kw, (B, S)) > 0.3).astype(jnp.float32)
  return x, unembedding, targets, weights


def _reference(x, unembedding, targets, weights):
  """The sums as written, differentiated by JAX."""
  return vocab_loss.token_sums_of_logits(
      vocab_loss.unembed(x, unembedding), targets, weights
  )


def _loss_and_grads(fn, x, unembedding, targets, weights):
  def loss(x, unembedding):
    loss_sum, num_correct = fn(x, unembedding, targets, weights)
    return 2.5 * loss_sum, num_correct

  return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, unembedding)


def _vocab_products(jaxpr) -> int:
  """The dot_generals with a V-sized operand or result, in every sub-jaxpr."""
  count = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      shapes = [v.aval.shape for v in list(eqn.invars) + list(eqn.outvars)]
      count += any(V in shape for shape in shapes)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        sub = getattr(sub, "jaxpr", sub)  # a closed jaxpr's own
        if hasattr(sub, "eqns"):
          count += _vocab_products(sub)
  return count


def _vocab_output_dtypes(jaxpr) -> set:
  """The dtypes of the [..., V] outputs of dot_generals (the logits), in
  every sub-jaxpr."""
  dtypes = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      out = eqn.outvars[0].aval
      if out.shape[-1] == V and len(out.shape) == 3:
        dtypes.add(out.dtype)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          dtypes |= _vocab_output_dtypes(sub)
  return dtypes


class TokenSumsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("divides", 5),
      ("does_not_divide", 4),
      ("one", 1),
      ("whole", S),
      ("longer", 3 * S),
  )
  def test_same_sums_and_grads_as_autodiff(self, chunk):
    inputs = _inputs()
    (loss, correct), grads = _loss_and_grads(
        lambda *a: vocab_loss.token_sums(*a, chunk), *inputs
    )
    (ref_loss, ref_correct), ref_grads = _loss_and_grads(_reference, *inputs)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    self.assertEqual(float(correct), float(ref_correct))
    for grad, ref in zip(grads, ref_grads):
      self.assertEqual(grad.dtype, ref.dtype)
      np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6)

  @parameterized.named_parameters(("chunks", 4), ("one", S))
  def test_a_vocab_major_projection_is_its_transpose(self, chunk):
    x, unembedding, targets, weights = _inputs()
    (loss, correct), (dx, du) = _loss_and_grads(
        lambda *a: vocab_loss.token_sums(*a, chunk, True),
        x,
        unembedding.T,
        targets,
        weights,
    )
    (ref_loss, ref_correct), (ref_dx, ref_du) = _loss_and_grads(
        _reference, x, unembedding, targets, weights
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    self.assertEqual(float(correct), float(ref_correct))
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-5, atol=1e-6)
    self.assertEqual(du.shape, (V, E))
    np.testing.assert_allclose(du, ref_du.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        vocab_loss.unembed(x, unembedding.T, vocab_major=True),
        vocab_loss.unembed(x, unembedding),
        rtol=1e-6,
    )

  def test_bfloat16_hidden_states(self):
    inputs = _inputs(jnp.bfloat16)
    (loss, _), grads = _loss_and_grads(
        lambda *a: vocab_loss.token_sums(*a, 4), *inputs
    )
    (ref_loss, _), ref_grads = _loss_and_grads(_reference, *inputs)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    self.assertEqual(grads[0].dtype, jnp.bfloat16)
    for grad, ref in zip(grads, ref_grads):
      grad, ref = np.asarray(grad, np.float32), np.asarray(ref, np.float32)
      # One bfloat16 rounding of the softmax gradient: relative to the scale.
      self.assertLess(np.abs(grad - ref).max(), 2e-2 * np.abs(ref).max())

  @parameterized.named_parameters(("chunks", 4), ("one", S))
  def test_bfloat16_logits_are_the_rounded_logits_reduced_in_float32(
      self, chunk
  ):
    inputs = _inputs(jnp.bfloat16)
    (loss, correct), grads = _loss_and_grads(
        lambda *a: vocab_loss.token_sums(*a, chunk, False, "bfloat16"),
        *inputs,
    )

    def rounded(x, unembedding, targets, weights):
      logits = vocab_loss.unembed(x, unembedding, logits_dtype="bfloat16")
      self.assertEqual(logits.dtype, jnp.bfloat16)
      return vocab_loss.token_sums_of_logits(logits, targets, weights)

    (ref_loss, ref_correct), ref_grads = _loss_and_grads(rounded, *inputs)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    self.assertEqual(float(correct), float(ref_correct))
    for grad, ref in zip(grads, ref_grads):
      grad, ref = np.asarray(grad, np.float32), np.asarray(ref, np.float32)
      self.assertLess(np.abs(grad - ref).max(), 2e-2 * np.abs(ref).max())
    # The rounding is there: not the float32 logits' loss, but near it.
    (f32_loss, _), _ = _loss_and_grads(_reference, *inputs)
    self.assertNotEqual(float(loss), float(f32_loss))
    np.testing.assert_allclose(loss, f32_loss, rtol=1e-2)

  def test_bfloat16_logits_products_write_bfloat16(self):
    inputs = _inputs(jnp.bfloat16)
    for logits_dtype in ("float32", "bfloat16"):
      sums = functools.partial(
          vocab_loss.token_sums,
          chunk=4,
          vocab_major=False,
          logits_dtype=logits_dtype,
      )
      jaxpr = jax.make_jaxpr(functools.partial(_loss_and_grads, sums))(*inputs)
      self.assertEqual(
          _vocab_output_dtypes(jaxpr.jaxpr), {jnp.dtype(logits_dtype)}
      )

  def test_masked_positions_have_no_gradient(self):
    x, unembedding, targets, weights = _inputs()
    weights = weights.at[1].set(0.0)
    (_, _), (dx, _) = _loss_and_grads(
        lambda *a: vocab_loss.token_sums(*a, 4),
        x,
        unembedding,
        targets,
        weights,
    )
    self.assertEqual(float(jnp.abs(dx[1]).max()), 0.0)
    self.assertGreater(float(jnp.abs(dx[0]).max()), 0.0)

  def test_hits_are_argmax_hits_and_ties_count(self):
    x, unembedding, targets, weights = _inputs()
    logits = vocab_loss.unembed(x, unembedding)
    _, correct = vocab_loss.token_sums_of_logits(logits, targets, weights)
    argmax = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    self.assertEqual(float(correct), float(jnp.sum(argmax * weights)))
    # Targets that are the argmax everywhere: every weighted position a hit.
    best = jnp.argmax(logits, axis=-1)
    _, correct = vocab_loss.token_sums_of_logits(logits, best, weights)
    self.assertEqual(float(correct), float(jnp.sum(weights)))
    # A tie between the target and a lower id counts as a hit.
    tied = jnp.zeros((1, 1, V)).at[0, 0, 3].set(1.0).at[0, 0, 7].set(1.0)
    _, correct = vocab_loss.token_sums_of_logits(
        tied, jnp.array([[7]]), jnp.ones((1, 1))
    )
    self.assertEqual(float(correct), 1.0)

  def test_hits_have_no_gradient(self):
    x, unembedding, targets, weights = _inputs()
    dx = jax.grad(
        lambda x: vocab_loss.token_sums(x, unembedding, targets, weights, 4)[1]
    )(x)
    self.assertEqual(float(jnp.abs(dx).max()), 0.0)

  def test_three_vocabulary_products_a_chunk_when_differentiated(self):
    x, unembedding, targets, weights = _inputs()

    def grad_jaxpr(fn):
      return jax.make_jaxpr(
          jax.grad(lambda x, u: fn(x, u, targets, weights)[0], argnums=(0, 1))
      )(x, unembedding).jaxpr

    # The scan's body is one chunk: the logits, and the two gradient products.
    fused = grad_jaxpr(lambda *a: vocab_loss.token_sums(*a, 4))
    self.assertEqual(_vocab_products(fused), 3)
    # Differentiating a rematerialised chunk, as JAX would: four.
    remat = jax.checkpoint(_reference, prevent_cse=False)
    self.assertEqual(_vocab_products(grad_jaxpr(remat)), 4)
    # Without differentiation: the logits alone.
    values = jax.make_jaxpr(lambda *a: vocab_loss.token_sums(*a, 4))(
        x, unembedding, targets, weights
    ).jaxpr
    self.assertEqual(_vocab_products(values), 1)

  def test_position_chunks_pad_with_zeros(self):
    a = jnp.arange(B * S).reshape(B, S)
    chunks = vocab_loss.position_chunks(a, 4)
    self.assertEqual(chunks.shape, (3, B, 4))
    np.testing.assert_array_equal(chunks[0, 1], a[1, :4])
    np.testing.assert_array_equal(chunks[2, 2], [a[2, 8], a[2, 9], 0, 0])


if __name__ == "__main__":
  absltest.main()
