"""A task: its records, its environment, its demonstrations; loaded by name.

A GRPO run on text names its task in `config.grpo_task` as
`module:factory` (e.g. `maxtext.env.math_task:make_task`); the factory is
called as `factory(num_eval=..., seed=...)` and returns a `Task`:

    task.kind                      # reported in rewards/<kind>
    task.train_records(step, n)    # the step's n task records (dicts)
    task.eval_records()            # the held-out records, always the same
    task.make_environment(record, tools)   # one episode's Environment
    task.demonstration(record)     # a worked solution, as chat messages

A record is a JSON-serialisable dict: "prompt" (text) or "messages", and
the fields its reward functions and environment read. Records of step s are
a function of (seed, s), so a resumed run draws what an uninterrupted one
would.
"""

import abc
import dataclasses
import importlib
from typing import Any, Optional

from maxtext.env import environment
from maxtext.env import sandbox

_FIELD = "config.grpo_task"


@dataclasses.dataclass(frozen=True)
class ToolSettings:
  """How an episode's tools and verifier run.

  Attributes:
    limits: each sandboxed command's limits.
    isolated: under bubblewrap (False: trusted tools, unisolated).
    verifier_seconds: the verifier's wall-clock limit (the run's reward
      timeout).
  """

  limits: sandbox.Limits = sandbox.Limits()
  isolated: bool = True
  verifier_seconds: float = 60.0


class Task(abc.ABC):
  """A source of task records with their environment (module docstring)."""

  kind: str = "task"

  @abc.abstractmethod
  def train_records(self, step: int, count: int) -> list[dict[str, Any]]:
    """The `count` training records of step `step`."""

  @abc.abstractmethod
  def eval_records(self) -> list[dict[str, Any]]:
    """The held-out records."""

  def make_environment(
      self, record: dict[str, Any], tools: ToolSettings
  ) -> environment.Environment:
    """One episode's environment; a single turn unless overridden."""
    del tools
    return environment.SingleTurn(dict(record, kind=self.kind))

  def demonstration(
      self, record: dict[str, Any]
  ) -> Optional[list[dict[str, Any]]]:
    """A worked solution of `record` as chat messages (for SFT), or None:
    a task writes none unless it says how."""
    del record


def load(spec: str, num_eval: int, seed: int) -> Task:
  """The task `spec` ("module:factory") names, made.

  Raises:
    ValueError: one line naming the field: not module:factory, an import
      that fails, no such factory, or not a Task.
  """
  module_name, _, name = spec.partition(":")
  if not module_name or not name:
    raise ValueError(f"{_FIELD}={spec!r}: must be module:factory")
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # Whatever user code raises: one line.
    raise ValueError(
        f"{_FIELD}={spec!r} does not import: {type(e).__name__}: {e}"
    ) from None
  factory = getattr(module, name, None)
  if not callable(factory):
    raise ValueError(f"{_FIELD}={spec!r}: {module_name} has no {name}")
  try:
    task = factory(num_eval=num_eval, seed=seed)
  except TypeError as e:
    raise ValueError(
        f"{_FIELD}={spec!r}: the factory must take num_eval and seed: {e}"
    ) from None
  if not isinstance(task, Task):
    raise ValueError(
        f"{_FIELD}={spec!r}: returned {type(task).__name__}, not a "
        "maxtext.env.tasks.Task"
    )
  return task
