"""Where episodes' environments live and answer: the executor seam.

The episode runner (`episodes.run`) never calls an environment itself: it
opens a step's episodes through an `Executor`, which makes each episode's
environment (`make_environment(task)`) where its tools will run and keeps
it there, and the runner hands every model turn and the verifier to the
`Batch` it got back:

    batch = executor.open(make_environment, tasks, episode_seconds, clock)
    batch.started[i]                    # episode i's kind, tools, messages
    batch.step({i: model_text, ...})    # {i: Reply or Fault}
    batch.rewards({i: timed_out, ...})  # {i: reward (or None) or Fault}
    batch.close()

Answers are keyed by the episode's index in `tasks`, so a result can never
land on another episode, whatever order the calls end in.

`LocalExecutor` (config `grpo_tool_executor="local"`, the default) keeps the
environments in this process and calls them one after another, in the
episodes' order, on process 0's host alone. `ray_executor.RayExecutor`
(`"ray"`) keeps them on a pool of Ray actors and has many episodes' calls in
flight at once. Only a remote executor returns a `Fault`: the call did not
end with an answer (its actor died or was lost with its node, or it did
not answer within its deadline); the runner ends that episode as invalid
(`Episode.executor_error`). An exception an environment itself raises is a
bug and propagates from every executor with its traceback.
"""

import abc
import dataclasses
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from maxtext.core import component_config
from maxtext.env import environment

# The executors a config may name (`grpo_tool_executor`).
LOCAL = "local"
RAY = "ray"

MakeEnvironment = Callable[[dict[str, Any]], environment.Environment]


@dataclasses.dataclass(frozen=True)
class Started:
  """An opened episode: what its environment said at the start.

  Attributes:
    kind: the environment's task kind.
    tools: its tools' JSON schemas (None: no tools).
    messages: its first messages.
  """

  kind: str
  tools: Optional[list[dict[str, Any]]]
  messages: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Fault:
  """A call that ended without an answer (one line: what happened)."""

  reason: str


class ExecutorError(RuntimeError):
  """An executor cannot go on at all (one line): an episode could not be
  opened, or the pool cannot start."""


class Batch(abc.ABC):
  """One `run`'s episodes, opened by an executor.

  Attributes:
    started: per episode, in the order of the tasks: its `Started`.
    opened_at: per episode: the runner's clock when it was opened (the
      start of its wall-time limit).
  """

  started: list[Started]
  opened_at: list[float]

  @abc.abstractmethod
  def step(self, turns: Mapping[int, str]) -> dict[int, Union[Any, Fault]]:
    """Each episode's environment's answer (`environment.Reply`) to its
    model turn `turns[i]`, or a Fault."""

  @abc.abstractmethod
  def rewards(
      self, timed_out: Mapping[int, bool]
  ) -> dict[int, Union[Optional[float], Fault]]:
    """Each episode's reward: its environment's `timed_out_reward()` where
    `timed_out[i]`, else its `reward()`; or a Fault."""

  @abc.abstractmethod
  def close(self) -> None:
    """Frees every episode's environment (its sandbox)."""


class Executor(abc.ABC):
  """Makes episodes' environments where their tools run."""

  @abc.abstractmethod
  def open(
      self,
      make_environment: MakeEnvironment,
      tasks: Sequence[dict[str, Any]],
      episode_seconds: float,
      clock: Callable[[], float],
  ) -> Batch:
    """Makes one environment per task and starts it.

    Args:
      make_environment: task record -> its Environment (run where the
        environment lives: a remote executor pickles it).
      tasks: the episodes' task records.
      episode_seconds: each episode's wall time: its environment's
        `deadline` is this far after its making, on the clock of the host
        that runs its tools.
      clock: the runner's clock (`Batch.opened_at`).

    Raises:
      ExecutorError: an episode could not be opened (one line).
    """

  def close(self) -> None:
    """Frees what the executor holds (a remote pool)."""


class _LocalBatch(Batch):
  """Environments in this process, called in the episodes' order."""

  def __init__(self, make_environment, tasks, episode_seconds, clock):
    self._envs: list[environment.Environment] = []
    self.started, self.opened_at = [], []
    try:
      for task in tasks:
        self.opened_at.append(clock())
        env = make_environment(task)
        self._envs.append(env)
        env.deadline = time.monotonic() + episode_seconds
        self.started.append(Started(env.kind, env.tools, env.start()))
    except BaseException:
      self.close()
      raise

  def step(self, turns):
    return {i: self._envs[i].step(text) for i, text in turns.items()}

  def rewards(self, timed_out):
    return {
        i: self._envs[i].timed_out_reward() if late else self._envs[i].reward()
        for i, late in timed_out.items()
    }

  def close(self):
    for env in self._envs:
      env.close()


class LocalExecutor(Executor):
  """Every environment in this process, one call after another (module
  docstring)."""

  def open(self, make_environment, tasks, episode_seconds, clock):
    return _LocalBatch(make_environment, tasks, episode_seconds, clock)


@dataclasses.dataclass(frozen=True)
class ExecutorConfig(component_config.ComponentConfig):
  """Which executor a run's episodes use (the config's fields).

  Attributes:
    grpo_tool_executor: LOCAL or RAY.
    grpo_ray_address: the Ray cluster's address; "" starts a Ray instance
      on this host.
    grpo_ray_actors: the Ray pool's actors, one call at a time each.
    grpo_ray_call_timeout_seconds: the most one remote call may take
      before its episode ends as invalid.
    check_sandbox: each actor checks at its start that bubblewrap runs on
      its node (the tools run isolated and the task uses the sandbox); the
      caller's to set.
  """

  grpo_tool_executor: str = LOCAL
  grpo_ray_address: str = ""
  grpo_ray_actors: int = 4
  grpo_ray_call_timeout_seconds: float = 900.0
  check_sandbox: bool = False
