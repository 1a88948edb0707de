"""Every name of maxtext/core/choices.py has an implementation behind it.

The validator accepts exactly these names (config_lib_test); here each one
reaches code that implements it: the model's kernels and layers, the
optimizer's schedules, the data sets, the MLPerf precision names.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import choices
from maxtext.data import dataset_kinds
from maxtext.config import optimizer
from maxtext.grpo.loss import advantages
from maxtext.grpo.loss import policy_loss
from maxtext.mllog import hyperparameters
from maxtext.model import layers
from maxtext.model import moe
from maxtext.model import transformer
from testing import tiny_configs


class ChoicesTest(parameterized.TestCase):

  def test_attention_implementations_are_the_kernels_and_auto(self):
    # "auto" resolves to one of the kernels (attention_implementation).
    self.assertEqual(
        set(choices.ATTENTION_IMPLEMENTATIONS), {"auto", *layers.KERNELS}
    )
    self.assertIn(
        transformer.attention_implementation(tiny_configs.model_config()),
        layers.KERNELS,
    )

  @parameterized.named_parameters((name, name) for name in choices.DTYPES)
  def test_dtypes_are_jax_dtypes_with_an_mlperf_name(self, name):
    self.assertEqual(jnp.dtype(name).name, name)
    self.assertIn(
        hyperparameters.precision_name(name), hyperparameters.PRECISIONS
    )

  @parameterized.named_parameters(
      (name, name) for name in choices.ATTENTION_TYPES
  )
  def test_attention_types_build_and_apply(self, name):
    presets = [tiny_configs.TINY_MLA] if name == "mla" else []
    config = tiny_configs.model_config(*presets, attention_type=name)
    # Traced, not compiled: the dispatch runs, the arithmetic need not.
    params = jax.eval_shape(
        functools.partial(transformer.init_params, config),
        jax.random.PRNGKey(0),
    )
    tokens = jax.ShapeDtypeStruct((2, config.max_sequence_length), jnp.int32)
    logits = jax.eval_shape(
        functools.partial(transformer.apply, config=config), params, tokens
    )
    self.assertEqual(
        logits.shape, (2, config.max_sequence_length, config.vocab_size)
    )

  @parameterized.named_parameters(
      (name, name) for name in choices.ROUTER_SCORES
  )
  def test_router_scores_route(self, name):
    config = tiny_configs.model_config(tiny_configs.TINY_MOE, router_score=name)
    logits = jax.random.normal(jax.random.PRNGKey(1), (6, config.num_experts))
    probs, weights, experts = moe.route(logits, config)
    np.testing.assert_allclose(np.sum(probs, axis=-1), 1.0, rtol=1e-5)
    self.assertEqual(weights.shape, (6, config.num_experts_per_token))
    self.assertEqual(experts.shape, (6, config.num_experts_per_token))

  @parameterized.named_parameters(
      (name, name) for name in choices.ROPE_SCALINGS
  )
  def test_rope_scalings_make_frequencies(self, name):
    config = tiny_configs.model_config(rope_scaling=name)
    frequencies = layers.rope_frequencies(
        config.head_dim, config.rope_theta, layers.rope_scaling(config)
    )
    self.assertEqual(frequencies.shape, (config.head_dim // 2,))
    self.assertTrue(bool(jnp.all(frequencies > 0)))

  @parameterized.named_parameters(
      (name, name) for name in choices.LOAD_BALANCE_LOSSES
  )
  def test_load_balance_losses_compute(self, name):
    probs = jnp.full((2, 3, 4), 0.25)
    experts = jnp.zeros((2, 3, 2), jnp.int32)
    loss = moe.balance_loss(probs, experts, 4, name)
    self.assertTrue(np.isfinite(float(loss)))

  def test_grpo_choices_are_the_implementations(self):
    self.assertEqual(advantages.ESTIMATORS, choices.GRPO_ADVANTAGE_ESTIMATORS)
    self.assertEqual(policy_loss.KL_ESTIMATORS, choices.GRPO_KL_ESTIMATORS)
    self.assertEqual(policy_loss.AGGREGATIONS, choices.GRPO_LOSS_AGGREGATIONS)
    for name in choices.GRPO_ADVANTAGE_ESTIMATORS:
      self.assertEqual(
          advantages.group_advantages([[1.0, 1.0]], name).tolist(), [[0, 0]]
      )
    for name in choices.GRPO_LOSS_AGGREGATIONS:
      self.assertEqual(
          float(
              policy_loss.aggregate(jnp.ones((1, 2)), jnp.ones((1, 2)), name, 2)
          ),
          1.0,
      )
    for name in choices.GRPO_KL_ESTIMATORS:
      self.assertEqual(
          float(policy_loss.kl_per_token(jnp.zeros(1), jnp.zeros(1), name)[0]),
          0.0,
      )

  def test_lr_schedules_have_a_decay_and_an_mlperf_name(self):
    self.assertEqual(set(optimizer.DECAYS), set(choices.LR_SCHEDULES))
    self.assertEqual(
        set(optimizer.DECAY_SCHEDULE_NAMES), set(choices.LR_SCHEDULES)
    )

  def test_dataset_types_are_the_data_set_kinds(self):
    self.assertCountEqual(dataset_kinds.KINDS, choices.DATASET_TYPES)


if __name__ == "__main__":
  absltest.main()
