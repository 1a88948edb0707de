"""Reward functions called in a worker process, each call under a timeout.

A hung reward (an endless loop, a network call that never answers) cannot
be stopped inside the process that runs it, so `Worker` runs the functions
in a child process (`python -m maxtext.grpo.rewards.reward_worker`, started
on the first call) and waits for each call's answer at most `timeout_s` seconds;
past that it kills the child and raises `Timeout`. A later call starts a
new child.

Protocol, over two pipes of their own (the functions' prints go to the
inherited stdout and stderr): the child writes `{"ready": true}` once it
has imported the functions (start-up has a bound of its own, not counted
against any call); the parent writes one JSON line per batch,
`{"function": i, "pairs": [[prompt, completion], ...]}` (ids lists or
texts, with a third item, the task record's fields, for text tasks); the child
answers one JSON line per call, in order: `{"value": float}` or
`{"error": "one line"}` (see `reward_call.check_call`, shared by both
sides), and stops the batch at its first error.
"""

import json
import os
import select
import subprocess
import sys
import time
from typing import Iterator, Sequence

from maxtext.grpo.rewards import reward_call

# How long the worker may take to start and import the functions.
_START_TIMEOUT_S = 120.0


class Timeout(Exception):
  """A call did not answer in time (the worker was killed)."""


class Died(Exception):
  """The worker ended during a call (e.g. the function called os._exit)."""


class Worker:
  """A child process calling the functions `names` ("module:function")."""

  def __init__(self, names: Sequence[str], timeout_s: float):
    self._names = list(names)
    self._timeout_s = timeout_s
    self._process = None
    self._to_child = self._from_child = None
    self._buffer = b""

  @property
  def timeout_s(self) -> float:
    """The most seconds one call may take."""
    return self._timeout_s

  def start(self) -> None:
    """Starts the child (and waits for its imports) unless it runs: a
    run's warm-up calls it, so the start-up falls before the timed steps
    rather than in the first step's rewards."""
    if self._process is None or self._process.poll() is not None:
      self.close()
      self._start()

  def _start(self) -> None:
    """Starts the child and waits for it to have imported the functions."""
    child_reads, parent_writes = os.pipe()
    parent_reads, child_writes = os.pipe()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    # The child outlives this call: `close` ends it.
    self._process = subprocess.Popen(  # pylint: disable=consider-using-with
        [
            sys.executable,
            "-m",
            "maxtext.grpo.rewards.reward_worker",
            str(child_reads),
            str(child_writes),
            *self._names,
        ],
        pass_fds=(child_reads, child_writes),
        stdin=subprocess.DEVNULL,
        env=env,
    )
    os.close(child_reads)
    os.close(child_writes)
    self._to_child = os.fdopen(parent_writes, "wb", buffering=0)
    self._from_child = parent_reads
    self._buffer = b""
    # Starting Python and importing the functions is not a call: it has a
    # bound of its own.
    try:
      self._line(_START_TIMEOUT_S + self._timeout_s)
    except Timeout:
      raise Died(
          f"it did not start within {_START_TIMEOUT_S + self._timeout_s:g} s"
      ) from None

  def calls(self, function: int, pairs: Sequence[tuple]) -> Iterator[dict]:
    """Calls function `function` on each (prompt, completion[, fields]) of
    `pairs`.

    Yields:
      Each call's answer, in order: {"value": float} or {"error": str}.

    Raises:
      Timeout: a call took longer than the timeout; the worker is killed.
      Died: the worker ended (its exit status is in the message).
    """
    self.start()
    request = {
        "function": function,
        "pairs": [
            [list(x) if isinstance(x, tuple) else x for x in p] for p in pairs
        ],
    }
    self._to_child.write(json.dumps(request).encode() + b"\n")
    for _ in pairs:
      answer = json.loads(self._line(self._timeout_s))
      yield answer
      if "error" in answer:
        return  # The child stops a request at its first error.

  def _line(self, timeout_s: float) -> bytes:
    """The child's next line; Timeout after `timeout_s`, Died at its end."""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in self._buffer:
      remaining = deadline - time.monotonic()
      ready = select.select([self._from_child], [], [], max(remaining, 0))[0]
      if not ready:
        self.close()
        raise Timeout()
      chunk = os.read(self._from_child, 1 << 16)
      if not chunk:
        status = self._process.wait()
        self.close()
        raise Died(f"exit status {status}")
      self._buffer += chunk
    line, self._buffer = self._buffer.split(b"\n", 1)
    return line

  def close(self) -> None:
    """Kills the child, if any, and closes the pipes."""
    if self._process is not None:
      if self._process.poll() is None:
        self._process.kill()
      self._process.wait()
      self._process = None
    if self._to_child is not None:
      try:
        self._to_child.close()
      except OSError:
        pass  # The child is gone; nothing is waiting for these bytes.
      self._to_child = None
    if self._from_child is not None:
      os.close(self._from_child)
      self._from_child = None

  def __del__(self):
    """Ends the child with its worker."""
    self.close()


def _serve(read_fd: int, write_fd: int, names: Sequence[str]) -> None:
  """The child: answers requests until the parent closes its pipe."""
  functions = [reward_call.import_function(name) for name in names]
  with (
      os.fdopen(read_fd, "rb") as requests,
      os.fdopen(write_fd, "wb", buffering=0) as answers,
  ):
    answers.write(b'{"ready": true}\n')
    for line in requests:
      request = json.loads(line)
      fn = functions[request["function"]]
      for prompt, completion, *fields in request["pairs"]:
        answer = reward_call.check_call(
            fn,
            reward_call.as_argument(prompt),
            reward_call.as_argument(completion),
            fields[0] if fields else None,
        )
        answers.write(json.dumps(answer).encode() + b"\n")
        if "error" in answer:
          break  # The run stops at the first error; no more calls.


if __name__ == "__main__":
  _serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
