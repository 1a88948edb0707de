"""Tests for testing/child.py with real child processes."""

import os
import sys
import tempfile

from absl.testing import absltest

from testing import child


def _python(code: str) -> list[str]:
  return [sys.executable, "-c", code]


class ChildTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    self.env = dict(os.environ)

  def test_a_child_writing_more_than_a_pipe_holds_is_not_blocked(self):
    # 1 MiB on each stream: a piped child nobody reads would stop at 64 KiB.
    proc = child.Child(
        _python(
            "import sys\n"
            "sys.stdout.write('o' * (1 << 20))\n"
            "sys.stderr.write('e' * (1 << 20) + 'end')\n"
        ),
        self.tmp,
        self.env,
    )
    self.addCleanup(proc.kill)
    stdout, stderr = proc.communicate(timeout=60)
    self.assertEqual(proc.returncode, 0)
    self.assertLen(stdout, 1 << 20)
    self.assertTrue(stderr.endswith("end"))

  def test_wait_until_returns_once_the_child_made_the_state_hold(self):
    flag = os.path.join(self.tmp, "flag")
    proc = child.Child(
        _python(f"import time\nopen({flag!r}, 'w').close()\ntime.sleep(600)\n"),
        self.tmp,
        self.env,
    )
    self.addCleanup(proc.kill)
    proc.wait_until(lambda: os.path.exists(flag), "the flag", timeout_s=60)
    self.assertIsNone(proc.poll())

  def test_a_child_that_exits_first_fails_the_wait_with_its_stderr(self):
    proc = child.Child(
        _python("import sys\nsys.exit('the reason it stopped')"),
        self.tmp,
        self.env,
    )
    self.addCleanup(proc.kill)
    with self.assertRaisesRegex(
        AssertionError, r"exited \(1\) before the state(.|\n)*the reason"
    ):
      proc.wait_until(lambda: False, "the state", timeout_s=60)

  def test_a_timed_out_wait_kills_the_child_and_shows_its_stderr(self):
    proc = child.Child(
        _python(
            "import sys, time\n"
            "sys.stderr.write('still going\\n')\nsys.stderr.flush()\n"
            "time.sleep(600)\n"
        ),
        self.tmp,
        self.env,
    )
    self.addCleanup(proc.kill)
    with self.assertRaisesRegex(
        AssertionError, r"timed out waiting for never(.|\n)*still going"
    ):
      proc.wait_until(
          lambda: False,
          "never",
          timeout_s=3,
      )
    self.assertIsNotNone(proc.poll())


if __name__ == "__main__":
  absltest.main()
