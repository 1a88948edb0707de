"""policy_loss: values against NumPy written from the formulas, gradients."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import choices
from maxtext.grpo.loss import policy_loss


def _numpy_reference(
    logp, old, adv, mask, ref, eps, eps_high, beta, kl, agg, length
):
  """Token by token in float64, from the module docstring's formulas."""
  b, t = logp.shape
  pg = np.zeros((b, t))
  kls = np.zeros((b, t))
  clipped = np.zeros((b, t))
  for i in range(b):
    for j in range(t):
      r = np.exp(logp[i, j] - old[i, j])
      rc = min(max(r, 1 - eps), 1 + eps_high)
      pg[i, j] = max(-adv[i] * r, -adv[i] * rc)
      clipped[i, j] = float(-adv[i] * rc > -adv[i] * r)
      d = ref[i, j] - logp[i, j]
      kls[i, j] = -d if kl == "k1" else np.exp(d) - d - 1

  def reduce(v):
    if agg == "token_mean":
      return (v * mask).sum() / mask.sum()
    if agg == "sequence_mean_token_mean":
      return np.mean([(v[i] * mask[i]).sum() / mask[i].sum() for i in range(b)])
    return (v * mask).sum() / (b * length)

  return reduce(pg) + beta * reduce(kls), reduce(pg), reduce(kls), clipped


def _inputs(seed=0, b=4, t=6):
  rng = np.random.default_rng(seed)
  logp = -rng.uniform(0.1, 3.0, size=(b, t))
  old = logp + rng.normal(scale=0.3, size=(b, t))
  ref = logp + rng.normal(scale=0.5, size=(b, t))
  adv = rng.normal(size=b)
  lengths = rng.integers(1, t + 1, size=b)
  mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
  return logp, old, adv, mask, ref


class PolicyLossTest(parameterized.TestCase):

  def test_names_are_the_config_choices(self):
    self.assertEqual(policy_loss.KL_ESTIMATORS, choices.GRPO_KL_ESTIMATORS)
    self.assertEqual(policy_loss.AGGREGATIONS, choices.GRPO_LOSS_AGGREGATIONS)

  @parameterized.product(
      kl=policy_loss.KL_ESTIMATORS,
      agg=policy_loss.AGGREGATIONS,
      eps_high=(None, 0.28),
      beta=(0.0, 0.04),
  )
  def test_matches_numpy(self, kl, agg, eps_high, beta):
    logp, old, adv, mask, ref = _inputs()
    options = policy_loss.LossOptions(
        epsilon=0.2,
        epsilon_high=eps_high,
        beta=beta,
        kl_estimator=kl,
        aggregation=agg,
        max_completion_length=8,
    )
    loss, metrics = jax.jit(
        lambda lp, o, a, m, r: policy_loss.policy_loss(
            lp, o, a, m, options, ref_logp=r
        )
    )(
        jnp.asarray(logp, jnp.float32),
        jnp.asarray(old, jnp.float32),
        jnp.asarray(adv, jnp.float32),
        jnp.asarray(mask, jnp.float32),
        jnp.asarray(ref, jnp.float32),
    )
    want_loss, want_pg, want_kl, clipped = _numpy_reference(
        logp, old, adv, mask, ref, 0.2, eps_high or 0.2, beta, kl, agg, 8
    )
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        metrics["pg_loss"], want_pg, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        metrics["kl"], want_kl if beta else 0.0, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        metrics["kl_loss"], beta * want_kl, rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(
        metrics["pg_clipfrac"],
        (clipped * mask).sum() / mask.sum(),
        rtol=1e-6,
    )
    lower = clipped * (adv < 0)[:, None]
    np.testing.assert_allclose(
        metrics["pg_clipfrac_lower"],
        (lower * mask).sum() / mask.sum(),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        metrics["pg_clipfrac"],
        metrics["pg_clipfrac_lower"] + metrics["pg_clipfrac_upper"],
        rtol=1e-6,
    )

  def test_ratio_and_advantage_metrics(self):
    logp, old, adv, mask, ref = _inputs(seed=1)
    adv[1] = 0.0
    _, m = policy_loss.policy_loss(
        jnp.asarray(logp),
        jnp.asarray(old),
        jnp.asarray(adv),
        jnp.asarray(mask),
        policy_loss.LossOptions(),
        ref_logp=jnp.asarray(ref),
        entropy=jnp.asarray(-logp),
    )
    ratio = np.exp(logp - old)
    inside = mask > 0
    np.testing.assert_allclose(
        m["is_ratio"]["mean"], ratio[inside].mean(), rtol=1e-5
    )
    np.testing.assert_allclose(
        m["is_ratio"]["max"], ratio[inside].max(), rtol=1e-5
    )
    np.testing.assert_allclose(
        m["is_ratio"]["min"], ratio[inside].min(), rtol=1e-5
    )
    np.testing.assert_allclose(
        m["ppo_kl"], (old - logp)[inside].mean(), rtol=1e-5
    )
    np.testing.assert_allclose(m["entropy"], (-logp)[inside].mean(), rtol=1e-5)
    a = m["advantage"]
    np.testing.assert_allclose(a["mean"], adv.mean(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(a["abs_mean"], np.abs(adv).mean(), rtol=1e-5)
    np.testing.assert_allclose(a["max"], adv.max(), rtol=1e-6)
    np.testing.assert_allclose(a["min"], adv.min(), rtol=1e-6)
    np.testing.assert_allclose(a["nonzero_frac"], 0.75)

  def test_clipped_tokens_have_zero_gradient(self):
    # Sequence 0 (A > 0): ratios 1.0, 1.5 (clipped above 1.2), 0.5.
    # Sequence 1 (A < 0): ratios 1.0, 1.5, 0.5 (clipped below 0.8).
    ratios = np.array([[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]])
    old = np.full((2, 3), -1.0)
    logp = old + np.log(ratios)
    adv = np.array([1.0, -1.0])
    mask = np.ones((2, 3))
    options = policy_loss.LossOptions(epsilon=0.2)

    def loss(lp):
      return policy_loss.policy_loss(
          lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), options
      )[0]

    grad = np.asarray(jax.grad(loss)(jnp.asarray(logp, jnp.float32)))
    clipped = np.array([[False, True, False], [False, False, True]])
    np.testing.assert_array_equal(grad[clipped], 0.0)
    self.assertTrue(np.all(grad[~clipped] != 0.0))
    # Unclipped: d/dlogp of -A ratio / n = -A ratio / n.
    np.testing.assert_allclose(
        grad[~clipped], (-adv[:, None] * ratios / 6.0)[~clipped], rtol=1e-5
    )

  def test_masked_tokens_have_zero_gradient(self):
    logp, old, adv, mask, ref = _inputs(seed=2)
    options = policy_loss.LossOptions(beta=0.1)
    grad = jax.grad(
        lambda lp: policy_loss.policy_loss(
            lp,
            jnp.asarray(old),
            jnp.asarray(adv),
            jnp.asarray(mask),
            options,
            ref_logp=jnp.asarray(ref),
        )[0]
    )(jnp.asarray(logp, jnp.float32))
    np.testing.assert_array_equal(np.asarray(grad)[mask == 0], 0.0)

  def test_kl_gradients(self):
    # With A = 0 only the KL term moves logp. k3's gradient per token is
    # (1 - exp(ref - logp)) / n: it pulls logp towards ref. k1's is 1 / n
    # whatever ref is (its mean is the KL; per token it only lowers logp).
    logp = jnp.array([[-1.0, -2.0]])
    ref = jnp.array([[-2.0, -1.0]])

    def grad(estimator):
      options = policy_loss.LossOptions(beta=1.0, kl_estimator=estimator)
      return np.asarray(
          jax.grad(
              lambda lp: policy_loss.policy_loss(
                  lp, lp, jnp.zeros(1), jnp.ones((1, 2)), options, ref_logp=ref
              )[0]
          )(logp)
      )

    np.testing.assert_allclose(
        grad("k3"), (1.0 - np.exp(ref - logp)) / 2.0, rtol=1e-6
    )
    np.testing.assert_allclose(grad("k1"), [[0.5, 0.5]], rtol=1e-6)

  def test_k3_is_non_negative_and_zero_at_equality(self):
    logp = jnp.array([[-1.0, -0.5, -3.0]])
    np.testing.assert_allclose(
        policy_loss.kl_per_token(logp, logp, "k3"), 0.0, atol=1e-7
    )
    ref = jnp.array([[-2.0, -0.1, -1.0]])
    self.assertTrue(
        np.all(np.asarray(policy_loss.kl_per_token(logp, ref, "k3")) > 0)
    )

  def test_empty_mask_gives_zero(self):
    z = jnp.zeros((2, 3))
    loss, m = policy_loss.policy_loss(
        z, z, jnp.ones(2), z, policy_loss.LossOptions()
    )
    self.assertEqual(float(loss), 0.0)
    # No token: the extremes say so, and the step's reduction skips them.
    self.assertEqual(float(m["is_ratio"]["max"]), -policy_loss.EMPTY)
    self.assertEqual(float(m["is_ratio"]["min"]), policy_loss.EMPTY)
    aggregations = policy_loss.STEP_AGGREGATIONS
    self.assertEqual(aggregations["is_ratio/max"]([-policy_loss.EMPTY]), 0.0)
    self.assertEqual(
        aggregations["is_ratio/min"]([policy_loss.EMPTY, 0.7, 1.3]), 0.7
    )
    self.assertEqual(
        aggregations["is_ratio/max"]([-policy_loss.EMPTY, 0.7, 1.3]), 1.3
    )

  @parameterized.product(
      agg=("token_mean", "sequence_mean_token_mean"),
      tis=(False, True),
      threshold=(None, 2.0),
  )
  def test_reference_loss_matches_numpy(self, agg, tis, threshold):
    loss, grad, metrics, want = self._reference_case(agg, tis, threshold)
    np.testing.assert_allclose(loss, want["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, want["grad"], rtol=1e-5, atol=1e-7)
    for name in (
        "pg_loss",
        "masked/tis_frac",
        "masked/logprob_error_frac",
        "logprob_error/mean",
        "logprob_error/max",
        "tis_geo_mean/max",
        "tis_geo_mean/min",
        "sampling_is_ratio/mean",
        "sampling_is_ratio/max",
        "sampling_is_ratio/min",
        "is_ratio/mean",
        "is_ratio/max",
        "is_ratio/min",
        "pg_clipfrac",
        "trained_token_frac",
    ):
      group, _, leaf = name.partition("/")
      got = metrics[group][leaf] if leaf else metrics[group]
      np.testing.assert_allclose(
          got, want[name], rtol=1e-5, atol=1e-7, err_msg=name
      )

  def _reference_case(self, agg, tis, threshold):
    """Sequences built to fall on each side of each gate, and the oracle."""
    rng = np.random.default_rng(7)
    b, t = 6, 5
    logp = -rng.uniform(0.2, 2.0, size=(b, t))
    lengths = np.array([5, 3, 4, 5, 2, 4])
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
    # generator - trainer per token, chosen per sequence:
    diff = np.zeros((b, t))
    diff[0] = 1e-4  # geometric mean exp(-1e-4): inside [0.999, 1.002].
    diff[1] = -0.01  # pi_train / pi_gen = e^0.01 > 1.002: TIS masks it.
    diff[2] = 0.01  # e^-0.01 < 0.999: TIS masks it.
    diff[3] = [1.5, -1.5, 1.5, -1.5, 0.0]  # geo mean ~1.0; error > 2.
    diff[4] = [0.3, -0.3, 0, 0, 0]  # geo mean 1, error 1.35 < 2.
    diff[5] = 5e-4  # inside the bounds; cut by the length limit (below).
    gen = logp + diff
    adv = rng.normal(size=b)
    sequence_mask = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    # The step's counts over K = 2 (this call is one of 2 halves): 31
    # tokens of 11 sequences, 5 tokens of one gated for its error here.
    err_gated = np.zeros(b)
    if threshold is not None:
      err_gated[3] = 1.0  # What the gate decided before the loss.
    trained_sequences = sequence_mask * (1 - err_gated)
    token_normaliser = (31.0 - 5.0 * err_gated.sum()) / 2
    sequence_normaliser = (11.0 - err_gated.sum()) / 2
    counted_sequence_normaliser = 11.0 / 2
    options = policy_loss.LossOptions(
        epsilon=0.2,
        epsilon_high=0.28,
        aggregation=agg,
        force_on_policy_ratio=True,
        tis_ratio_min=0.999 if tis else None,
        tis_ratio_max=1.002 if tis else None,
        logprob_error_threshold=threshold,
    )

    def loss_fn(lp):
      return policy_loss.policy_loss(
          lp,
          jnp.asarray(gen, jnp.float32),
          jnp.asarray(adv, jnp.float32),
          jnp.asarray(mask, jnp.float32),
          options,
          sequence_mask=jnp.asarray(trained_sequences, jnp.float32),
          token_normaliser=token_normaliser,
          sequence_normaliser=sequence_normaliser,
          logprob_error_mask=jnp.asarray(err_gated, jnp.float32),
          counted_sequence_normaliser=counted_sequence_normaliser,
      )

    (loss, metrics), grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
        jnp.asarray(logp, jnp.float32)
    )

    # The oracle: the reference's computation written out (float64, loops
    # over sequences). Its error gate removes a sequence from the sample
    # mask, so from the counted tokens and sequences; its TIS gate zeroes
    # the weights inside the loss.
    sample_mask = sequence_mask.copy()
    weights = np.zeros((b, t))
    tis_out = np.zeros(b)
    err_out = np.zeros(b)
    geo = np.zeros(b)
    err = np.zeros(b)
    for i in range(b):
      n = mask[i].sum()
      log_is = -diff[i]  # log(pi_train / pi_gen)
      geo[i] = np.exp((log_is * mask[i]).sum() / n)
      err[i] = (np.exp(np.abs(diff[i])) * mask[i]).sum() / n
      if tis and not 0.999 <= geo[i] <= 1.002:
        tis_out[i] = 1.0
      if threshold is not None and err[i] > threshold:
        err_out[i] = 1.0
        sample_mask[i] = 0.0
      weights[i] = np.exp(log_is) * (1 - tis_out[i])
    np.testing.assert_array_equal(err_out * sequence_mask, err_gated)
    counted = mask * sample_mask[:, None]
    # Forced ratio: 1 in value, so the clip never acts; d(ratio)/d(logp) = 1.
    per_token = -adv[:, None] * np.ones((b, t))
    if agg == "token_mean":
      want_loss = (weights * per_token * counted).sum() / token_normaliser
      want_grad = -adv[:, None] * weights * counted / token_normaliser
    else:
      per_seq = (weights * per_token * counted).sum(1) / np.maximum(
          counted.sum(1), 1
      )
      want_loss = per_seq.sum() / sequence_normaliser
      want_grad = (
          -adv[:, None]
          * weights
          * counted
          / np.maximum(counted.sum(1), 1)[:, None]
          / sequence_normaliser
      )
    inside = counted > 0
    counted_rows = sequence_mask > 0
    kept_rows = sample_mask > 0
    ratio = np.exp(-diff)
    want = {
        "loss": want_loss,
        "grad": want_grad,
        "pg_loss": want_loss,
        "masked/tis_frac": (tis_out * sample_mask).sum() / sequence_normaliser,
        "masked/logprob_error_frac": (err_out * sequence_mask).sum()
        / counted_sequence_normaliser,
        "logprob_error/mean": (err * sequence_mask).sum()
        / counted_sequence_normaliser,
        "logprob_error/max": err[counted_rows].max(),
        "tis_geo_mean/max": geo[kept_rows].max(),
        "tis_geo_mean/min": geo[kept_rows].min(),
        "sampling_is_ratio/mean": (ratio * counted).sum() / token_normaliser,
        "sampling_is_ratio/max": ratio[inside].max(),
        "sampling_is_ratio/min": ratio[inside].min(),
        "is_ratio/mean": counted.sum() / token_normaliser,
        "is_ratio/max": 1.0,
        "is_ratio/min": 1.0,
        "pg_clipfrac": 0.0,
        "trained_token_frac": ((weights > 0) * counted).sum()
        / token_normaliser,
    }
    return loss, np.asarray(grad), metrics, want

  def test_reference_gates_mask_the_sequences_built_for_them(self):
    # The case above, gates on: sequences 1 and 2 by TIS, 3 by the error;
    # 5 by overlong filtering (its sequence mask).
    _, grad, metrics, _ = self._reference_case("token_mean", True, 2.0)
    trained = np.abs(grad).sum(axis=1) > 0
    np.testing.assert_array_equal(
        trained, [True, False, False, False, True, False]
    )
    # TIS's share is of the sequences left after the error gate (5 of the
    # step's 10 / 2), the error gate's of those before it (11 / 2).
    np.testing.assert_allclose(metrics["masked"]["tis_frac"], 2 / 5)
    np.testing.assert_allclose(metrics["masked"]["logprob_error_frac"], 1 / 5.5)
    # Off, every counted sequence trains.
    _, grad, _, _ = self._reference_case("token_mean", False, None)
    trained = np.abs(grad).sum(axis=1) > 0
    np.testing.assert_array_equal(trained, [True] * 5 + [False])

  def test_forced_ratio_weights_by_the_sampling_ratio(self):
    # Without the forced ratio the same tokens are clipped PPO tokens; with
    # it the ratio is 1 and the weight pi_train / pi_gen is no gradient
    # path: the gradient is -A w / n.
    logp = jnp.asarray([[-1.0, -2.0]])
    gen = jnp.asarray([[-1.5, -1.0]])
    adv = jnp.asarray([2.0])
    options = policy_loss.LossOptions(force_on_policy_ratio=True)
    grad = jax.grad(
        lambda lp: policy_loss.policy_loss(
            lp, gen, adv, jnp.ones((1, 2)), options
        )[0]
    )(logp)
    np.testing.assert_allclose(grad, -2.0 * np.exp(logp - gen) / 2.0, rtol=1e-6)

  def test_a_whole_step_in_one_call_gates_its_own_errors(self):
    # Without the step's normalisers the call is the whole step: a sequence
    # over the threshold leaves the token count, as the reference's sample
    # mask does. Sequence 1's error is e^1.5 > 2.
    logp = jnp.asarray([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    gen = logp + jnp.asarray([[0.0, 0.0, 0.0], [1.5, -1.5, 1.5]])
    adv = jnp.asarray([1.0, -3.0])
    mask = jnp.asarray([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    options = policy_loss.LossOptions(
        force_on_policy_ratio=True, logprob_error_threshold=2.0
    )
    loss, metrics = policy_loss.policy_loss(logp, gen, adv, mask, options)
    # Sequence 0 alone: 2 tokens of weight 1 and advantage 1, over its 2.
    np.testing.assert_allclose(loss, -1.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["masked"]["logprob_error_frac"], 0.5)
    # The step's normalisers without the gate's mask cannot be right.
    with self.assertRaisesRegex(ValueError, "logprob_error_mask"):
      policy_loss.policy_loss(
          logp, gen, adv, mask, options, token_normaliser=5.0
      )

  def test_non_finite_weights_are_zero(self):
    # A generator log-probability of -inf (or NaN) makes pi_train / pi_gen
    # infinite (or NaN): the reference's nan_to_num makes its weight 0, so
    # the token trains nothing and the step stays finite.
    logp = jnp.asarray([[-1.0, -2.0, -1.0]])
    options = policy_loss.LossOptions(
        force_on_policy_ratio=True, tis_ratio_min=0.0, tis_ratio_max=1e9
    )
    for bad in (-jnp.inf, jnp.nan):
      gen = jnp.asarray([[-1.0, bad, -1.0]])
      (loss, metrics), grad = jax.value_and_grad(
          lambda lp, gen=gen: policy_loss.policy_loss(
              lp, gen, jnp.asarray([1.0]), jnp.ones((1, 3)), options
          ),
          has_aux=True,
      )(logp)
      np.testing.assert_allclose(loss, -2.0 / 3.0, rtol=1e-6)
      np.testing.assert_allclose(grad, [[-1 / 3, 0.0, -1 / 3]], rtol=1e-6)
      # The geometric mean's log-ratio of that token is 0 too.
      np.testing.assert_allclose(metrics["tis_geo_mean"]["max"], 1.0)

  def test_beta_without_reference_is_refused(self):
    z = jnp.zeros((1, 2))
    with self.assertRaisesRegex(ValueError, "reference"):
      policy_loss.policy_loss(
          z, z, jnp.ones(1), z + 1, policy_loss.LossOptions(beta=0.1)
      )

  @parameterized.named_parameters(
      ("epsilon", dict(epsilon=0.0), "epsilon=0.0"),
      ("epsilon_high", dict(epsilon_high=-0.1), "epsilon_high=-0.1"),
      ("beta", dict(beta=-1.0), "beta=-1.0"),
      ("kl", dict(kl_estimator="k2"), "kl_estimator='k2'"),
      ("aggregation", dict(aggregation="sum"), "aggregation='sum'"),
      ("dr_grpo_length", dict(aggregation="dr_grpo"), "max_completion_length"),
      ("temperature", dict(temperature=0.0), "temperature=0.0"),
      (
          "tis_one_bound",
          dict(force_on_policy_ratio=True, tis_ratio_min=0.999),
          "set both or neither",
      ),
      (
          "tis_bounds",
          dict(
              force_on_policy_ratio=True, tis_ratio_min=1.1, tis_ratio_max=2.0
          ),
          "min <= 1 <= max",
      ),
      (
          "tis_unforced",
          dict(tis_ratio_min=0.999, tis_ratio_max=1.002),
          "needs force_on_policy_ratio",
      ),
      (
          "error_threshold",
          dict(logprob_error_threshold=0.5),
          "logprob_error_threshold=0.5",
      ),
  )
  def test_bad_options(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      policy_loss.LossOptions(**kwargs)


if __name__ == "__main__":
  absltest.main()
