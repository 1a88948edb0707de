"""A child process a test signals and waits on, whose output goes to files.

A child started with its output piped blocks once it has written a pipe's
worth (64 KiB on Linux) that nobody read; a training run without end logs
that much in a few hundred steps, then waits forever for a reader. Here the
output goes to files, so the child never waits on the test, and the test can
read what the child wrote so far at any time.
"""

import os
import signal
import subprocess
import tempfile
import time


class Child:
  """`command` running in `cwd` with `env`, its stdout and stderr in files."""

  def __init__(self, command: list[str], cwd: str, env: dict[str, str]):
    self._dir = tempfile.mkdtemp(prefix="child-", dir=cwd)
    self._stdout = os.path.join(self._dir, "stdout")
    self._stderr = os.path.join(self._dir, "stderr")
    with (
        open(self._stdout, "w", encoding="utf-8") as out,
        open(self._stderr, "w", encoding="utf-8") as err,
    ):
      # The process outlives this method: the test signals or waits for it.
      self._proc = subprocess.Popen(  # pylint: disable=consider-using-with
          command, cwd=cwd, env=env, stdout=out, stderr=err
      )

  @property
  def pid(self) -> int:
    return self._proc.pid

  @property
  def returncode(self) -> int | None:
    return self._proc.returncode

  def poll(self) -> int | None:
    return self._proc.poll()

  def send_signal(self, signum: int) -> None:
    self._proc.send_signal(signum)

  def stderr(self) -> str:
    """What the child wrote to stderr so far."""
    return _read(self._stderr)

  def communicate(self, timeout: float) -> tuple[str, str]:
    """Waits for the child to end; returns its whole (stdout, stderr)."""
    self._proc.wait(timeout=timeout)
    return _read(self._stdout), _read(self._stderr)

  def kill(self) -> None:
    """Ends the child (resuming it first if it was stopped) and reaps it."""
    if self._proc.poll() is None:
      self._proc.send_signal(signal.SIGCONT)
      self._proc.kill()
    self._proc.wait()

  def wait_until(self, predicate, what: str, timeout_s: float) -> None:
    """Polls `predicate` until it holds, while the child runs.

    Args:
      predicate: a function of no arguments, true once the awaited state
        holds.
      what: the awaited state in words, for the failure message.
      timeout_s: seconds after which the wait fails.

    Raises:
      AssertionError: the child exited first (the message holds its exit
        status and the end of its stderr), or `predicate` is still false
        after `timeout_s` (then the child is killed and the message holds the
        end of its stderr).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      if self._proc.poll() is not None:
        raise AssertionError(
            f"the child exited ({self._proc.returncode}) before {what}:\n"
            f"{self.stderr()[-3000:]}"
        )
      if predicate():
        return
      time.sleep(0.05)
    self.kill()
    raise AssertionError(
        f"timed out waiting for {what}; the child's stderr ends:\n"
        f"{self.stderr()[-3000:]}"
    )


def _read(path: str) -> str:
  with open(path, encoding="utf-8", errors="replace") as f:
    return f.read()
