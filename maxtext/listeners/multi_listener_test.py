"""Tests for maxtext.listeners.multi_listener: fan-out, failure policy."""

from absl.testing import absltest

from maxtext.listeners import interface
from maxtext.listeners import multi_listener

_START = interface.RunStart(start_step=0, samples=0)
_STEP = interface.StepRecord(
    step=0, metrics={"loss": 1.0}, step_time=0.1, samples=8
)
_END = interface.RunEnd(interface.RunOutcome.COMPLETED, final_step=1, samples=8)


class Recording(interface.RunListener):
  """Records every event it receives; raises from `fail_on` events."""

  def __init__(self, name, critical=True, fail_on=(), error=None):
    self.name = name
    self.critical = critical
    self.fail_on = set(fail_on)
    self.error = error or OSError(28, "No space left on device")
    self.events = []

  def _event(self, event):
    self.events.append(event)
    if event in self.fail_on:
      raise self.error

  def on_run_start(self, start):
    self._event("on_run_start")

  def on_step(self, record):
    self._event("on_step")

  def on_eval(self, record):
    self._event("on_eval")

  def on_run_end(self, end):
    self._event("on_run_end")

  def close(self):
    self._event("close")


class StepsOnly(interface.RunListener):
  """Overrides one event only."""

  name = "steps_only"

  def __init__(self):
    self.steps = 0

  def on_step(self, record):
    self.steps += 1


class Fence(interface.RunListener):
  """A fence that raises once `lost` is set; listed last, like the lock."""

  name = "run_lock"

  def __init__(self):
    self.lost = None
    self.closed = False

  def check_fence(self):
    if self.lost is not None:
      raise self.lost

  def close(self):
    self.closed = True


class MultiListenerTest(absltest.TestCase):

  def test_fenced_run_reaches_no_listener_and_raises_the_fence_error(self):
    metrics, mirror, fence = (
        Recording("metrics"),
        Recording("m", False),
        Fence(),
    )
    listeners = multi_listener.MultiListener([metrics, mirror, fence])
    listeners.on_run_start(_START)
    listeners.on_step(_STEP)
    fence.lost = RuntimeError("run lock of gs://b/r was taken over")
    with self.assertLogs(level="ERROR") as logs:
      with self.assertRaisesRegex(RuntimeError, "^run lock of gs://b/r"):
        listeners.on_step(_STEP)
    self.assertEqual(
        logs.output,
        [
            "ERROR:absl:Output 'run_lock': run lock of gs://b/r was"
            " taken over"
        ],
    )
    self.assertIs(listeners.fenced, fence.lost)
    # Later events reach nobody and raise nothing; close reaches everyone.
    listeners.on_step(_STEP)
    listeners.on_run_end(_END)
    listeners.close()
    for listener in (metrics, mirror):
      self.assertEqual(listener.events, ["on_run_start", "on_step", "close"])
    self.assertTrue(fence.closed)

  def test_forwards_every_event_in_order(self):
    a, b = Recording("a"), Recording("b")
    listeners = multi_listener.MultiListener([a, b])
    listeners.on_run_start(_START)
    listeners.on_step(_STEP)
    listeners.on_run_end(_END)
    listeners.close()
    for listener in (a, b):
      self.assertEqual(
          listener.events, ["on_run_start", "on_step", "on_run_end", "close"]
      )
    self.assertEqual(listeners.listeners, (a, b))

  def test_default_methods_are_no_ops(self):
    only = StepsOnly()
    listeners = multi_listener.MultiListener([only])
    listeners.on_run_start(_START)
    listeners.on_step_start(0)
    listeners.on_step(_STEP)
    listeners.on_eval_start(0, 8)
    listeners.on_checkpoint(1, "/tmp/x")
    listeners.on_run_end(_END)
    listeners.close()
    self.assertEqual(only.steps, 1)

  def test_critical_failure_raises_after_the_others_and_takes_it_out(self):
    bad = Recording("metrics", fail_on={"on_step"})
    good = Recording("mllog")
    listeners = multi_listener.MultiListener([bad, good])
    with self.assertRaisesRegex(
        multi_listener.ListenerError,
        r"^output 'metrics' failed \(on_step\): OSError: .*No space left",
    ):
      listeners.on_step(_STEP)
    self.assertEqual(good.events, ["on_step"])  # Still got the event.
    listeners.on_step(_STEP)  # The failed one is out: no second error.
    listeners.on_run_end(_END)
    listeners.close()  # Its close runs; nothing raises.
    self.assertEqual(bad.events, ["on_step", "close"])
    self.assertEqual(good.events, ["on_step", "on_step", "on_run_end", "close"])

  def test_error_carries_the_listener_event_and_cause(self):
    error = ValueError("bug")
    listeners = multi_listener.MultiListener(
        [Recording("profiler", fail_on={"on_run_start"}, error=error)]
    )
    with self.assertRaises(multi_listener.ListenerError) as raised:
      with self.assertLogs(level="ERROR") as logs:
        listeners.on_run_start(_START)
    self.assertEqual(
        (
            raised.exception.listener,
            raised.exception.event,
            raised.exception.error,
        ),
        ("profiler", "on_run_start", error),
    )
    # Not an OSError: a bug, logged with its traceback.
    self.assertIn("Traceback", "\n".join(logs.output))

  def test_os_error_is_logged_as_one_line(self):
    listeners = multi_listener.MultiListener(
        [Recording("metrics", fail_on={"on_step"})]
    )
    with self.assertLogs(level="WARNING") as logs:
      with self.assertRaises(multi_listener.ListenerError):
        listeners.on_step(_STEP)
    self.assertNotIn("Traceback", "\n".join(logs.output))

  def test_non_critical_failure_is_a_warning_and_it_keeps_listening(self):
    mirror = Recording(
        "gcs_mirror", critical=False, fail_on={"on_step", "close"}
    )
    listeners = multi_listener.MultiListener([mirror])
    with self.assertLogs(level="WARNING") as logs:
      listeners.on_step(_STEP)
      listeners.on_step(_STEP)
      listeners.close()
    self.assertEqual(mirror.events, ["on_step", "on_step", "close"])
    self.assertIn("gcs_mirror", logs.output[0])

  def test_close_failure_of_a_critical_listener_raises_after_closing_all(self):
    bad = Recording("mllog", fail_on={"close"})
    after = Recording("gcs_mirror", critical=False)
    listeners = multi_listener.MultiListener([bad, after])
    with self.assertRaisesRegex(
        multi_listener.ListenerError, r"'mllog' failed \(close\)"
    ):
      listeners.close()
    self.assertEqual(after.events, ["close"])
    listeners.close()  # Idempotent.
    self.assertEqual(bad.events, ["close"])

  def test_listener_added_later_receives_later_events_only(self):
    first, late = Recording("first"), Recording("late")
    listeners = multi_listener.MultiListener([first])
    listeners.on_run_start(_START)
    listeners.add(late)
    listeners.on_step(_STEP)
    self.assertEqual(late.events, ["on_step"])


if __name__ == "__main__":
  absltest.main()
