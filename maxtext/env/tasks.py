"""A task: its records, its environment, its demonstrations; loaded by name.

A GRPO run on text names its task in `config.grpo_task` as
`module:factory` (e.g. `maxtext.env.math_task:make_task`); the factory is
called as `factory(num_eval=..., seed=...)`, and with `inputs=TaskInputs(...)`
too when the config names input files (a task that reads a user's files,
e.g. `benchmark_task`), and returns a `Task`:

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
import inspect
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


@dataclasses.dataclass(frozen=True)
class TaskInputs:
  """The files a task reads (a GRPO run's `grpo_task_*` fields:
  `grpo/tasks/task_config.TaskConfig.task_inputs`).

  Attributes:
    curriculum_path: the training records, in order (JSONL).
    curriculum_sha256: its published SHA-256 (hex).
    validation_path: the held-out records (JSONL).
    validation_sha256: its SHA-256.
    rootfs_dir: the directory of the tasks' root filesystems.
    prompt_path: the prompt template ("" = the task's own).
    prompt_sha256: its SHA-256 ("" with no prompt_path).
  """

  curriculum_path: str = ""
  curriculum_sha256: str = ""
  validation_path: str = ""
  validation_sha256: str = ""
  rootfs_dir: str = ""
  prompt_path: str = ""
  prompt_sha256: str = ""

  def given(self) -> bool:
    """Whether any field is set."""
    return any(dataclasses.astuple(self))


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


def load(
    spec: str,
    num_eval: int,
    seed: int,
    inputs: Optional[TaskInputs] = None,
) -> Task:
  """The task `spec` ("module:factory") names, made.

  Args:
    spec: "module:factory".
    num_eval, seed: the factory's arguments.
    inputs: the files the task reads; given (any field set), the factory
      is called with `inputs=` too, and must take it.

  Raises:
    ValueError: one line naming the field: not module:factory, an import
      that fails, no such factory, inputs the factory does not take, or
      not a Task; the factory's own refusals of its inputs.
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
  arguments = {"num_eval": num_eval, "seed": seed}
  if inputs is not None and inputs.given():
    if "inputs" not in inspect.signature(factory).parameters:
      raise ValueError(
          f"{_FIELD}={spec!r} reads no input files, but config.grpo_task_* "
          f"names some: {inputs}"
      )
    arguments["inputs"] = inputs
  try:
    task = factory(**arguments)
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
