"""frozen_router: no gradient and no optimizer update reaches the router."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from maxtext.config import optimizer
from maxtext.engine import engine as engine_lib
from maxtext.engine import model_setup
from maxtext.grpo.loss import frozen_router
from maxtext.grpo.loss import policy_loss
from maxtext.grpo.loss import train_loss
from maxtext.metrics import recorder as recorder_lib
from maxtext.model import transformer
from testing import tiny_configs


def _micro_batch(rng):
  tokens = rng.integers(1, 32, size=(4, 9)).astype(np.int32)
  lengths = np.array([5, 3, 4, 2])
  mask = (np.arange(5)[None, :] < lengths[:, None]).astype(np.float32)
  return {
      "tokens": tokens,
      "prompt_lengths": np.full((4,), 4, np.int32),
      "mask": mask,
      "old_log_probs": np.full((4, 5), -3.0, np.float32) * mask,
      "advantages": np.array([1.0, -1.0, 0.5, -0.5], np.float32),
  }


def _leaves_by_path(tree):
  return {
      jax.tree_util.keystr(path): np.asarray(leaf)
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
  }


class FrozenRouterTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.config = tiny_configs.model_config(
        tiny_configs.TINY_MOE, weight_decay=0.1, router_bias=True
    )
    cls.frozen_config = ml_collections.FrozenConfigDict(cls.config)
    cls.params = transformer.init_params(cls.config, jax.random.PRNGKey(1))

  def test_mask_names_the_router_only(self):
    mask = _leaves_by_path(frozen_router.router_mask(self.params))
    frozen = sorted(path for path, value in mask.items() if value)
    self.assertEqual(
        frozen,
        ["['moe_layers']['router']", "['moe_layers']['router_bias']"],
    )
    self.assertEqual(frozen_router.count(self.params), 2)
    dense = transformer.init_params(
        tiny_configs.model_config(), jax.random.PRNGKey(1)
    )
    self.assertEqual(frozen_router.count(dense), 0)

  def test_loss_gives_the_router_no_gradient(self):
    batch = _micro_batch(np.random.default_rng(0))
    options = policy_loss.LossOptions()

    def grads(freeze):
      return _leaves_by_path(
          jax.grad(
              lambda p: train_loss.loss_fn(
                  p, batch, self.frozen_config, options, freeze_router=freeze
              )[0]
          )(self.params)
      )

    frozen, free = grads(True), grads(False)
    for path, value in frozen.items():
      if "router" in path:
        np.testing.assert_array_equal(value, 0.0, err_msg=path)
        if path.endswith("['router']"):
          # Unfrozen, the same loss does move it (the bias never has a
          # gradient: its own balancing rule moves it, off in GRPO).
          self.assertGreater(np.abs(free[path]).max(), 0.0, msg=path)
      else:
        np.testing.assert_array_equal(value, free[path], err_msg=path)

  @parameterized.named_parameters(("frozen", True), ("free", False))
  def test_engine_steps_leave_the_router_as_it_was(self, freeze):
    decay = transformer.weight_decay_mask
    if freeze:
      decay = frozen_router.decay_mask(decay)
    # The decay mask of a matrix-shaped router is True unfrozen: AdamW's
    # decoupled decay alone would move it.
    self.assertTrue(
        transformer.weight_decay_mask(self.params)["moe_layers"]["router"]
    )
    engine = engine_lib.Engine(
        functools.partial(
            train_loss.loss_fn,
            config=self.frozen_config,
            options=policy_loss.LossOptions(),
            freeze_router=freeze,
        ),
        jax.tree_util.tree_map(jnp.copy, self.params),
        model_setup.make_optimizer(
            optimizer.OptimizerConfig.from_config(self.config),
            optax.constant_schedule(1e-2),
            decay_mask=decay,
        ),
        optax.constant_schedule(1e-2),
        recorder_lib.MetricsRecorder(),
        1,
    )
    rng = np.random.default_rng(3)
    for _ in range(3):
      engine.fwd_bwd(_micro_batch(rng))
      record = engine.update(release=True)
      self.assertEqual(record.scalar_metrics["step_skipped"][0], 0)
    before = _leaves_by_path(self.params)
    after = _leaves_by_path(engine.params)
    for path, value in after.items():
      moved = not np.array_equal(value, before[path])
      if path.endswith("['router']"):
        self.assertEqual(moved, not freeze, msg=path)
      elif "router" in path:
        self.assertFalse(moved, msg=path)
      elif "norm" not in path:
        self.assertTrue(moved, msg=path)


if __name__ == "__main__":
  absltest.main()
