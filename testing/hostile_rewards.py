"""Reward functions that misbehave as user code does, for GRPO tests.

Named in `grpo_reward_functions` as `testing.hostile_rewards:<name>`; a
reward worker process imports this module like any user's.
"""

import os
import sys
import time

# Calls this process has seen, per function.
_CALLS = {}


def _process_index() -> int:
  """jax.process_index(), JAX imported on the first call: the reward worker
  imports this module for every hostile function, and JAX would add 1.5 s
  or so of CPU to its start (the worker itself imports none)."""
  # pylint: disable-next=import-outside-toplevel  # JAX only when called.
  import jax

  return jax.process_index()


def _count(name: str) -> int:
  _CALLS[name] = _CALLS.get(name, 0) + 1
  return _CALLS[name]


def constant(prompt, completion):
  """A well-behaved reward: 0.5 everywhere."""
  del prompt, completion
  return 0.5


def huge(prompt, completion):
  """An exact integer no float holds."""
  del prompt, completion
  return 10**400


def near_max(prompt, completion):
  """Finite alone; two of them weighted 1 sum to infinity."""
  del prompt, completion
  return 1.7e308


def exits(prompt, completion):
  """A reward that ends its process the polite way."""
  del prompt, completion
  sys.exit(0)


def dies(prompt, completion):
  """A reward that ends its process at once."""
  del prompt, completion
  # The abrupt exit is the point: no cleanup, no exception.
  os._exit(3)  # pylint: disable=protected-access


def hangs(prompt, completion):
  """A reward that never returns."""
  del prompt, completion
  while True:
    time.sleep(3600)


def hangs_after_8_calls(prompt, completion):
  """Scores 8 completions (the tiny run's first rollout), then hangs."""
  if _count("hangs_after_8_calls") > 8:
    hangs(prompt, completion)
  return float(len(completion))


def contains_answer(prompt, completion, answer, **fields):
  """A text reward: 1 when the completion holds the record's answer."""
  del fields
  if not isinstance(prompt, str) or not isinstance(completion, str):
    raise TypeError("text rewards get texts")
  return float(str(answer) in completion)


def where_called(prompt, completion):
  """The index of the process that called it, plus the completion's length
  (the ids form): a value that depends on where it runs."""
  del prompt
  _count("where_called")
  return float(_process_index()) + len(completion)


def fails_on_process_0(prompt, completion):
  """Raises on process 0 only; 1.0 elsewhere."""
  del prompt, completion
  if _process_index() == 0:
    raise RuntimeError(f"judge unreachable from pid {os.getpid()}")
  return 1.0


def calls(name: str) -> int:
  """How many times this process called `name`."""
  return _CALLS.get(name, 0)
