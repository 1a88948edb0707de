"""train_loss: the trained policy is the sampled one; one step, any K."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maxtext.grpo.loss import policy_loss
from maxtext.grpo.tasks import progression_task
from maxtext.grpo.rewards import rewards
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.grpo.loss import train_loss
from maxtext.model import transformer
from maxtext.generation import sampling
from testing import tiny_configs


def _flat(metrics, prefix=""):
  out = {}
  for name, value in metrics.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{name}/"))
    else:
      out[f"{prefix}{name}"] = getattr(value, "value", value)
  return out


class TrainLossTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = tiny_configs.model_config()
    cls.config = ml_collections.FrozenConfigDict(config)
    cls.params = transformer.init_params(config, jax.random.PRNGKey(0))
    task = progression_task.ProgressionTask(32, 3, 6, num_eval=8, seed=0)
    cls.prompts = task.train_prompts(0, 4)
    cls.functions = rewards.load(
        "maxtext.grpo.tasks.progression_task:prefix_match"
    )

  def _rollout(self, temperature, stop_ids=()):
    options = sampling.SamplingOptions(
        max_new_tokens=6,
        temperature=temperature,
        seed=3,
        num_samples=4,
        stop_ids=stop_ids,
    )
    return rollout_lib.rollout(
        self.params,
        self.config,
        self.prompts,
        options,
        self.functions,
        width=9,
    )

  def _loss(self, batch, options):
    return jax.jit(lambda p, b: train_loss.loss_fn(p, b, self.config, options))(
        self.params, batch
    )

  @parameterized.named_parameters(("t05", 0.5), ("t1", 1.0))
  def test_on_policy_ratio_is_one_and_entropy_is_the_sampled(self, temperature):
    result = self._rollout(temperature)
    (batch,) = rollout_lib.micro_batches(result, 1)
    options = policy_loss.LossOptions(temperature=temperature)
    _, metrics = self._loss(batch, options)
    m = _flat(metrics)
    # The decoder's behaviour log-probabilities and the trained policy's are
    # the same distribution: the ratio is 1 on every token.
    for name in ("is_ratio/mean", "is_ratio/max", "is_ratio/min"):
      np.testing.assert_allclose(m[name], 1.0, atol=1e-3, err_msg=name)
    # The entropy is softmax(logits / T)'s at each completion position, in
    # NumPy from one forward pass.
    logits = (
        np.asarray(
            transformer.apply(
                self.params, jnp.asarray(result.tokens), self.config
            ),
            np.float64,
        )
        / temperature
    )
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    entropy = -(np.exp(log_p) * log_p).sum(-1)
    want = []
    for row, n in enumerate(result.completion_lengths):
      start = result.prompt_lengths[row] - 1
      want.extend(entropy[row, start : start + n])
    np.testing.assert_allclose(m["entropy"], np.mean(want), rtol=1e-4)
    if temperature != 1.0:
      # Trained at temperature 1, the same samples are far off-policy.
      _, metrics = self._loss(batch, policy_loss.LossOptions())
      m1 = _flat(metrics)
      self.assertGreater(abs(m1["is_ratio/max"] - 1.0), 0.05)
      self.assertGreater(abs(m1["entropy"] - m["entropy"]), 0.05)

  @parameterized.named_parameters(
      ("token_mean", "token_mean", False),
      ("sequence_mean_token_mean", "sequence_mean_token_mean", False),
      ("token_mean_overlong_filtered", "token_mean", True),
  )
  def test_one_and_four_micro_batches_give_the_same_gradient(
      self, aggregation, overlong
  ):
    # A stop id cuts completions at different lengths.
    result = self._rollout(1.0, stop_ids=(5, 9, 13, 17))
    lengths = result.completion_lengths
    self.assertGreater(len(set(lengths.tolist())), 2)
    if overlong:
      self.assertTrue(0 < np.sum(lengths >= 6) < len(lengths))
      mask = (lengths < 6).astype(np.float32)
      result = dataclasses.replace(result, sequence_mask=mask)
    # Advantages with every sign, so no micro-batch's tokens cancel.
    result = dataclasses.replace(
        result,
        advantages=np.linspace(-1.0, 1.5, len(lengths)).astype(np.float32),
    )
    options = policy_loss.LossOptions(aggregation=aggregation)

    def step_gradient(k, drop_normalisers=False):
      grad_fn = jax.jit(
          jax.grad(
              lambda p, b: train_loss.loss_fn(p, b, self.config, options)[0]
          )
      )
      total = None
      for batch in rollout_lib.micro_batches(result, k):
        if drop_normalisers:
          batch = {
              name: value
              for name, value in batch.items()
              if not name.endswith("_normaliser")
          }
        g = grad_fn(self.params, batch)
        total = g if total is None else jax.tree.map(jnp.add, total, g)
      # The engine's mean over its K micro-batches.
      return jax.tree.map(lambda x: np.asarray(x) / k, total)

    one, four = step_gradient(1), step_gradient(4)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        one,
        four,
    )
    if aggregation == "token_mean":
      # Each micro-batch's own token mean weighs a token by its
      # micro-batch's length: a different gradient.
      per_micro_batch = step_gradient(4, drop_normalisers=True)
      gap = max(
          float(np.max(np.abs(a - b)))
          for a, b in zip(
              jax.tree.leaves(one), jax.tree.leaves(per_micro_batch)
          )
      )
      self.assertGreater(gap, 1e-4)

  def test_step_extremes_are_the_whole_steps(self):
    result = self._rollout(0.7, stop_ids=(5, 9, 13, 17))
    options = policy_loss.LossOptions(temperature=1.0)
    (whole,) = rollout_lib.micro_batches(result, 1)
    _, metrics = self._loss(whole, options)
    want = _flat(metrics)
    parts = [
        _flat(self._loss(batch, options)[1])
        for batch in rollout_lib.micro_batches(result, 4)
    ]
    for name, reduce in train_loss.STEP_AGGREGATIONS.items():
      got = reduce(np.array([p[name] for p in parts]))
      np.testing.assert_allclose(got, want[name], rtol=1e-6, err_msg=name)
    # The token metrics' mean over the micro-batches is the step's.
    for name in ("entropy", "is_ratio/mean", "ppo_kl", "pg_loss"):
      np.testing.assert_allclose(
          np.mean([p[name] for p in parts]),
          want[name],
          rtol=1e-5,
          atol=1e-7,
          err_msg=name,
      )


if __name__ == "__main__":
  absltest.main()
