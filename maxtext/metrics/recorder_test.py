"""Tests for maxtext.metrics.recorder."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.metrics import recorder as mr
from testing import dispatch_counter


class WeightedMetricTest(parameterized.TestCase):

  def test_compute_numpy(self):
    wm = mr.WeightedMetric(np.array([6.0, 1.0, 0.0]), np.array([3.0, 0.0, 0.0]))
    np.testing.assert_allclose(wm.compute(), [2.0, 0.0, 0.0])

  def test_compute_jax_zero_denominator_under_jit(self):
    out = jax.jit(lambda s, d: mr.WeightedMetric(s, d).compute())(
        jnp.float32(5.0), jnp.float32(0.0)
    )
    self.assertEqual(float(out), 0.0)
    self.assertTrue(np.isfinite(float(out)))

  def test_is_a_pytree(self):
    wm = mr.WeightedMetric(jnp.ones(()), jnp.full((), 2.0))
    doubled = jax.tree.map(lambda x: x * 2, wm)
    self.assertIsInstance(doubled, mr.WeightedMetric)
    self.assertLen(jax.tree_util.tree_leaves(wm), 2)
    self.assertNotIsInstance(wm, tuple)


class BufferingTest(parameterized.TestCase):

  def test_values_stay_in_python_lists_until_flush(self):
    # The test looks into the recorder's buffers, which have no public view.
    # pylint: disable=protected-access
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "loss", 1.0)
    rec.buffer_metrics(0, "loss", np.float32(2.0))
    buf = rec._history[-1]
    pending = rec._pending[buf]
    self.assertIsInstance(pending.records, list)
    self.assertEqual(buf.scalar_metrics, {})
    self.assertEqual(rec.pending_count(), 2)
    rec.flush()
    self.assertEqual(rec.pending_count(), 0)
    np.testing.assert_array_equal(buf.scalar_metrics["loss"], [1.0, 2.0])

  def test_no_device_op_and_no_transfer_while_buffering(self):
    rec = mr.MetricsRecorder()
    dev = [jnp.float32(i) for i in range(4)]
    packed = [jnp.arange(3, dtype=jnp.float32) + i for i in range(4)]
    wsum, wden = jnp.float32(3.0), jnp.int32(2)
    bad_values = (jnp.ones((2,)), jnp.array(True))
    with (
        dispatch_counter.count_dispatches() as count,
        jax.transfer_guard("disallow"),
    ):
      for i in range(4):
        rec.buffer_metrics(0, "loss", dev[i])
        rec.buffer_metrics(0, "host", float(i))
        rec.buffer_metrics(0, "np", np.float32(i))
        rec.buffer_metrics(0, "w", mr.WeightedMetric(wsum, wden))
        rec.buffer_packed(0, ("a", "b", "c"), packed[i])
      for bad in bad_values:
        with self.assertRaises((TypeError, ValueError)):
          rec.buffer_metrics(0, "bad", bad)
    self.assertEqual(count[0], 0)
    self.assertEqual(rec.pending_count(), 4 * (4 + 3))

  def test_new_buffer_whenever_step_changes(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(1, "x", 1.0)
    rec.buffer_metrics(2, "x", 2.0)
    rec.buffer_metrics(1, "x", 3.0)
    history = rec.get_metrics_history()
    self.assertEqual([b.step for b in history], [1, 2, 1])
    np.testing.assert_array_equal(history[0].scalar_metrics["x"], [1.0])
    np.testing.assert_array_equal(history[2].scalar_metrics["x"], [3.0])
    self.assertIs(rec.get_step_metrics(1), history[2])
    self.assertIsNone(rec.get_step_metrics(7))

  def test_two_buffers_of_same_step_kept_apart_across_flushes(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(5, "x", jnp.float32(1.0))
    rec.flush()
    first = rec.get_step_metrics(5)
    rec.buffer_metrics(6, "x", 0.0)
    rec.buffer_metrics(5, "x", jnp.float32(2.0))
    self.assertEqual(first.pending_count, 0)
    rec.flush()
    second = rec.get_step_metrics(5)
    self.assertIsNot(first, second)
    np.testing.assert_array_equal(first.scalar_metrics["x"], [1.0])
    np.testing.assert_array_equal(second.scalar_metrics["x"], [2.0])

  def test_kind_switch_across_buffers_is_allowed(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "m", 1.0)
    rec.buffer_metrics(1, "m", mr.WeightedMetric(1.0, 2.0))
    rec.flush()
    self.assertIn("m", rec.get_step_metrics(1).weighted_metrics)


class ValidationTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("str", "1.0", TypeError, "must be a Python int/float"),
      ("none", None, TypeError, "must be a Python int/float"),
      ("dict", {"a": 1.0}, TypeError, "must be a Python int/float"),
      ("list", [1.0], TypeError, "must be a Python int/float"),
      ("tuple", (1.0,), TypeError, "must be a Python int/float"),
      ("object", object(), TypeError, "must be a Python int/float"),
      ("object_array", np.array([1.0], dtype=object), TypeError, "not numeric"),
      ("string_array", np.array(["a"]), TypeError, "not numeric"),
      ("np_vector", np.ones(3), ValueError, r"shape \(\) or \(1,\)"),
      ("np_matrix", np.ones((1, 1)), ValueError, r"shape \(\) or \(1,\)"),
      ("py_bool", True, TypeError, "boolean"),
      ("np_bool", np.bool_(False), TypeError, "boolean"),
      ("bool_array", np.array([True]), TypeError, "boolean"),
      ("py_complex", 1 + 2j, TypeError, "complex"),
      ("np_complex", np.complex64(1j), TypeError, "complex"),
      ("huge_int", 2**70, ValueError, "int64"),
  )
  def test_bad_host_metric(self, value, exc, pattern):
    rec = mr.MetricsRecorder()
    with self.assertRaisesRegex(exc, "metric 'my/metric'.*" + pattern):
      rec.buffer_metrics(3, "my/metric", value)
    self.assertEqual(rec.pending_count(), 0)
    self.assertEqual(rec.get_metrics_history(), [])

  @parameterized.named_parameters(
      ("vector", lambda: jnp.ones((2,)), ValueError, r"shape \(\) or \(1,\)"),
      ("bool", lambda: jnp.array(True), TypeError, "boolean"),
      ("complex", lambda: jnp.array(1j, jnp.complex64), TypeError, "complex"),
      ("prng_key", lambda: jax.random.key(0), TypeError, "not numeric"),
  )
  def test_bad_device_metric_without_transfer(self, make, exc, pattern):
    value = make()
    rec = mr.MetricsRecorder()
    with jax.transfer_guard("disallow"):
      with self.assertRaisesRegex(
          exc, "metric 'm'.*" + pattern + ".*got jax.Array"
      ):
        rec.buffer_metrics(0, "m", value)
    self.assertEqual(rec.pending_count(), 0)

  def test_deleted_device_value_rejected_at_buffering(self):
    value = jnp.float32(1.0)
    value.delete()
    with self.assertRaisesRegex(ValueError, "metric 'm'.*deleted"):
      mr.MetricsRecorder().buffer_metrics(0, "m", value)

  def test_tracer_rejected(self):
    rec = mr.MetricsRecorder()

    def f(x):
      rec.buffer_metrics(0, "m", x)
      return x

    with self.assertRaisesRegex(TypeError, "metric 'm'.*traced value"):
      jax.jit(f)(1.0)
    self.assertEqual(rec.pending_count(), 0)

  @parameterized.named_parameters(
      ("negative", -1, ValueError),
      ("float", 1.0, TypeError),
      ("bool", True, TypeError),
      ("str", "1", TypeError),
      ("jax", jnp.int32(1), TypeError),
  )
  def test_bad_step(self, step, exc):
    with self.assertRaisesRegex(exc, "step must be a non-negative int"):
      mr.MetricsRecorder().buffer_metrics(step, "m", 1.0)

  @parameterized.named_parameters(
      ("empty", "", ValueError),
      ("int", 3, TypeError),
      ("none", None, TypeError),
  )
  def test_bad_name(self, name, exc):
    with self.assertRaisesRegex(exc, "name must be a non-empty str"):
      mr.MetricsRecorder().buffer_metrics(0, name, 1.0)

  def test_bad_aggregation_fn(self):
    rec = mr.MetricsRecorder()
    with self.assertRaisesRegex(
        TypeError, "metric 'm': aggregation_fn must be None"
    ):
      rec.buffer_metrics(0, "m", 1.0, aggregation_fn="max")
    rec.buffer_metrics(0, "m", 1.0, aggregation_fn=np.max)
    with self.assertRaisesRegex(ValueError, "metric 'm': aggregation_fn"):
      rec.buffer_metrics(0, "m", 2.0, aggregation_fn=np.min)
    rec.buffer_metrics(0, "m", 2.0)  # None keeps the registered function.
    self.assertEqual(rec.pending_count(), 2)

  def test_switch_between_scalar_and_weighted_in_a_buffer(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "m", 1.0)
    with self.assertRaisesRegex(ValueError, "metric 'm': is scalar"):
      rec.buffer_metrics(0, "m", mr.WeightedMetric(1.0, 1.0))
    rec.buffer_metrics(0, "w", mr.WeightedMetric(1.0, 1.0))
    with self.assertRaisesRegex(ValueError, "metric 'w': is weighted"):
      rec.buffer_metrics(0, "w", 1.0)
    with self.assertRaisesRegex(ValueError, "metric 'w': is weighted"):
      rec.buffer_packed(0, ("x", "w"), np.zeros(2, np.float32))
    self.assertEqual(rec.pending_count(), 2)

  def test_bad_weighted_part(self):
    rec = mr.MetricsRecorder()
    with self.assertRaisesRegex(
        TypeError, "metric 'w': denominator is a boolean"
    ):
      rec.buffer_metrics(0, "w", mr.WeightedMetric(1.0, True))
    with self.assertRaisesRegex(
        ValueError, "metric 'w': unreduced_sum must have shape"
    ):
      rec.buffer_metrics(0, "w", mr.WeightedMetric(np.ones(2), 1.0))
    self.assertEqual(rec.pending_count(), 0)

  @parameterized.named_parameters(
      ("list_names", ["a"], np.zeros(1, np.float32), TypeError, "tuple"),
      ("empty_names", (), np.zeros(0, np.float32), ValueError, "empty"),
      (
          "dup_names",
          ("a", "a"),
          np.zeros(2, np.float32),
          ValueError,
          "distinct",
      ),
      (
          "bad_name",
          ("a", ""),
          np.zeros(2, np.float32),
          ValueError,
          "non-empty str",
      ),
      (
          "wrong_shape",
          ("a", "b"),
          np.zeros(3, np.float32),
          ValueError,
          r"shape \(2,\)",
      ),
      ("bool", ("a",), np.zeros(1, bool), TypeError, "boolean"),
      ("list_value", ("a",), [1.0], TypeError, "JAX or NumPy array"),
  )
  def test_bad_packed(self, names, packed, exc, pattern):
    rec = mr.MetricsRecorder()
    with self.assertRaisesRegex(exc, pattern):
      rec.buffer_packed(0, names, packed)
    self.assertEqual(rec.pending_count(), 0)
    self.assertEqual(rec.get_metrics_history(), [])

  def test_nan_and_inf_are_data(self):
    rec = mr.MetricsRecorder()
    for v in (float("nan"), float("inf"), jnp.float32(-np.inf)):
      rec.buffer_metrics(0, "m", v)
    rec.flush()
    values = rec.get_step_metrics(0).scalar_metrics["m"]
    self.assertTrue(np.isnan(values[0]))
    np.testing.assert_array_equal(values[1:], [np.inf, -np.inf])

  def test_host_numpy_value_is_copied(self):
    rec = mr.MetricsRecorder()
    value = np.array([1.0], np.float32)
    rec.buffer_metrics(0, "m", value)
    value[0] = 9.0
    rec.flush()
    np.testing.assert_array_equal(
        rec.get_step_metrics(0).scalar_metrics["m"], [1.0]
    )


class FlushTest(parameterized.TestCase):

  @parameterized.named_parameters(("k1", 1), ("k2", 2), ("k5", 5))
  def test_layout_for_k_micro_batches(self, k):
    rec = mr.MetricsRecorder()
    for i in range(k):
      rec.buffer_metrics(0, "loss", jnp.float32(i))
      rec.buffer_metrics(0, "count", np.array([i], np.int32))
      rec.buffer_metrics(0, "w", mr.WeightedMetric(jnp.float32(i), 2))
      rec.buffer_packed(0, ("a", "b"), jnp.array([i, -i], jnp.float32))
    rec.flush()
    buf = rec.get_step_metrics(0)
    for name in ("loss", "count", "a", "b"):
      chex.assert_shape(buf.scalar_metrics[name], (k,))
      self.assertIsInstance(buf.scalar_metrics[name], np.ndarray)
    np.testing.assert_array_equal(buf.scalar_metrics["loss"], np.arange(k))
    self.assertEqual(buf.scalar_metrics["loss"].dtype, np.float32)
    self.assertEqual(buf.scalar_metrics["count"].dtype, np.int32)
    np.testing.assert_array_equal(buf.scalar_metrics["b"], -np.arange(k))
    wm = buf.weighted_metrics["w"]
    chex.assert_shape([wm.unreduced_sum, wm.denominator], (k,))
    np.testing.assert_array_equal(wm.denominator, np.full(k, 2))

  def test_more_micro_batches_after_a_mid_step_flush(self):
    rec = mr.MetricsRecorder()
    for i in range(2):
      rec.buffer_metrics(0, "loss", jnp.float32(i))
      rec.buffer_packed(0, ("a",), jnp.array([10.0 * i]))
    rec.flush()
    buf = rec.get_step_metrics(0)
    for i in range(2, 5):
      rec.buffer_metrics(0, "loss", float(i))
      rec.buffer_packed(0, ("a",), jnp.array([10.0 * i]))
    self.assertEqual(rec.pending_count(), 6)
    rec.flush()
    self.assertIs(rec.get_step_metrics(0), buf)
    np.testing.assert_array_equal(buf.scalar_metrics["loss"], np.arange(5))
    np.testing.assert_array_equal(buf.scalar_metrics["a"], 10.0 * np.arange(5))

  def test_per_name_and_packed_keep_buffering_order(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "a", 1.0)
    rec.buffer_packed(0, ("a", "b"), jnp.array([2.0, 20.0]))
    rec.buffer_packed(0, ("a", "b"), jnp.array([3.0, 30.0]))
    rec.buffer_metrics(0, "a", jnp.float32(4.0))
    rec.buffer_packed(0, ("a", "b"), np.array([5.0, 50.0]))
    rec.flush()
    buf = rec.get_step_metrics(0)
    np.testing.assert_array_equal(buf.scalar_metrics["a"], [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(buf.scalar_metrics["b"], [20, 30, 50])

  def test_mixed_dtypes_promote(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "m", 1)
    rec.buffer_metrics(0, "m", jnp.bfloat16(2.5))
    rec.flush()
    values = rec.get_step_metrics(0).scalar_metrics["m"]
    np.testing.assert_array_equal(values, [1.0, 2.5])
    self.assertTrue(np.issubdtype(values.dtype, np.floating))

  @parameterized.named_parameters(
      ("k4_m3", 4, 3), ("k16_m12", 16, 12), ("k64_m300", 64, 300)
  )
  def test_packed_flush_is_one_launch_for_any_m_and_k(self, k, m):
    names = tuple(f"m{j}" for j in range(m))
    packed = [jnp.arange(m, dtype=jnp.float32) + i for i in range(k)]
    with dispatch_counter.count_dispatches() as count:
      for _ in range(2):  # The first round compiles.
        rec = mr.MetricsRecorder()
        for i in range(k):
          rec.buffer_packed(0, names, packed[i])
        rec.buffer_metrics(0, "extra", jnp.int32(7))
        before = count[0]
        rec.flush()
        launches = count[0] - before
    self.assertEqual(launches, 1)
    buf = rec.get_step_metrics(0)
    self.assertLen(buf.scalar_metrics, m + 1)
    np.testing.assert_array_equal(
        buf.scalar_metrics[names[-1]], np.arange(k) + m - 1
    )
    np.testing.assert_array_equal(buf.scalar_metrics["extra"], [7])

  @parameterized.named_parameters(
      # (k, m, launches): up to MAX_OPERANDS_PER_LAUNCH device values, mixed
      # dtypes included, take one launch; more take one per chunk of that many
      # values per dtype (3200 + 128 float32 values: 13 chunks; int32: 1).
      ("k4_m3", 4, 3, 1),
      ("k16_m5", 16, 5, 1),
      ("k64_m50", 64, 50, 14),
  )
  def test_per_name_flush_launches(self, k, m, expected):
    self.assertEqual(mr.MAX_OPERANDS_PER_LAUNCH, 256)
    names = tuple(f"m{j}" for j in range(m))
    per_name = {
        n: [jnp.float32(i + j) for i in range(k)] for j, n in enumerate(names)
    }
    ints = [jnp.int32(i) for i in range(k)]
    weighted = mr.WeightedMetric(jnp.float32(1.0), jnp.float32(2.0))
    with dispatch_counter.count_dispatches() as count:
      for _ in range(2):  # The first round compiles.
        rec = mr.MetricsRecorder()
        for i in range(k):
          for n in names:
            rec.buffer_metrics(0, n, per_name[n][i])
          rec.buffer_metrics(0, "int", ints[i])
          rec.buffer_metrics(0, "w", weighted)
          rec.buffer_metrics(0, "host", float(i))
        before = count[0]
        rec.flush()
        launches = count[0] - before
    self.assertEqual(launches, expected)
    buf = rec.get_step_metrics(0)
    for j, n in enumerate(names):
      np.testing.assert_array_equal(buf.scalar_metrics[n], np.arange(k) + j)
    np.testing.assert_array_equal(buf.scalar_metrics["int"], np.arange(k))
    np.testing.assert_array_equal(buf.scalar_metrics["host"], np.arange(k))
    np.testing.assert_array_equal(
        buf.weighted_metrics["w"].denominator, np.full(k, 2.0)
    )

  def test_single_packed_value_needs_no_launch(self):
    packed = jnp.arange(3, dtype=jnp.float32)
    with dispatch_counter.count_dispatches() as count:
      rec = mr.MetricsRecorder()
      rec.buffer_packed(0, ("a", "b", "c"), packed)
      rec.flush()
    self.assertEqual(count[0], 0)
    self.assertEqual(rec.get_step_metrics(0).scalar_metrics["c"][0], 2.0)

  def test_host_only_values_need_no_launch(self):
    with dispatch_counter.count_dispatches() as count:
      rec = mr.MetricsRecorder()
      for i in range(5):
        rec.buffer_metrics(0, "a", float(i))
        rec.buffer_metrics(0, "b", np.int32(i))
      rec.flush()
    self.assertEqual(count[0], 0)

  def test_all_or_nothing_when_a_device_buffer_was_deleted(self):
    # The test looks into the recorder's buffers, which have no public view.
    # pylint: disable=protected-access
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "good", jnp.float32(1.0))
    rec.flush()
    rec.buffer_metrics(0, "good", jnp.float32(2.0))
    rec.buffer_metrics(0, "host", 3.0)
    rec.buffer_metrics(1, "other", jnp.float32(4.0))
    doomed = jnp.float32(5.0)
    rec.buffer_metrics(1, "doomed", doomed)
    rec.buffer_packed(1, ("p",), jnp.ones((1,)))
    doomed.delete()
    history = rec._history

    def snapshot():
      return [
          (
              dict(b.scalar_metrics),
              list(rec._pending[b].records),
          )
          for b in history
      ]

    before = snapshot()
    with self.assertRaisesRegex(ValueError, "metric 'doomed'.*deleted"):
      rec.flush()
    after = snapshot()
    self.assertEqual(len(before), len(after))
    for (s0, p0), (s1, p1) in zip(before, after):
      self.assertEqual(s0.keys(), s1.keys())
      for name in s0:
        self.assertIs(s0[name], s1[name])
      self.assertEqual(len(p0), len(p1))
      for r0, r1 in zip(p0, p1):
        self.assertIs(r0, r1)
    self.assertEqual(rec.pending_count(), 5)
    np.testing.assert_array_equal(history[0].scalar_metrics["good"], [1.0])
    self.assertNotIn("host", history[0].scalar_metrics)
    self.assertEqual(history[1].scalar_metrics, {})

  def test_prefetch_launches_ahead_and_flush_uses_it(self):
    names = ("a", "b")
    packed = [jnp.arange(2, dtype=jnp.float32) + 10 * i for i in range(3)]
    with dispatch_counter.count_dispatches() as count:
      for _ in range(2):  # The first round compiles.
        rec = mr.MetricsRecorder()
        for i in range(3):
          rec.buffer_packed(0, names, packed[i])
        rec.buffer_metrics(0, "host", 1.5)
        before = count[0]
        rec.prefetch()
        prefetch_launches = count[0] - before
        self.assertEqual(rec.pending_count(), 7)  # Nothing flushed yet.
        before = count[0]
        rec.flush()
        flush_launches = count[0] - before
    self.assertEqual((prefetch_launches, flush_launches), (1, 0))
    buf = rec.get_step_metrics(0)
    np.testing.assert_array_equal(buf.scalar_metrics["a"], [0.0, 10.0, 20.0])
    np.testing.assert_array_equal(buf.scalar_metrics["b"], [1.0, 11.0, 21.0])
    np.testing.assert_array_equal(buf.scalar_metrics["host"], [1.5])

  @parameterized.named_parameters(("same_buffer", 0), ("new_buffer", 1))
  def test_values_buffered_after_prefetch_are_flushed_too(self, late_step):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "x", jnp.float32(1.0))
    rec.buffer_metrics(0, "x", jnp.float32(2.0))
    rec.prefetch()
    rec.buffer_metrics(late_step, "x", jnp.float32(3.0))
    rec.flush()
    self.assertEqual(rec.pending_count(), 0)
    values = {
        b.step: list(b.scalar_metrics["x"]) for b in rec.get_metrics_history()
    }
    self.assertEqual(
        values,
        {0: [1.0, 2.0, 3.0]} if late_step == 0 else {0: [1.0, 2.0], 1: [3.0]},
    )

  def test_prefetch_never_raises_and_flush_names_the_bad_value(self):
    # The test looks into the recorder's buffers, which have no public view.
    # pylint: disable=protected-access
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "good", jnp.float32(1.0))
    doomed = jnp.float32(2.0)
    rec.buffer_metrics(0, "doomed", doomed)
    doomed.delete()
    rec.prefetch()
    with self.assertRaisesRegex(ValueError, "metric 'doomed'.*deleted"):
      rec.flush()
    self.assertEqual(rec.pending_count(), 2)
    self.assertEqual(rec._history[0].scalar_metrics, {})

  def test_cleanup_drops_a_prefetch(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "x", jnp.float32(1.0))
    rec.buffer_metrics(0, "x", jnp.float32(2.0))
    rec.prefetch()
    rec.cleanup()
    rec.buffer_metrics(0, "y", jnp.float32(3.0))
    rec.flush()
    buf = rec.get_step_metrics(0)
    self.assertEqual(list(buf.scalar_metrics), ["y"])
    np.testing.assert_array_equal(buf.scalar_metrics["y"], [3.0])


class HistoryTest(parameterized.TestCase):

  def test_eviction_warns_and_drops_pending_values(self):
    rec = mr.MetricsRecorder(max_history=2)
    rec.buffer_metrics(0, "x", jnp.float32(0.0))
    rec.buffer_metrics(1, "x", 1.0)
    with self.assertLogs(level="WARNING") as logs:
      rec.buffer_metrics(2, "x", 2.0)
    self.assertRegex(
        "\n".join(logs.output), "evicting the buffer of step 0 with 1 pending"
    )
    self.assertEqual(rec.pending_count(), 2)
    self.assertEqual([b.step for b in rec.get_metrics_history()], [1, 2])

  def test_history_clear_and_cleanup(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "x", 1.0)
    rec.buffer_metrics(1, "x", jnp.float32(1.0))
    history = rec.get_metrics_history(clear=True)
    self.assertLen(history, 2)
    self.assertEqual(history[1].scalar_metrics["x"][0], 1.0)
    self.assertEqual(rec.get_metrics_history(), [])
    rec.buffer_metrics(2, "x", jnp.float32(1.0))
    rec.cleanup()
    self.assertEqual(rec.pending_count(), 0)
    self.assertEqual(rec.get_metrics_history(), [])
    self.assertIsNone(rec.get_step_metrics(2))

  @parameterized.named_parameters(
      ("zero", 0, ValueError), ("float", 2.0, TypeError)
  )
  def test_bad_max_history(self, value, exc):
    with self.assertRaisesRegex(exc, "max_history"):
      mr.MetricsRecorder(max_history=value)


class ReduceTest(parameterized.TestCase):

  def test_reduce_defaults_and_zero_denominator(self):
    rec = mr.MetricsRecorder()
    for i in range(4):
      rec.buffer_metrics(0, "loss", jnp.float32(i))
      rec.buffer_metrics(0, "acc", mr.WeightedMetric(jnp.float32(i), 2.0))
      rec.buffer_metrics(0, "empty", mr.WeightedMetric(1.0, 0.0))
      rec.buffer_metrics(0, "peak", float(i), aggregation_fn=np.max)
    rec.flush()
    out = mr.reduce_buffer(rec.get_step_metrics(0))
    self.assertEqual(
        out, {"acc": 6.0 / 8.0, "empty": 0.0, "loss": 1.5, "peak": 3.0}
    )
    for v in out.values():
      self.assertIsInstance(v, float)

  @parameterized.named_parameters(
      ("float32", np.float32),
      ("float64", np.float64),
      ("float16", np.float16),
      ("int32", np.int32),
      ("bool", np.bool_),
  )
  def test_mean_is_np_mean_bit_for_bit(self, dtype):
    # The reduction's mean stands in for np.mean: same dtype, same bits,
    # over lengths around NumPy's pairwise-summation blocks and values
    # across many magnitudes, NaN and inf included.
    rng = np.random.default_rng(0)
    cases = [np.array([np.nan, 1.0]), np.array([np.inf, -np.inf, 2.0])]
    for n in (1, 2, 3, 7, 8, 9, 16, 17, 129, 1000):
      for _ in range(20):
        cases.append(rng.standard_normal(n) * 10 ** rng.uniform(-6, 6))
    for case in cases:
      with np.errstate(all="ignore"):
        values = case.astype(dtype)
        want, got = np.mean(values), mr.mean(values)
      self.assertEqual(got.dtype, want.dtype)
      self.assertEqual(got.tobytes(), want.tobytes(), values)

  def test_summed_metric_reduces_to_the_sum(self):
    rec = mr.MetricsRecorder()
    for i in range(4):
      rec.buffer_metrics(0, "dropped", mr.SummedMetric(jnp.float32(i)))
      rec.buffer_metrics(0, "mean", jnp.float32(i))
    # A packed count declared a sum, as the engine declares it.
    rec.buffer_packed(
        0, ("packed",), np.array([5.0]), {"packed": mr.sum_values}
    )
    rec.buffer_packed(
        0, ("packed",), np.array([7.0]), {"packed": mr.sum_values}
    )
    buf = rec.get_step_metrics(0)
    # The values are kept as buffered; only the reduction differs.
    np.testing.assert_array_equal(buf.scalar_metrics["dropped"], [0, 1, 2, 3])
    self.assertEqual(
        mr.reduce_buffer(buf), {"dropped": 6.0, "mean": 1.5, "packed": 12.0}
    )

  def test_summed_metric_takes_no_other_aggregation(self):
    rec = mr.MetricsRecorder()
    with self.assertRaisesRegex(ValueError, "metric 'n'.*must be None"):
      rec.buffer_metrics(0, "n", mr.SummedMetric(1.0), aggregation_fn=np.max)
    with self.assertRaisesRegex(TypeError, "metric 'n'.*one scalar"):
      rec.buffer_metrics(0, "n", mr.SummedMetric(mr.WeightedMetric(1.0, 2.0)))
    with self.assertRaisesRegex(TypeError, "metric 'n'.*boolean"):
      rec.buffer_metrics(0, "n", mr.SummedMetric(True))
    rec.buffer_metrics(0, "n", 1.0, aggregation_fn=np.max)
    # The same name cannot become a sum within the step.
    with self.assertRaisesRegex(ValueError, "metric 'n': aggregation_fn"):
      rec.buffer_metrics(0, "n", mr.SummedMetric(1.0))
    self.assertEqual(rec.pending_count(), 1)

  def test_reduce_requires_flush(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "loss", 1.0)
    rec.flush()
    buf = rec.get_step_metrics(0)
    rec.buffer_metrics(0, "loss", 2.0)
    with self.assertRaisesRegex(ValueError, "pending values; flush first"):
      mr.reduce_buffer(buf)

  def test_reduce_rejects_non_scalar_aggregation(self):
    rec = mr.MetricsRecorder()
    rec.buffer_metrics(0, "m", 1.0, aggregation_fn=lambda v: v)
    rec.buffer_metrics(0, "m", 2.0)
    with self.assertRaisesRegex(ValueError, "metric 'm'.*scalar"):
      mr.reduce_buffer(rec.get_step_metrics(0))


if __name__ == "__main__":
  absltest.main()
