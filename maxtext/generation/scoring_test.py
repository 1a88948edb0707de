"""Teacher-forced scoring against the decoder's own log-probabilities."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maxtext.generation import decoder
from maxtext.generation import scoring
from maxtext.model import transformer
from maxtext.generation import sampling
from testing import tiny_configs

# float32 log-probabilities of one pass and of the cached steps agree to
# this (absolute), as the logits do (decoder_test).
_ATOL = 1e-4


class ScoringTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.config = ml_collections.FrozenConfigDict(
        tiny_configs.model_config(tiny_configs.TINY_MLA)
    )
    cls.params = transformer.init_params(cls.config, jax.random.PRNGKey(4))

  def test_scores_equal_the_decoders_log_probs_of_its_samples(self):
    rng = np.random.default_rng(5)
    prompts = [list(rng.integers(0, 32, size=n)) for n in (3, 6, 1)]

    def options(stop_ids):
      return sampling.SamplingOptions(
          max_new_tokens=7,
          temperature=1.3,
          top_p=0.9,
          seed=11,
          num_samples=2,
          stop_ids=stop_ids,
      )

    # Row 0 draws the same ids with and without stop ids, so its third id
    # stops it after 3.
    free = decoder.generate(self.params, self.config, prompts, options(()))
    got = decoder.generate(
        self.params, self.config, prompts, options((int(free.ids[0, 2]),))
    )
    self.assertLessEqual(got.lengths[0], 3)
    rows = [p for p in prompts for _ in range(2)]  # num_samples
    completions = [list(ids[:n]) for ids, n in zip(got.ids, got.lengths)]
    scores = scoring.score(
        self.params, self.config, rows, completions, temperature=1.3
    )
    self.assertEqual(scores.shape, (6, int(got.lengths.max())))
    np.testing.assert_allclose(
        scores, got.log_probs[:, : scores.shape[1]], atol=_ATOL
    )
    for row, n in enumerate(got.lengths):
      self.assertTrue(np.all(scores[row, :n] < 0))
      np.testing.assert_array_equal(scores[row, n:], 0.0)

  def test_scores_are_the_log_softmax_of_one_forward_pass(self):
    ids = [7, 1, 30, 2, 9]
    scores = scoring.score(self.params, self.config, [ids[:2]], [ids[2:]])
    logits = transformer.apply(self.params, jnp.asarray([ids]), self.config)
    log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))[0]
    expected = [log_probs[t - 1, ids[t]] for t in range(2, 5)]
    np.testing.assert_allclose(scores[0], expected, atol=1e-6)

  @parameterized.named_parameters(("t05", 0.5), ("t1", 1.0), ("t2", 2.0))
  def test_temperature_scales_the_logits(self, temperature):
    ids = [7, 1, 30, 2, 9]
    scores = scoring.score(
        self.params,
        self.config,
        [ids[:2]],
        [ids[2:]],
        temperature=temperature,
    )
    logits = (
        np.asarray(
            transformer.apply(self.params, jnp.asarray([ids]), self.config),
            np.float64,
        )[0]
        / temperature
    )
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = [log_probs[t - 1, ids[t]] for t in range(2, 5)]
    np.testing.assert_allclose(scores[0], expected, atol=1e-5)
    # The entropy is the scaled distribution's, the one a sampler at this
    # temperature draws from.
    _, entropy = scoring.completion_log_probs_and_entropy(
        self.params,
        jnp.asarray([ids]),
        jnp.asarray([2]),
        3,
        self.config,
        temperature=temperature,
    )
    probs = np.exp(log_probs)
    want = -(probs * log_probs).sum(-1)[1:4]
    np.testing.assert_allclose(np.asarray(entropy)[0], want, atol=1e-4)

  def test_chunked_scoring_equals_one_pass_and_its_gradients(self):
    # loss_chunk_size 4 over 11-token rows (the last chunk padded): the same
    # log-probabilities, entropies and gradients as the whole rows at once.
    rng = np.random.default_rng(6)
    tokens = jnp.asarray(rng.integers(0, 32, size=(3, 11)), jnp.int32)
    prompt_lengths = jnp.asarray([2, 5, 1], jnp.int32)

    def scored(params, chunk):
      config = ml_collections.FrozenConfigDict(
          dict(self.config.as_configdict(), loss_chunk_size=chunk)
      )
      log_probs, entropy = scoring.completion_log_probs_and_entropy(
          params, tokens, prompt_lengths, 6, config, temperature=0.7
      )
      return jnp.sum(log_probs * jnp.cos(entropy)), (log_probs, entropy)

    grad = jax.value_and_grad(scored, has_aux=True)
    (want, want_aux), want_grads = grad(self.params, 0)
    (got, got_aux), got_grads = grad(self.params, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for g, w in zip(got_aux, want_aux):
      np.testing.assert_allclose(g, w, atol=1e-5)
    # Gradients of order 1, summed over the chunks in another order.
    jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5),
        got_grads,
        want_grads,
    )

  def test_mismatched_rows_are_refused(self):
    with self.assertRaisesRegex(ValueError, "2 prompts but 1 completions"):
      scoring.score(self.params, self.config, [[1], [2]], [[3]])
    with self.assertRaisesRegex(ValueError, "row 0: prompt 10 \\+ completion"):
      scoring.score(self.params, self.config, [[1] * 10], [[2] * 7])


if __name__ == "__main__":
  absltest.main()
