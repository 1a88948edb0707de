"""Waiting in tests for something another thread or process does."""

import subprocess
import time


def wait_until(predicate, timeout_s: float = 30.0) -> None:
  """Polls `predicate` until it holds.

  Args:
    predicate: a function of no arguments, true once the awaited state holds.
    timeout_s: seconds after which the wait fails.

  Raises:
    AssertionError: `predicate` still false after `timeout_s` (a test
      failure, not an error of the code under test's own making).
  """
  deadline = time.monotonic() + timeout_s
  while not predicate():
    if time.monotonic() > deadline:
      raise AssertionError(f"condition not reached within {timeout_s} s")
    time.sleep(0.02)


def wait_while_running(
    proc: subprocess.Popen, predicate, what: str, timeout_s: float
) -> None:
  """Polls `predicate` until it holds, while the child `proc` runs.

  Args:
    proc: a child started with its stderr piped (text mode).
    predicate: a function of no arguments, true once the awaited state holds.
    what: the awaited state in words, for the failure message.
    timeout_s: seconds after which the wait fails.

  Raises:
    AssertionError: the child exited first (the message holds its exit status
      and the end of its stderr), or `predicate` is still false after
      `timeout_s` (then the child is killed and the message holds the end of
      its stderr).
  """
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      _, stderr = proc.communicate()
      raise AssertionError(
          f"the child exited ({proc.returncode}) before {what}:\n"
          f"{(stderr or '')[-3000:]}"
      )
    if predicate():
      return
    time.sleep(0.05)
  proc.kill()
  _, stderr = proc.communicate()
  raise AssertionError(
      f"timed out waiting for {what}; the child's stderr ends:\n"
      f"{(stderr or '')[-3000:]}"
  )
