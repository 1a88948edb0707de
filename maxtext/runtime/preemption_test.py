"""Tests of graceful stop requests: real signals sent to this process."""

import os
import signal
import threading

from absl.testing import absltest

from maxtext.runtime import preemption
from testing import runfiles


class StopRequestTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.stop = preemption.StopRequest()
    self.addCleanup(self.stop.close)

  def test_sigterm_sets_the_request_and_its_reason(self):
    self.assertFalse(self.stop.local())
    self.assertFalse(self.stop.should_stop(1))
    os.kill(os.getpid(), signal.SIGTERM)
    self.assertTrue(self.stop.local())
    self.assertEqual(self.stop.reason, "SIGTERM")
    with self.assertLogs(level="WARNING") as logs:
      self.assertTrue(self.stop.should_stop(3))
    self.assertIn("SIGTERM received: stopping after step 3", logs.output[0])

  def test_first_reason_is_kept_and_announced_once(self):
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    self.assertEqual(self.stop.reason, "SIGINT")
    with self.assertLogs(level="WARNING") as logs:
      self.assertTrue(self.stop.should_stop(1))
      self.assertTrue(self.stop.should_stop(2))
    self.assertLen(logs.output, 1)

  def test_a_signal_blocked_by_the_launcher_still_arrives(self):
    # A process whose launcher blocked SIGTERM inherits the mask through
    # exec, and so does every thread it starts (JAX's too): the signal
    # would stay pending for ever unless StopRequest unblocks it.
    script = (
        "import os, signal, time\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])\n"
        "from maxtext.runtime import preemption\n"
        "stop = preemption.StopRequest()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "deadline = time.monotonic() + 10\n"
        "while not stop.local() and time.monotonic() < deadline:\n"
        "  time.sleep(0.01)\n"
        "print(stop.local(), stop.reason)\n"
    )
    proc = runfiles.run_python(script, timeout_s=120)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertEqual(proc.stdout.strip(), "True SIGTERM")

  def test_close_restores_the_previous_handlers(self):
    self.stop.close()
    marks = []
    previous = signal.signal(signal.SIGTERM, lambda *_: marks.append(1))
    self.addCleanup(signal.signal, signal.SIGTERM, previous)
    stop = preemption.StopRequest()
    stop.close()
    os.kill(os.getpid(), signal.SIGTERM)
    self.assertEqual(marks, [1])
    self.assertFalse(stop.local())

  def test_request_from_another_thread(self):
    self.stop.close()
    made = []
    thread = threading.Thread(
        target=lambda: made.append(preemption.StopRequest())
    )
    thread.start()
    thread.join()
    made[0].request("test")
    self.assertTrue(made[0].should_stop(0))
    self.assertEqual(made[0].reason, "test")


if __name__ == "__main__":
  absltest.main()
