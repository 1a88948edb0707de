"""Tests of testing/polling.py."""

import threading

from absl.testing import absltest

from testing import polling


class WaitUntilTest(absltest.TestCase):

  def test_returns_once_another_thread_sets_the_state(self):
    done = threading.Event()
    threading.Timer(0.1, done.set).start()
    polling.wait_until(done.is_set, timeout_s=10.0)
    self.assertTrue(done.is_set())

  def test_fails_the_test_when_the_state_never_comes(self):
    with self.assertRaisesRegex(AssertionError, "within 0.1 s"):
      polling.wait_until(lambda: False, timeout_s=0.1)


if __name__ == "__main__":
  absltest.main()
