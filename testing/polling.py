"""Waiting in tests for something another thread or process does."""

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
