"""Tests for trace_summary: a real trace of this process, summed by name."""

import collections
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp

from tools.benchmarks import trace_summary

_Event = collections.namedtuple("_Event", "start_ns duration_ns")


class TraceSummaryTest(absltest.TestCase):

  def test_self_time_subtracts_the_events_nested_inside(self):
    # A loop of 100 ns holding two operations of 30 and 20; one after it.
    events = [_Event(0, 100), _Event(10, 30), _Event(50, 20), _Event(100, 5)]
    self.assertEqual(trace_summary.self_times(events), [50.0, 30.0, 20.0, 5.0])

  def test_hlo_text_becomes_its_name_and_shape(self):
    self.assertEqual(
        trace_summary.short_name(
            "%fusion.12 = bf16[8,2048]{1,0:T(8,128)(2,1)} fusion(x)"
        ),
        "fusion bf16[8,2048]",
    )
    self.assertEqual(
        trace_summary.short_name("%while.3 = (s32[], f32[2]{0}) while(t)"),
        "while (tuple)",
    )
    self.assertEqual(trace_summary.short_name("copy.7"), "copy")

  def test_traced_programs_are_counted_by_their_calls(self):
    def thrice(x):
      return jnp.sin(x @ x).sum()

    def twice(x):
      return jnp.cos(x).sum()

    thrice_jit, twice_jit = jax.jit(thrice), jax.jit(twice)
    x = jnp.ones((64, 64))
    thrice_jit(x).block_until_ready()
    twice_jit(x).block_until_ready()
    with tempfile.TemporaryDirectory() as trace_dir:
      with jax.profiler.trace(trace_dir):
        for _ in range(3):
          thrice_jit(x).block_until_ready()
        for _ in range(2):
          twice_jit(x).block_until_ready()
      lines = trace_summary.summarise(
          trace_summary.newest_trace(trace_dir), "/host:CPU", depth=4
      )
    totals = collections.Counter()
    for line in lines:
      totals.update(line.counts)
      # Self times never add up to more than the line's span.
      self.assertLessEqual(line.busy_ns, line.span_ns + 1)
    # However many events one call makes, the two programs' counts stand
    # as their calls do.
    self.assertGreater(totals["PjitFunction(twice)"], 0)
    self.assertEqual(
        2 * totals["PjitFunction(thrice)"], 3 * totals["PjitFunction(twice)"]
    )

  def test_a_directory_without_a_trace_is_refused(self):
    with tempfile.TemporaryDirectory() as empty:
      with self.assertRaisesRegex(ValueError, "no \\*.xplane.pb under"):
        trace_summary.newest_trace(empty)


if __name__ == "__main__":
  absltest.main()
