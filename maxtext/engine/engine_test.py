"""Tests for maxtext.engine.engine, on a tiny linear model."""

import time

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.engine import engine as engine_lib
from maxtext.engine import metric_packing
from maxtext.core import eval_metrics
from maxtext.model import param_statistics
from maxtext.metrics import recorder as mr
from testing import compile_counter
from testing import dispatch_counter

K = 3


def make_loss_fn(num_extra=2):
  """A linear-regression loss whose aux holds every kind of metric value."""

  def loss_fn(params, batch):
    pred = batch["x"] @ params["w"] + params["b"]
    err = pred - batch["y"]
    loss = jnp.mean(err**2)
    aux = {
        "mae": jnp.mean(jnp.abs(err)),
        "nested": {
            "double": 2.0 * loss,
            "intermediate_outputs": err,
            "none": None,
        },
        "skipped_tuple": (loss, loss),
        "skipped_list": [loss],
        "intermediate_outputs": {"pred": pred},
        "sq": mr.WeightedMetric(jnp.sum(err**2), err.size),
        "extra": {f"e{i}": loss + i for i in range(num_extra)},
    }
    return loss, aux

  return loss_fn


def make_params():
  return {"w": jnp.zeros((3, 1), jnp.float32), "b": jnp.zeros((1,))}


def make_batches(n, seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    x = rng.normal(size=(4, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3) * scale
    out.append({"x": x, "y": y.astype(np.float32)})
  return out


def make_engine(loss_fn=None, k=K, **kwargs):
  return engine_lib.Engine(
      loss_fn or make_loss_fn(),
      make_params(),
      optax.adam(0.05),
      optax.linear_schedule(0.1, 0.0, 10),
      mr.MetricsRecorder(),
      k,
      **kwargs,
  )


class FlattenTest(parameterized.TestCase):

  def test_skip_rules(self):
    value = {
        "a": 1.0,
        "b": None,
        "c": (1.0,),
        "d": [1.0],
        "intermediate_outputs": 5.0,
        "e": {"f": 2.0, "intermediate_outputs": 3.0, "g": {"h": 4.0}},
    }
    self.assertEqual(
        engine_lib.flatten_metrics("top", value),
        [("top/a", 1.0), ("top/e/f", 2.0), ("top/e/g/h", 4.0)],
    )
    self.assertEqual(engine_lib.flatten_metrics("x", 1.5), [("x", 1.5)])
    self.assertEqual(engine_lib.flatten_metrics("x", None), [])

  def test_record_metrics_goes_through_the_recorder(self):
    eng = make_engine()
    eng.record_metrics(
        "user",
        {
            "a": jnp.float32(1.0),
            "skip": None,
            "t": (1.0, 2.0),
            "w": mr.WeightedMetric(1.0, 4.0),
            "intermediate_outputs": {"z": 1.0},
        },
    )
    self.assertEqual(eng.recorder.pending_count(), 2)
    with self.assertRaisesRegex(TypeError, "metric 'user/bad'.*boolean"):
      eng.record_metrics("user", {"bad": True})
    buf = eng.recorder.get_step_metrics(0)
    self.assertEqual(set(buf.scalar_metrics), {"user/a"})
    self.assertEqual(set(buf.weighted_metrics), {"user/w"})


def three_program_steps(k, clip, steps):
  """What the step computed as three programs (micro-steps, then the
  gradient measure, then the optimizer apply after the flush), in plain
  JAX: the reference for the fused step.

  Args:
    k: micro-batches per step.
    clip: the global norm the mean gradient is clipped to (0 = none).
    steps: per step, its k micro-batches.

  Returns:
    (params, opt_state, losses per micro-batch, grad_norm per step,
    step_skipped per step).
  """
  loss_fn = make_loss_fn()
  params, opt = make_params(), optax.adam(0.05)
  opt_state = opt.init(params)
  losses, norms, skipped = [], [], []
  for batches in steps:
    grad_sum = None
    for b in batches:
      (loss, _), g = jax.value_and_grad(loss_fn, has_aux=True)(params, b)
      losses.append(float(loss))
      grad_sum = g if grad_sum is None else jax.tree.map(jnp.add, grad_sum, g)
    mean = jax.tree.map(lambda a: a / k, grad_sum)
    norm = float(optax.tree.norm(mean))
    norms.append(norm)
    skipped.append(0.0 if np.isfinite(norm) else 1.0)
    if skipped[-1]:
      continue
    if clip:
      mean, _ = optax.clip_by_global_norm(clip).update(mean, None)
    updates, opt_state = opt.update(mean, opt_state, params)
    params = optax.apply_updates(params, updates)
  return params, opt_state, losses, norms, skipped


class FusedStepTest(parameterized.TestCase):
  """The fused step trains as the three-program step did."""

  @parameterized.product(k=(1, 2, 4), clip=(0.0, 0.5), donate=(True, False))
  def test_losses_and_parameters_equal_the_three_program_step(
      self, k, clip, donate
  ):
    # Four steps; the second one's gradients are not finite (skipped).
    # Scaled targets put the gradient norm far above the clip.
    steps = [make_batches(k, seed=s, scale=20.0) for s in range(4)]
    steps[1][k - 1]["x"][0, 0] = np.inf
    params, opt_state, losses, norms, skipped = three_program_steps(
        k, clip, steps
    )
    eng = make_engine(k=k, donate_state=donate, grad_clip_norm=clip)
    got = {"loss": [], "grad_norm": [], "step_skipped": []}
    for batches in steps:
      for b in batches:
        eng.fwd_bwd(b)
      buf = eng.update()
      for name, values in got.items():
        values.extend(buf.scalar_metrics[name])
    self.assertEqual(got["step_skipped"], skipped)
    self.assertEqual(skipped, [0.0, 1.0, 0.0, 0.0])
    self.assertTrue(clip == 0 or min(np.array(norms)[[0, 2, 3]]) > clip)
    np.testing.assert_allclose(got["loss"], losses, rtol=1e-5)
    np.testing.assert_allclose(got["grad_norm"], norms, rtol=1e-5)
    chex.assert_trees_all_close(eng.params, params, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(eng.opt_state, opt_state, rtol=1e-5, atol=1e-6)


class EngineTest(parameterized.TestCase):

  def test_released_buffer_leaves_the_recorder(self):
    eng = make_engine(k=1)
    eng.fwd_bwd(make_batches(1)[0])
    buf = eng.update(release=True)
    self.assertEqual(eng.recorder.get_metrics_history(), [])
    self.assertIn("loss", buf.scalar_metrics)  # The caller's copy stays.

  def test_eval_gives_the_declared_metrics_of_the_eval_fn(self):
    def eval_fn(params, batch):
      err = batch["x"] @ params["w"] + params["b"] - batch["y"]
      return {
          "mse": jnp.mean(err**2),
          "within_one": jnp.mean((jnp.abs(err) < 1.0).astype(jnp.float32)),
      }

    directions = {
        "mse": eval_metrics.Direction.LOWER_IS_BETTER,
        "within_one": eval_metrics.Direction.HIGHER_IS_BETTER,
    }
    batch = make_batches(1)[0]
    engine = make_engine(eval_fn=eval_fn, eval_directions=directions)
    self.assertEqual(engine.eval_directions, directions)
    metrics = engine.eval_step(batch)
    err = batch["x"] @ np.zeros((3, 1), np.float32) - batch["y"]
    np.testing.assert_allclose(metrics["mse"], np.mean(err**2), rtol=1e-6)
    np.testing.assert_allclose(
        metrics["within_one"], np.mean(np.abs(err) < 1.0), rtol=1e-6
    )

  @parameterized.named_parameters(
      ("other_names", lambda p, b: {"mae": 0.0}, ValueError, "returned"),
      ("not_a_dict", lambda p, b: 1.0, ValueError, "returned 1.0"),
      (
          "not_a_scalar",
          lambda p, b: {"mse": b["y"]},
          TypeError,
          "'mse': must be a scalar",
      ),
  )
  def test_eval_fn_output_is_checked(self, eval_fn, error, message):
    engine = make_engine(
        eval_fn=eval_fn,
        eval_directions={"mse": eval_metrics.Direction.LOWER_IS_BETTER},
    )
    with self.assertRaisesRegex(error, message):
      engine.eval_step(make_batches(1)[0])

  def test_eval_fn_comes_with_its_directions(self):
    with self.assertRaisesRegex(ValueError, "given together"):
      make_engine(eval_fn=lambda p, b: {})
    with self.assertRaisesRegex(TypeError, "eval_directions must map"):
      make_engine(eval_fn=lambda p, b: {}, eval_directions={"mse": "lower"})

  @parameterized.named_parameters(("k1", 1), ("k2", 2), ("k3", 3))
  def test_step_metrics_and_parameter_update(self, k):
    # The step's first micro-batch is also its last for K=1; K=3 has one
    # in between.
    eng = make_engine(k=k)
    batches = make_batches(k)
    params0 = jax.tree.map(np.asarray, eng.params)
    for b in batches:
      eng.fwd_bwd(b)
    buf = eng.update()
    self.assertEqual(eng.step, 1)
    self.assertEqual(buf.step, 0)
    expected = {
        "loss",
        "mae",
        "nested/double",
        "extra/e0",
        "extra/e1",
        "learning_rate",
        "grad_norm",
        "step_skipped",
    }
    self.assertEqual(set(buf.scalar_metrics), expected)
    self.assertEqual(set(buf.weighted_metrics), {"sq"})
    for name in expected - {"learning_rate", "grad_norm", "step_skipped"}:
      chex.assert_shape(buf.scalar_metrics[name], (k,))
    chex.assert_shape(buf.weighted_metrics["sq"].unreduced_sum, (k,))
    # Reference: the loss, gradient and Adam step computed directly.
    loss_fn = make_loss_fn()
    losses = [float(loss_fn(params0, b)[0]) for b in batches]
    np.testing.assert_allclose(buf.scalar_metrics["loss"], losses, rtol=1e-5)
    np.testing.assert_allclose(
        buf.scalar_metrics["nested/double"], 2 * np.array(losses), rtol=1e-5
    )
    grads = [
        jax.grad(lambda p, b: loss_fn(p, b)[0])(params0, b) for b in batches
    ]
    mean_grad = jax.tree.map(lambda *g: sum(g) / k, *grads)
    opt = optax.adam(0.05)
    updates, _ = opt.update(mean_grad, opt.init(params0), params0)
    chex.assert_trees_all_close(
        eng.params, optax.apply_updates(params0, updates), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        buf.scalar_metrics["grad_norm"], [optax.tree.norm(mean_grad)], rtol=1e-5
    )
    np.testing.assert_allclose(buf.scalar_metrics["learning_rate"], [0.1])
    np.testing.assert_array_equal(buf.scalar_metrics["step_skipped"], [0.0])
    reduced = mr.reduce_buffer(buf)
    self.assertAlmostEqual(reduced["sq"], np.mean(losses), places=5)

  def test_learning_rate_follows_schedule_and_training_learns(self):
    eng = make_engine()
    probe = make_batches(1, seed=99)[0]
    before = float(eng.eval_step(probe)["loss"])
    for step in range(4):
      for b in make_batches(K, seed=step):
        eng.fwd_bwd(b)
      buf = eng.update()
      np.testing.assert_allclose(
          buf.scalar_metrics["learning_rate"],
          [0.1 * (1 - step / 10)],
          rtol=1e-6,
      )
    self.assertLess(float(eng.eval_step(probe)["loss"]), 0.8 * before)

  @parameterized.named_parameters(("donating", True), ("overlapping", False))
  def test_non_finite_gradients_skip_the_step(self, donate):
    eng = make_engine(donate_state=donate)
    params0 = jax.tree.map(np.asarray, eng.params)
    opt0 = jax.tree.map(np.asarray, eng.opt_state)
    batches = make_batches(K)
    batches[1]["x"][0, 0] = np.inf
    for b in batches:
      eng.fwd_bwd(b)
    buf = eng.update()
    np.testing.assert_array_equal(buf.scalar_metrics["step_skipped"], [1.0])
    self.assertFalse(np.isfinite(buf.scalar_metrics["grad_norm"][0]))
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, eng.params), params0)
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, eng.opt_state), opt0)
    self.assertEqual(eng.step, 1)
    # The accumulator was reset: the next step trains normally.
    for b in make_batches(K, seed=1):
      eng.fwd_bwd(b)
    buf = eng.update()
    np.testing.assert_array_equal(buf.scalar_metrics["step_skipped"], [0.0])
    self.assertTrue(np.isfinite(buf.scalar_metrics["grad_norm"][0]))

  @parameterized.named_parameters(
      ("k1_donating", 1, True),
      ("k3_donating", K, True),
      ("k1_overlapping", 1, False),
      ("k3_overlapping", K, False),
  )
  def test_lost_value_stops_the_step_before_its_update(self, k, donate):
    # The recorder's failure: a value whose device buffer was deleted
    # before the flush. The step's last micro-batch, which would take its
    # update, finds it first: nothing is dispatched, nothing changes.
    eng = make_engine(k=k, donate_state=donate)
    batches = make_batches(k)
    for b in batches[:-1]:
      eng.fwd_bwd(b)
    doomed = jnp.float32(1.0)
    eng.record_metrics("user", {"doomed": doomed})
    doomed.delete()
    params = jax.tree.map(np.asarray, eng.params)
    opt_state = jax.tree.map(np.asarray, eng.opt_state)
    pending = eng.recorder.pending_count()
    with dispatch_counter.count_dispatches() as count:
      with self.assertRaisesRegex(ValueError, "metric 'user/doomed'"):
        eng.fwd_bwd(batches[-1])
      # A retry finds it again.
      with self.assertRaisesRegex(ValueError, "metric 'user/doomed'"):
        eng.fwd_bwd(batches[-1])
    self.assertEqual(count[0], 0)
    self.assertFalse(jax.tree.leaves(eng.params)[0].is_deleted())
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, eng.params), params)
    chex.assert_trees_all_equal(
        jax.tree.map(np.asarray, eng.opt_state), opt_state
    )
    self.assertEqual(eng.step, 0)
    self.assertEqual(eng.micro_batches_done, k - 1)
    self.assertEqual(eng.recorder.pending_count(), pending)
    with self.assertRaisesRegex(ValueError, "after 0 micro-batches|after 2"):
      eng.update()

  def test_donating_step_takes_no_value_after_its_update(self):
    eng = make_engine()
    for b in make_batches(K):
      eng.fwd_bwd(b)
    # The update has taken effect: the step's metrics are settled, and its
    # state is not given out before they are flushed.
    with self.assertRaisesRegex(ValueError, "before the last fwd_bwd"):
      eng.record_metrics("late", 1.0)
    with self.assertRaisesRegex(RuntimeError, "call update\\(\\) first"):
      _ = eng.state
    buf = eng.update()
    self.assertNotIn("late", buf.scalar_metrics)
    self.assertEqual(int(eng.state["step"]), 1)
    eng.record_metrics("next", 1.0)  # The next step's.
    np.testing.assert_array_equal(
        eng.recorder.get_step_metrics(1).scalar_metrics["next"], [1.0]
    )

  @parameterized.named_parameters(("k1", 1), ("k3", K))
  def test_overlapping_update_rolls_back_when_the_flush_fails(self, k):
    # Without donation the old state lives until the flush has decided:
    # any flush failure, even of a value lost after the last micro-batch,
    # leaves it in place.
    eng = make_engine(k=k, donate_state=False)
    params = eng.params
    opt_state = eng.opt_state
    for b in make_batches(k):
      eng.fwd_bwd(b)
    doomed = jnp.float32(1.0)
    eng.record_metrics("user", {"doomed": doomed})
    doomed.delete()
    for _ in range(2):  # A retry fails alike.
      with self.assertRaisesRegex(ValueError, "metric 'user/doomed'"):
        eng.update()
      self.assertIs(eng.params, params)
      self.assertIs(eng.opt_state, opt_state)
      self.assertEqual(eng.step, 0)
      self.assertEqual(eng.micro_batches_done, k)
    self.assertEqual(int(eng.state["step"]), 0)
    # The public readers flush the pending (deleted) value; read it unflushed.
    history = eng.recorder._history  # pylint: disable=protected-access
    self.assertEqual(history[0].scalar_metrics, {})

  def test_default_update_donates_the_state(self):
    eng = make_engine()
    self.assertTrue(eng.donates_state)
    params, opt_state = eng.params, eng.opt_state
    for b in make_batches(K):
      eng.fwd_bwd(b)
    eng.update()
    jax.block_until_ready(eng.params)
    # One copy: the update took the old buffers over.
    self.assertTrue(params["w"].is_deleted())
    self.assertTrue(
        all(
            x.is_deleted()
            for x in jax.tree.leaves(opt_state)
            if isinstance(x, jax.Array)
        )
    )

  def test_overlapping_update_keeps_the_old_state_alive(self):
    eng = make_engine(donate_state=False)
    params = eng.params
    for b in make_batches(K):
      eng.fwd_bwd(b)
    eng.update()
    self.assertFalse(params["w"].is_deleted())

  def test_donating_and_overlapping_updates_train_alike(self):
    results = []
    for donate in (True, False):
      eng = make_engine(donate_state=donate)
      for step in range(3):
        for b in make_batches(K, seed=step):
          eng.fwd_bwd(b)
        eng.update()
      results.append(jax.tree.map(np.asarray, eng.state))
    chex.assert_trees_all_close(results[0], results[1], rtol=1e-6)

  @parameterized.product(k=(1, K), donate=(True, False))
  def test_discarded_update_keeps_the_state(self, k, donate):
    eng = make_engine(k=k, donate_state=donate)
    params0 = jax.tree.map(np.asarray, eng.params)
    opt0 = jax.tree.map(np.asarray, eng.opt_state)
    for b in make_batches(k):
      eng.fwd_bwd(b, discard=True)
    buf = eng.update()
    np.testing.assert_array_equal(buf.scalar_metrics["step_skipped"], [0.0])
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, eng.params), params0)
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, eng.opt_state), opt0)
    self.assertEqual(eng.step, 1)
    # The next, real, update trains.
    for b in make_batches(k):
      eng.fwd_bwd(b)
    eng.update()
    self.assertFalse(np.array_equal(np.asarray(eng.params["w"]), params0["w"]))

  @parameterized.named_parameters(("donating", True), ("overlapping", False))
  def test_abstract_engine_lowers_the_step_without_allocating(self, donate):
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_params()
    )
    eng = engine_lib.Engine(
        make_loss_fn(),
        abstract,
        optax.adam(0.05),
        0.1,
        mr.MetricsRecorder(),
        K,
        donate_state=donate,
    )
    batch = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_batches(1)[0]
    )
    lowered = eng.lower(batch)
    self.assertEqual(list(lowered), ["micro_step"])
    memory = lowered["micro_step"].compile().memory_analysis()
    # The accumulator (float32 like the parameters) is donated and updated
    # in place; so are the parameters and Adam's two moments when donated
    # (the count may stay apart).
    param_bytes = sum(x.size * 4 for x in jax.tree.leaves(abstract))
    if donate:
      self.assertGreaterEqual(memory.alias_size_in_bytes, 4 * param_bytes)
    else:
      self.assertGreaterEqual(memory.alias_size_in_bytes, param_bytes)
      self.assertLess(memory.alias_size_in_bytes, 2 * param_bytes)
    with self.assertRaisesRegex(RuntimeError, "abstract parameters"):
      eng.fwd_bwd(make_batches(1)[0])
    self.assertEqual(
        list(make_engine(k=1).lower(batch)), ["micro_step", "update"]
    )

  def test_micro_batch_count_must_match(self):
    eng = make_engine(k=2)
    b = make_batches(3)
    eng.fwd_bwd(b[0])
    with self.assertRaisesRegex(ValueError, "after 1 micro-batches.*is 2"):
      eng.update()
    eng.fwd_bwd(b[1])
    with self.assertRaisesRegex(ValueError, "called 3 times.*is 2"):
      eng.fwd_bwd(b[2])
    eng.update()

  @parameterized.product(extra=(3, 38), k=(1, 2, 4))
  def test_device_ops_per_micro_batch_and_update_independent_of_m(
      self, extra, k
  ):
    eng = make_engine(make_loss_fn(num_extra=extra), k=k)
    batches = make_batches(k)
    with dispatch_counter.count_dispatches() as count:
      for _ in range(2):  # The first round compiles.
        per_micro = []
        for b in batches:
          before = count[0]
          eng.fwd_bwd(b)
          per_micro.append(count[0] - before)
        before = count[0]
        buf = eng.update()
        per_update = count[0] - before
    # K + 1 with K > 1: the micro-steps (the last one takes the update)
    # and one concatenation for the flush (micro-batch and update
    # metrics), dispatched with the last micro-batch, so that update()
    # launches nothing. With K = 1 the micro-step and the update are two
    # programs, and the flush concatenates the packed array with this
    # loss's weighted metric's values (without one it takes none:
    # test_a_k1_step_is_two_programs).
    self.assertEqual(per_micro, [1] * (k - 1) + [2] if k > 1 else [3])
    self.assertEqual(per_update, 0)
    self.assertLen(buf.scalar_metrics, 6 + extra)

  @parameterized.named_parameters(("k1", 1), ("k2", 2), ("k3", 3), ("k5", 5))
  def test_one_forward_backward_program_whatever_k(self, k):
    compile_counter.install()
    eng = make_engine(k=k)
    start = time.monotonic()
    for step in range(2):
      for b in make_batches(k, seed=step):
        eng.fwd_bwd(b)
      eng.update()
    compiled = compile_counter.backend_compiles_after(start)
    # The recorder's concatenation is shared by every engine of the
    # process, so whether it compiles here depends on the tests before.
    own = sorted(name for name in compiled if "_concat_groups" not in name)
    # K = 1 accumulates nothing: no accumulator to allocate, no flag; its
    # update is a program of its own.
    self.assertEqual(
        own,
        ["jit(single_micro_step)", "jit(update)"]
        if k == 1
        else ["jit(allocate)", "jit(micro_step)"],
    )

  def test_metric_names_follow_the_program_that_ran(self):
    # The aux metrics' names depend on the micro-batch's shape; a program
    # found compiled (the third micro-batch) returns its names as surely as
    # one traced on the spot.
    def loss_fn(params, batch):
      loss = jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
      return loss, {f"rows{batch['x'].shape[0]}": loss}

    eng = make_engine(loss_fn)
    small, large = make_batches(1)[0], make_batches(1, seed=1)[0]
    large = jax.tree.map(lambda x: np.concatenate([x, x]), large)
    for b in (small, large, small):
      eng.fwd_bwd(b)
    buf = eng.update()
    self.assertLen(buf.scalar_metrics["loss"], 3)
    self.assertLen(buf.scalar_metrics["rows4"], 2)
    self.assertLen(buf.scalar_metrics["rows8"], 1)
    np.testing.assert_allclose(
        buf.scalar_metrics["rows4"], buf.scalar_metrics["loss"][[0, 2]]
    )

  def test_summed_metric_is_the_sum_over_micro_batches(self):
    def loss_fn(params, batch):
      loss = jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
      count = jnp.sum(batch["x"] > 0).astype(jnp.float32)
      return loss, {"moe": {"count": mr.SummedMetric(count)}, "mean": count}

    eng = make_engine(loss_fn)
    batches = make_batches(K)
    counts = [float(np.sum(b["x"] > 0)) for b in batches]
    eng.record_metrics("user", {"n": mr.SummedMetric(2.0)})
    for b in batches:
      eng.fwd_bwd(b)
      if b is batches[0]:
        eng.record_metrics("user", {"n": mr.SummedMetric(3.0)})
    buf = eng.update()
    # Each micro-batch's own value is buffered; the step's value is their
    # sum, with no knowledge of K on either side.
    np.testing.assert_array_equal(buf.scalar_metrics["moe/count"], counts)
    reduced = mr.reduce_buffer(buf)
    self.assertEqual(reduced["moe/count"], sum(counts))
    self.assertAlmostEqual(reduced["mean"], np.mean(counts), places=5)
    self.assertEqual(reduced["user/n"], 5.0)

  def test_summed_metric_of_a_weighted_one_is_refused(self):
    def loss_fn(params, batch):
      loss = jnp.mean(batch["x"] @ params["w"])
      return loss, {"bad": mr.SummedMetric(mr.WeightedMetric(loss, 1.0))}

    eng = make_engine(loss_fn)
    with self.assertRaisesRegex(TypeError, "metric 'bad'.*one scalar"):
      eng.fwd_bwd(make_batches(1)[0])

  @parameterized.named_parameters(("k1", 1), ("k3", K))
  def test_the_last_micro_step_takes_the_update(self, k):
    # The step's programs: K micro-steps, the last of which updates, then
    # the flush's concatenation; no program between them reads a gradient.
    # With K = 1 the update follows the micro-step as a program of its own.
    eng = make_engine(make_loss_fn(num_extra=0), k=k)
    batches = make_batches(k)
    for _ in range(2):  # The first round compiles.
      with dispatch_counter.record_launches() as launches:
        for b in batches:
          eng.fwd_bwd(b)
        eng.update()
    self.assertEqual(
        launches,
        (
            ["jit(micro_step)"] * k
            if k > 1
            else ["jit(single_micro_step)", "jit(update)"]
        )
        + ["jit(_concat_groups)"],
    )

  def test_a_k1_step_is_two_programs(self):
    # With K = 1 and no weighted metrics (the built-in losses have none)
    # the update returns the micro-batch's metrics and its own as one
    # array, which the flush fetches with no device op: K + 1 = 2.
    def loss_fn(params, batch):
      err = batch["x"] @ params["w"] + params["b"] - batch["y"]
      loss = jnp.mean(err**2)
      return loss, {"mae": jnp.mean(jnp.abs(err))}

    eng = make_engine(loss_fn, k=1)
    batch = make_batches(1)[0]
    for _ in range(2):  # The first round compiles.
      with dispatch_counter.record_launches() as launches:
        eng.fwd_bwd(batch)
        buf = eng.update()
    self.assertEqual(launches, ["jit(single_micro_step)", "jit(update)"])
    self.assertEqual(
        sorted(buf.scalar_metrics),
        sorted(("loss", "mae") + metric_packing.UPDATE_NAMES),
    )
    # The update's values under its names.
    reduced = mr.reduce_buffer(buf)
    self.assertGreater(reduced["grad_norm"], 0.0)
    self.assertEqual(reduced["step_skipped"], 0.0)

  def test_eval_step_defaults_to_the_loss(self):
    eng = make_engine()
    self.assertEqual(
        eng.eval_directions, {"loss": eval_metrics.Direction.LOWER_IS_BETTER}
    )
    batch = make_batches(1)[0]
    metrics = eng.eval_step(batch)
    self.assertEqual(set(metrics), {"loss"})
    chex.assert_shape(metrics["loss"], ())
    np.testing.assert_allclose(
        metrics["loss"], make_loss_fn()(eng.params, batch)[0], rtol=1e-6
    )
    self.assertEqual(eng.recorder.pending_count(), 0)

  def test_state_round_trip(self):
    eng = make_engine()
    for b in make_batches(K):
      eng.fwd_bwd(b)
    eng.update()
    saved = jax.tree.map(np.asarray, eng.state)
    other = make_engine()
    other.set_state(saved)
    self.assertEqual(other.step, 1)
    chex.assert_trees_all_equal(
        jax.tree.map(np.asarray, other.params), saved["params"]
    )
    other.fwd_bwd(make_batches(1)[0])
    with self.assertRaisesRegex(ValueError, "middle of step 1"):
      other.set_state(saved)
    with self.assertRaisesRegex(ValueError, "structure"):
      make_engine().set_state({**saved, "params": {"w": saved["params"]["w"]}})

  def test_explicit_shardings_match_plain_jit(self):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    sharded = make_engine(
        param_shardings=jax.tree.map(lambda _: rep, make_params()),
        batch_sharding=data,
    )
    plain = make_engine()
    for eng in (sharded, plain):
      for b in make_batches(K):
        eng.fwd_bwd(b)
      eng.update()
    chex.assert_trees_all_close(sharded.params, plain.params, rtol=1e-6)
    self.assertEqual(sharded.params["w"].sharding, rep)

  def test_close_cleans_up(self):
    eng = make_engine()
    eng.fwd_bwd(make_batches(1)[0])
    eng.close()
    self.assertEqual(eng.recorder.pending_count(), 0)
    self.assertEqual(eng.recorder.get_metrics_history(), [])

  def test_bad_aux_metric_is_named(self):
    def loss_fn(params, batch):
      loss = jnp.mean(batch["x"] @ params["w"])
      return loss, {"vec": jnp.ones(2)}

    eng = make_engine(loss_fn)
    with self.assertRaisesRegex(ValueError, "metric 'vec'.*shape"):
      eng.fwd_bwd(make_batches(1)[0])

  @parameterized.named_parameters(
      ("boolean", lambda x: x > 0, TypeError, "boolean dtype"),
      ("complex", lambda x: x + 1j, TypeError, "complex dtype"),
      ("vector", lambda x: jnp.stack([x, x]), ValueError, r"must have shape"),
  )
  def test_packed_and_per_name_paths_refuse_a_value_alike(
      self, make_value, error, words
  ):
    # One check (maxtext.metrics.values) for both ways into the recorder:
    # the packing inside the traced micro-step and record_metrics.
    def loss_fn(params, batch):
      loss = jnp.mean(batch["x"] @ params["w"])
      return loss, {"bad": make_value(loss)}

    eng = make_engine(loss_fn)
    with self.assertRaisesRegex(error, "metric 'bad': value " + words) as e:
      eng.fwd_bwd(make_batches(1)[0])
    packed = str(e.exception)
    with self.assertRaises(error) as e:
      eng.record_metrics("bad", make_value(jnp.float32(1.0)))
    per_name = str(e.exception)
    # The same words up to the value's description (a tracer in the step).
    self.assertEqual(
        packed.split("; got", maxsplit=1)[0],
        per_name.split("; got", maxsplit=1)[0],
    )
    self.assertEqual(eng.recorder.pending_count(), 0)

  @parameterized.named_parameters(("clipped", 0.5), ("not_reached", 1e6))
  def test_grad_clip_norm_matches_optax_clipping(self, clip):
    # The engine's clipping (with the norm its update took)
    # and optax's clip_by_global_norm give the same step. Scaled targets make
    # the gradient norm far above 0.5.
    def run(optimizer, **kwargs):
      eng = engine_lib.Engine(
          make_loss_fn(),
          make_params(),
          optimizer,
          0.1,
          mr.MetricsRecorder(),
          K,
          **kwargs,
      )
      for b in make_batches(K, scale=20.0):
        eng.fwd_bwd(b)
      buf = eng.update()
      return eng.params, float(buf.scalar_metrics["grad_norm"][0])

    by_optax, norm = run(
        optax.chain(optax.clip_by_global_norm(clip), optax.sgd(0.1))
    )
    by_engine, _ = run(
        optax.chain(optax.identity(), optax.sgd(0.1)), grad_clip_norm=clip
    )
    unclipped, _ = run(optax.sgd(0.1))
    self.assertGreater(norm, 0.5)
    chex.assert_trees_all_close(by_engine, by_optax, rtol=1e-6)
    if clip < norm:
      self.assertGreater(
          float(jnp.max(jnp.abs(unclipped["w"] - by_engine["w"]))), 0.1
      )
    else:
      chex.assert_trees_all_close(by_engine, unclipped, rtol=1e-6)

  @parameterized.named_parameters(
      ("k0", dict(k=0), ValueError, "gradient_accumulation_steps"),
      ("one_sharding", dict(batch_sharding=object()), ValueError, "together"),
      (
          "negative_clip",
          dict(grad_clip_norm=-1.0),
          ValueError,
          "grad_clip_norm",
      ),
      (
          "infinite_clip",
          dict(grad_clip_norm=float("inf")),
          ValueError,
          "grad_clip_norm",
      ),
      ("bool_clip", dict(grad_clip_norm=True), ValueError, "grad_clip_norm"),
      ("int_donate", dict(donate_state=1), TypeError, "donate_state"),
  )
  def test_bad_arguments(self, kwargs, exc, pattern):
    with self.assertRaisesRegex(exc, pattern):
      make_engine(**kwargs)

  def test_bad_optimizer_and_recorder(self):
    with self.assertRaisesRegex(TypeError, "optimizer"):
      engine_lib.Engine(
          make_loss_fn(), make_params(), "adam", 0.1, mr.MetricsRecorder(), 1
      )
    with self.assertRaisesRegex(TypeError, "recorder"):
      engine_lib.Engine(
          make_loss_fn(), make_params(), optax.sgd(0.1), 0.1, None, 1
      )


def statistic_loss_fn(scale=1.0):
  """make_loss_fn's loss, plus a parameter "c" that no gradient reaches:
  its statistic is the micro-batch's mean input row (times `scale`)."""
  base = make_loss_fn()

  def loss_fn(params, batch):
    loss, aux = base({"w": params["w"], "b": params["b"]}, batch)
    aux[param_statistics.KEY] = {"c": scale * jnp.mean(batch["x"], axis=0)}
    return loss, aux

  return loss_fn


def add_half(param, statistic):
  """A statistic rule: the parameter moves by half the step's statistic."""
  return param + 0.5 * statistic


class StatisticRulesTest(parameterized.TestCase):

  def _engines(self, k, **kwargs):
    """An engine with the statistic-moved "c", and one without it."""
    with_c = engine_lib.Engine(
        statistic_loss_fn(kwargs.pop("scale", 1.0)),
        make_params() | {"c": jnp.ones((3,), jnp.float32)},
        optax.adam(0.05),
        0.1,
        mr.MetricsRecorder(),
        k,
        statistic_rules={"c": add_half},
        **kwargs,
    )
    without = engine_lib.Engine(
        make_loss_fn(),
        make_params(),
        optax.adam(0.05),
        0.1,
        mr.MetricsRecorder(),
        k,
        **kwargs,
    )
    return with_c, without

  @parameterized.product(k=(1, 3), donate=(True, False), clip=(0.0, 0.01))
  def test_rule_moves_the_parameter_by_the_steps_mean_statistic(
      self, k, donate, clip
  ):
    with_c, without = self._engines(k, donate_state=donate, grad_clip_norm=clip)
    expected_c = np.ones(3, np.float32)
    for step in range(2):
      batches = make_batches(k, seed=step)
      for b in batches:
        with_c.fwd_bwd(b)
        without.fwd_bwd(b)
      got, want = with_c.update(), without.update()
      mean_row = np.mean([np.mean(b["x"], axis=0) for b in batches], axis=0)
      expected_c = expected_c + 0.5 * mean_row
      # The statistic moved "c" by its rule (not clipped, no optimizer);
      # the gradients, their norm and the optimizer's step are those of
      # an engine without "c".
      np.testing.assert_allclose(with_c.params["c"], expected_c, rtol=1e-6)
      for name in ("w", "b"):
        np.testing.assert_allclose(
            with_c.params[name], without.params[name], rtol=1e-6
        )
      for name in ("grad_norm", "loss", "step_skipped"):
        np.testing.assert_allclose(
            got.scalar_metrics[name], want.scalar_metrics[name], rtol=1e-6
        )
      self.assertNotIn(param_statistics.KEY, got.scalar_metrics)
    # Adam's moments of "c" saw zero gradients only.
    mu = with_c.opt_state[0].mu["c"]
    np.testing.assert_array_equal(mu, np.zeros(3, np.float32))

  def test_skipped_step_moves_nothing(self):
    with_c, _ = self._engines(2)
    before = np.asarray(with_c.params["c"])
    batches = make_batches(2)
    batches[1]["y"] = batches[1]["y"] * np.nan
    for b in batches:
      with_c.fwd_bwd(b)
    buf = with_c.update()
    self.assertEqual(float(buf.scalar_metrics["step_skipped"][0]), 1.0)
    np.testing.assert_array_equal(with_c.params["c"], before)

  def test_no_extra_dispatch(self):
    with_c, without = self._engines(2)
    counts = []
    for eng in (with_c, without):
      for b in make_batches(2):  # compile first
        eng.fwd_bwd(b)
      eng.update()
      with dispatch_counter.count_dispatches() as count:
        for b in make_batches(2, seed=1):
          eng.fwd_bwd(b)
        eng.update()
      counts.append(count[0])
    self.assertGreater(counts[0], 0)
    self.assertEqual(counts[0], counts[1])

  def test_statistics_must_match_the_rules(self):
    eng = engine_lib.Engine(
        make_loss_fn(),
        make_params() | {"c": jnp.ones((3,))},
        optax.sgd(0.1),
        0.1,
        mr.MetricsRecorder(),
        1,
        statistic_rules={"c": add_half},
    )
    with self.assertRaisesRegex(ValueError, r"aux\['param_statistics'\]"):
      eng.fwd_bwd(make_batches(1)[0])
    unruled = engine_lib.Engine(
        statistic_loss_fn(),
        make_params() | {"c": jnp.ones((3,))},
        optax.sgd(0.1),
        0.1,
        mr.MetricsRecorder(),
        1,
    )
    with self.assertRaisesRegex(ValueError, "statistic rules for \\[\\]"):
      unruled.fwd_bwd(make_batches(1)[0])
    wrong_shape = engine_lib.Engine(
        statistic_loss_fn(),
        make_params() | {"c": jnp.ones((4,))},
        optax.sgd(0.1),
        0.1,
        mr.MetricsRecorder(),
        1,
        statistic_rules={"c": add_half},
    )
    with self.assertRaisesRegex(ValueError, "statistic 'c': shape"):
      wrong_shape.fwd_bwd(make_batches(1)[0])

  def test_rules_name_parameters(self):
    with self.assertRaisesRegex(ValueError, "statistic_rules\\['d'\\]"):
      make_engine(statistic_rules={"d": add_half})
    with self.assertRaisesRegex(TypeError, "not callable"):
      make_engine(statistic_rules={"b": 1.0})


def bf16_loss_fn(params, batch):
  """`make_loss_fn`'s regression with "w" read through one bfloat16 cast,
  as the model reads its layers' matrices: its gradient is that cast's
  bfloat16 cotangent."""
  x = batch["x"].astype(jnp.bfloat16)
  pred = (x @ params["w"].astype(jnp.bfloat16)).astype(jnp.float32)
  loss = jnp.mean((pred + params["b"] - batch["y"]) ** 2)
  return loss, {}


def w_in_bfloat16(params):
  return {**params, "w": params["w"].astype(jnp.bfloat16)}


class ComputeCopyTest(parameterized.TestCase):
  """A loss differentiated in a compute copy trains as the parameters do,
  its narrower gradients leaving the K = 1 micro-step in their dtype (the
  model's gradients equal: `maxtext/model/gradient_copy_test.py`)."""

  @parameterized.product(k=(1, 3), clip=(0.0, 0.5))
  def test_same_steps_as_the_parameters(self, k, clip):
    trained = {}
    for copy in (None, w_in_bfloat16):
      eng = make_engine(
          bf16_loss_fn, k=k, grad_clip_norm=clip, compute_copy=copy
      )
      for i, batch in enumerate(make_batches(4 * k, seed=3)):
        eng.fwd_bwd(batch)
        if (i + 1) % k == 0:
          eng.update()
      trained[copy] = jax.device_get(eng.params)
    # The optimizer sees the same gradients; its arithmetic, fused with a
    # widening of "w"'s gradient, may round an update differently in the
    # last bit.
    chex.assert_trees_all_close(
        trained[None], trained[w_in_bfloat16], rtol=1e-6, atol=0
    )
    self.assertEqual(trained[w_in_bfloat16]["w"].dtype, np.float32)

  def test_k1_gradients_leave_in_the_copys_dtype(self):
    batch = make_batches(1)[0]

    def engine(copy, executables=None):
      return make_engine(
          bf16_loss_fn, k=1, compute_copy=copy, executables=executables
      )

    outputs = {}
    for copy in (None, w_in_bfloat16):
      grads = engine(copy).lower(batch)["micro_step"].out_info[0]
      outputs[copy] = {name: g.dtype for name, g in grads.items()}
    self.assertEqual(outputs[None], {"w": jnp.float32, "b": jnp.float32})
    self.assertEqual(
        outputs[w_in_bfloat16], {"w": jnp.bfloat16, "b": jnp.float32}
    )
    # The update compiled ahead of time takes those gradients.
    compiled = {
        name: lowered.compile()
        for name, lowered in engine(w_in_bfloat16)
        .lower_programs(batch, batch)
        .items()
    }
    given, own = engine(w_in_bfloat16, compiled), engine(w_in_bfloat16)
    for eng in (given, own):
      eng.fwd_bwd(batch)
      eng.update()
    chex.assert_trees_all_equal(given.params, own.params)

  def test_a_copy_that_is_not_callable_is_refused(self):
    with self.assertRaisesRegex(TypeError, "compute_copy must be callable"):
      make_engine(k=1, compute_copy="bf16")


class ExecutablesTest(parameterized.TestCase):
  """An engine given its programs compiled runs them and compiles none."""

  @parameterized.product(k=(1, 3), donate=(True, False))
  def test_runs_the_given_programs_as_its_own(self, k, donate):
    batches = make_batches(2 * k + k)
    # The last step's gradients are NaN: skipped, it changes nothing.
    nan = dict(batches[-1], y=np.full_like(batches[-1]["y"], np.nan))
    batches[-1] = nan
    compiled = {
        name: lowered.compile()
        for name, lowered in make_engine(k=k, donate_state=donate)
        .lower_programs(batches[0], batches[0])
        .items()
    }
    self.assertEqual(
        list(compiled),
        ["allocate", "micro_step", "eval"]
        if k > 1
        else ["micro_step", "update", "eval"],
    )
    own = make_engine(k=k, donate_state=donate)
    given = make_engine(k=k, donate_state=donate, executables=compiled)
    compile_counter.install()
    began = time.monotonic()
    given_metrics = []
    for step in range(3):
      for micro in batches[step * k : (step + 1) * k]:
        given.fwd_bwd(micro)
      given_metrics.append(given.update().scalar_metrics)
    given_eval = given.eval_step(batches[0])
    jax.block_until_ready(given.params)
    # Only the recorder's concatenation (not the engine's) may compile.
    self.assertContainsSubset(
        compile_counter.backend_compiles_after(began), ["jit(_concat_groups)"]
    )
    own_metrics = []
    for step in range(3):
      for micro in batches[step * k : (step + 1) * k]:
        own.fwd_bwd(micro)
      own_metrics.append(own.update().scalar_metrics)
    self.assertEqual(given_metrics[-1]["step_skipped"][-1], 1.0)
    for mine, theirs in zip(given_metrics, own_metrics):
      self.assertEqual(sorted(mine), sorted(theirs))
      for name, values in mine.items():
        np.testing.assert_array_equal(values, theirs[name])
    chex.assert_trees_all_equal(given.params, own.params)
    chex.assert_trees_all_equal(given.opt_state, own.opt_state)
    chex.assert_trees_all_equal(given_eval, own.eval_step(batches[0]))

  def test_programs_must_be_all_of_the_engines(self):
    compiled = {
        name: lowered.compile()
        for name, lowered in make_engine(k=1)
        .lower_programs(make_batches(1)[0], make_batches(1)[0])
        .items()
    }
    del compiled["eval"]
    with self.assertRaisesRegex(ValueError, "must name the programs"):
      make_engine(k=1, executables=compiled)


if __name__ == "__main__":
  absltest.main()
