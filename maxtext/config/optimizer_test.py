"""Tests for maxtext/config/optimizer.py: schedule, facts, the AdamW chain."""

import dataclasses
import math

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.core import choices
from maxtext.config import optimizer
from maxtext.configs import base


def _run_config(**overrides):
  config = base.get_config()
  config.learning_rate = 0.02
  config.warmup_steps = 10
  config.steps = 110
  config.lr_schedule_steps = 0
  config.lr_end_fraction = 0.25
  for key, value in overrides.items():
    config[key] = value
  return config


def _config(**overrides):
  """The optimizer's settings of a run config with `overrides`."""
  return optimizer.OptimizerConfig.from_config(_run_config(**overrides))


class ScheduleTest(parameterized.TestCase):

  def test_values_at_key_steps(self):
    config = _config()
    schedule = optimizer.make_schedule(config)
    peak = config.learning_rate
    end = peak * config.lr_end_fraction
    warmup = config.warmup_steps
    total = config.steps
    decay = total - warmup
    expected = {
        0: 0.0,
        warmup // 2: peak * (warmup // 2) / warmup,
        warmup - 1: peak * (warmup - 1) / warmup,
        warmup: peak,
        warmup + decay // 2: (peak + end) / 2,
        warmup
        + decay // 4: end
        + (peak - end) * 0.5 * (1 + math.cos(math.pi / 4)),
        total
        - 1: end
        + (peak - end) * 0.5 * (1 + math.cos(math.pi * (decay - 1) / decay)),
        total: end,
        total + 50: end,
    }
    for step, value in expected.items():
      with self.subTest(step=step):
        np.testing.assert_allclose(
            float(schedule(step)), value, rtol=1e-5, atol=1e-9
        )

  def test_monotone_warmup_then_decay(self):
    config = _config()
    values = np.asarray(
        jax.vmap(optimizer.make_schedule(config))(jnp.arange(config.steps + 1))
    )
    warmup = config.warmup_steps
    self.assertTrue(np.all(np.diff(values[: warmup + 1]) > 0))
    self.assertTrue(np.all(np.diff(values[warmup:]) < 0))
    self.assertEqual(values.dtype, np.float32)

  def test_lr_schedule_steps_overrides_steps(self):
    config = _config(lr_schedule_steps=60)
    schedule = optimizer.make_schedule(config)
    end = config.learning_rate * config.lr_end_fraction
    np.testing.assert_allclose(float(schedule(60)), end, rtol=1e-6)
    np.testing.assert_allclose(
        float(schedule(35)), (config.learning_rate + end) / 2, rtol=1e-5
    )

  def test_no_warmup_starts_at_peak(self):
    config = _config(warmup_steps=0)
    np.testing.assert_allclose(
        float(optimizer.make_schedule(config)(0)),
        config.learning_rate,
        rtol=1e-6,
    )

  def test_jittable_with_traced_count(self):
    config = _config()
    schedule = optimizer.make_schedule(config)
    np.testing.assert_allclose(jax.jit(schedule)(jnp.int32(5)), schedule(5))

  @parameterized.named_parameters(
      ("warmup_past_steps", dict(warmup_steps=200), "warmup_steps=200"),
      ("warmup_past_schedule", dict(lr_schedule_steps=5), "warmup_steps=10"),
      ("end_fraction", dict(lr_end_fraction=2.0), "lr_end_fraction"),
      ("negative_warmup", dict(warmup_steps=-1), "warmup_steps=-1: must be >="),
      ("unknown_kind", dict(lr_schedule="linear"), "lr_schedule='linear'"),
      ("adam_b2", dict(adam_b2=1.0), r"^config\.adam_b2=1\.0: must be in"),
      ("adam_eps", dict(adam_eps=0.0), "adam_eps=0.0: must be > 0"),
      ("clip", dict(grad_clip_norm=-1.0), "grad_clip_norm=-1.0: must be >= 0"),
  )
  def test_bad_schedule(self, overrides, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      _config(**overrides)
    # Settings made without `from_config` are checked before use.
    unchecked = dataclasses.replace(_config(), **overrides)
    with self.assertRaisesRegex(ValueError, pattern):
      optimizer.make_schedule(unchecked)
    with self.assertRaisesRegex(ValueError, pattern):
      optimizer.schedule_facts(unchecked)


def _hand_written_cosine(config):
  """Warm-up + cosine written out in float32, the formula of make_schedule's
  docstring: the reference the optax-built schedule must equal."""
  peak = float(config.learning_rate)
  warmup = int(config.warmup_steps)
  total = config.lr_schedule_steps or config.steps
  end = peak * float(config.lr_end_fraction)
  decay = total - warmup

  def schedule(count):
    t = jnp.asarray(count, jnp.float32)
    warm = peak * t / max(warmup, 1)
    progress = jnp.clip((t - warmup) / max(decay, 1), 0.0, 1.0)
    cosine = end + (peak - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    lr = jnp.where(t < warmup, warm, jnp.where(t >= total, end, cosine))
    return lr.astype(jnp.float32)

  return schedule


class CosineMatchesFormulaTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("base", {}),
      ("no_warmup", dict(warmup_steps=0)),
      ("warmup_is_the_schedule", dict(warmup_steps=110)),
      ("one_warmup_step", dict(warmup_steps=1)),
      ("shorter_schedule", dict(lr_schedule_steps=60)),
      ("decay_to_zero", dict(lr_end_fraction=0.0)),
      ("no_decay", dict(lr_end_fraction=1.0)),
      (
          "llama_like",
          dict(
              learning_rate=3e-4,
              warmup_steps=7,
              steps=1000,
              lr_end_fraction=0.1,
          ),
      ),
  )
  def test_every_step(self, overrides):
    config = _config(**overrides)
    steps = jnp.arange(config.schedule_steps + 10)
    ours = jax.jit(jax.vmap(optimizer.make_schedule(config)))(steps)
    reference = jax.jit(jax.vmap(_hand_written_cosine(config)))(steps)
    # Both are float32: where the rate nears 0 (the first warm-up steps,
    # the end of a decay to 0) their roundings differ by about one float32
    # ulp of the peak, hence the absolute term.
    np.testing.assert_allclose(
        ours, reference, rtol=1e-6, atol=1e-7 * config.learning_rate
    )


class ConstantScheduleTest(parameterized.TestCase):

  def test_warmup_then_constant(self):
    config = _config(lr_schedule="constant")
    values = np.asarray(
        jax.vmap(optimizer.make_schedule(config))(jnp.arange(config.steps + 20))
    )
    warmup = config.warmup_steps
    np.testing.assert_allclose(
        values[:warmup],
        config.learning_rate * np.arange(warmup) / warmup,
        rtol=1e-6,
        atol=1e-7 * config.learning_rate,
    )
    np.testing.assert_allclose(values[warmup:], config.learning_rate)
    self.assertEqual(values.dtype, np.float32)

  def test_without_warmup_constant_from_the_start(self):
    config = _config(lr_schedule="constant", warmup_steps=0)
    values = jax.vmap(optimizer.make_schedule(config))(jnp.arange(50))
    np.testing.assert_allclose(values, config.learning_rate)


class ScheduleFactsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("cosine", "cosine"), ("constant", "constant")
  )
  def test_facts_describe_the_schedule(self, kind):
    config = _config(lr_schedule=kind, lr_schedule_steps=70)
    facts = optimizer.schedule_facts(config)
    schedule = optimizer.make_schedule(config)
    self.assertEqual(facts.kind, kind)
    self.assertEqual(facts.warmup_steps, config.warmup_steps)
    self.assertEqual(facts.schedule_steps, 70)
    self.assertEqual(facts.decay_steps, 70 - config.warmup_steps)
    self.assertEqual(facts.learning_rate, config.learning_rate)
    self.assertEqual(facts.decay_schedule, optimizer.DECAY_SCHEDULE_NAMES[kind])
    # The schedule reaches the peak after the warm-up and the end rate at
    # the schedule's end, and stays there.
    for step, expected in (
        (facts.warmup_steps, facts.learning_rate),
        (facts.schedule_steps, facts.end_learning_rate),
        (facts.schedule_steps + 100, facts.end_learning_rate),
    ):
      with self.subTest(step=step):
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6)

  def test_end_learning_rate_is_free_of_float_noise(self):
    config = _config(learning_rate=1e-3, lr_end_fraction=0.1)
    self.assertEqual(optimizer.end_learning_rate(config), 1e-4)
    config = dataclasses.replace(config, lr_schedule="constant")
    self.assertEqual(optimizer.end_learning_rate(config), 1e-3)

  def test_schedule_length_defaults_to_steps(self):
    self.assertEqual(_config().schedule_steps, 110)
    self.assertEqual(_config(lr_schedule_steps=80).schedule_steps, 80)
    self.assertEqual(optimizer.schedule_length(0, 110), 110)
    self.assertEqual(optimizer.schedule_length(80, 110), 80)

  def test_every_schedule_has_a_builder_and_a_name(self):
    self.assertEqual(set(optimizer.DECAYS), set(choices.LR_SCHEDULES))
    self.assertEqual(
        set(optimizer.DECAY_SCHEDULE_NAMES), set(choices.LR_SCHEDULES)
    )


class OptimizerTest(absltest.TestCase):

  def _params(self):
    return {"w": jnp.full((3, 4), 2.0), "scale": jnp.full((4,), 2.0)}

  def test_first_warmup_step_changes_nothing(self):
    config = _config()
    tx = optimizer.make_optimizer(config, optimizer.make_schedule(config))
    params = self._params()
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    chex.assert_trees_all_close(optax.apply_updates(params, updates), params)

  def test_weight_decay_applies_to_matrices_only(self):
    config = _config(warmup_steps=0, weight_decay=0.5)
    tx = optimizer.make_optimizer(config, optimizer.make_schedule(config))
    params = self._params()
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    np.testing.assert_allclose(
        updates["w"],
        -config.learning_rate * config.weight_decay * 2.0,
        rtol=1e-6,
    )
    np.testing.assert_allclose(updates["scale"], 0.0)

  def test_gradients_are_clipped_to_the_global_norm(self):
    # A large epsilon makes Adam's first update depend on the gradient scale,
    # so clipping is visible: clipped big gradients = unclipped small ones.
    clip = 0.5
    common = dict(warmup_steps=0, weight_decay=0.0, adam_eps=10.0)
    clipped_tx = optimizer.make_optimizer(
        _config(grad_clip_norm=clip, **common),
        optimizer.make_schedule(_config(**common)),
    )
    plain_tx = optimizer.make_optimizer(
        _config(grad_clip_norm=0.0, **common),
        optimizer.make_schedule(_config(**common)),
    )
    params = self._params()
    grads = {"w": jnp.arange(12.0).reshape(3, 4), "scale": jnp.ones((4,))}
    norm = optax.tree.norm(grads)
    self.assertGreater(float(norm), clip)
    small = jax.tree_util.tree_map(lambda g: g * clip / norm, grads)
    clipped, _ = clipped_tx.update(grads, clipped_tx.init(params), params)
    expected, _ = plain_tx.update(small, plain_tx.init(params), params)
    chex.assert_trees_all_close(clipped, expected, rtol=1e-5)
    unclipped, _ = plain_tx.update(grads, plain_tx.init(params), params)
    self.assertGreater(
        float(jnp.max(jnp.abs(unclipped["w"] - clipped["w"]))), 1e-4
    )

  def test_without_clipping_same_state_structure_and_no_clip(self):
    common = dict(warmup_steps=0, weight_decay=0.0, adam_eps=10.0)
    config = _config(grad_clip_norm=0.5, **common)
    schedule = optimizer.make_schedule(config)
    with_clip = optimizer.make_optimizer(config, schedule)
    without = optimizer.make_optimizer(config, schedule, include_clipping=False)
    plain = optimizer.make_optimizer(
        _config(grad_clip_norm=0.0, **common), schedule
    )
    params = self._params()
    # Checkpoints written either way restore into the other.
    self.assertEqual(
        jax.tree_util.tree_structure(with_clip.init(params)),
        jax.tree_util.tree_structure(without.init(params)),
    )
    grads = {"w": jnp.arange(12.0).reshape(3, 4), "scale": jnp.ones((4,))}
    got, _ = without.update(grads, without.init(params), params)
    expected, _ = plain.update(grads, plain.init(params), params)
    chex.assert_trees_all_close(got, expected)

  def test_state_keeps_parameter_dtype(self):
    config = _config()
    tx = optimizer.make_optimizer(config, optimizer.make_schedule(config))
    params = {"w": jnp.ones((2, 2), jnp.bfloat16)}
    state = tx.init(params)
    for leaf in jax.tree_util.tree_leaves(state):
      if getattr(leaf, "shape", ()) == (2, 2):
        self.assertEqual(leaf.dtype, jnp.bfloat16)


if __name__ == "__main__":
  absltest.main()
