"""The ray executor: episodes' environments on a pool of Ray actors.

`RayExecutor(settings)` (config `grpo_tool_executor="ray"`) connects to the
Ray cluster at `grpo_ray_address` ("" starts a Ray instance on this host) on
its first use and starts `grpo_ray_actors` actors, each a process that
holds one CPU of the cluster and runs one call at a time. Each episode is
opened on one actor (round robin over the step's episodes) and every later
call of that episode, its tools and its verifier, goes to the same actor:
the environment object and its sandbox's scratch directory live in that
process, on that node, for the whole episode. (Moving the files with each
call instead would copy an episode's whole scratch, up to its size limit,
twice per call, and lose the environment's own state between calls.)

Calls of different actors are in flight at once: a step's rollout takes
about the pool's share of the tools' time, not their sum. Each actor has at
most one call in flight, and every call has a deadline,
`grpo_ray_call_timeout_seconds` from its submission; the driver waits on
nothing without one, so a rollout never hangs on the pool.

Faults end the episode, not the run (`executor.Fault`, the runner's
`Episode.executor_error`): an actor that dies (its process, or its node
leaving the cluster) fails the call in flight; a call past its deadline
fails, and its actor is killed, since it may be stuck; Ray restarts a
dead or killed actor (on any node with a free CPU), and the episodes it
held find their environments gone (their files were on it), so their next
call fails too. Opening an episode is the only call retried, once, on the
next actor: it changes nothing until it succeeds, and without its first
messages the episode has no prompt; an episode that cannot be opened twice
raises `executor.ExecutorError`. An exception the environment itself
raises is a bug: it propagates with its remote traceback, as from the
local executor.

The actors make their environments with the same code as the local
executor, so tools run in the same bubblewrap sandbox on the actor's node
(`sandbox.py`: no network, a clean environment, a user that owns nothing,
the same limits): the policy's commands reach neither the cluster's ports
nor its credentials. With `check_sandbox` each actor refuses to start, in
one line, where bubblewrap cannot run.
"""

import atexit
import collections
import os
import shutil
import socket
import tempfile
import time
from typing import Any, Callable
import uuid

# pylint: disable-next=import-error  # In the @pypi_ray lock, not lint's.
import ray

from maxtext.env import executor as executor_lib
from maxtext.env import sandbox

_LOST = "its environment is gone: the actor that held it was restarted"


class _Host:
  """One actor of the pool: the environments of the episodes it holds,
  keyed by (batch, episode).

  Its sandboxes' scratch directories are made under a directory of its
  own, named by its pool and place in it (`name`), where the sandbox makes
  them on its node (`sandbox.scratch_parent`), made by its first episode:
  removed when the actor starts, so a restarted actor removes what the
  episodes of the process it replaces left there, and by `shutdown`.
  """

  def __init__(self, check_sandbox: bool, name: str):
    self._envs = {}
    # The last batch's make_environment: (its object's id, the function).
    self._maker = ("", None)
    self._root = os.path.join(sandbox.scratch_parent(), name)
    shutil.rmtree(self._root, ignore_errors=True)
    self._problem = ""
    if check_sandbox:
      try:
        sandbox.check_available()
      except sandbox.SandboxUnavailable as e:
        self._problem = str(e)

  def ready(self) -> tuple[str, int, str]:
    """(its node's host name, its process id, why it cannot run tools or
    "")."""
    return socket.gethostname(), os.getpid(), self._problem

  def open(self, key, maker: list, task, seconds: float):
    """Makes and starts episode `key`'s environment; `maker` holds the
    object of the batch's make_environment (in a list, so Ray hands over
    the reference and the function is read once per actor and batch, not
    once per episode: it holds the task, e.g. a whole curriculum)."""
    if not os.path.isdir(self._root):
      os.makedirs(self._root)
      # Searchable by the sandbox's user, like the temporary directory.
      os.chmod(self._root, 0o755)
      tempfile.tempdir = self._root
    (ref,) = maker
    if self._maker[0] != ref.hex():
      self._maker = (ref.hex(), ray.get(ref))
    env = self._maker[1](task)
    try:
      env.deadline = time.monotonic() + seconds
      started = executor_lib.Started(env.kind, env.tools, env.start())
    except BaseException:
      env.close()
      raise
    self._envs[key] = env
    return started

  def step(self, key, text: str):
    env = self._envs.get(key)
    return executor_lib.Fault(_LOST) if env is None else env.step(text)

  def reward(self, key, timed_out: bool):
    env = self._envs.get(key)
    if env is None:
      return executor_lib.Fault(_LOST)
    return env.timed_out_reward() if timed_out else env.reward()

  def close(self, keys) -> None:
    for key in keys:
      env = self._envs.pop(key, None)
      if env is not None:
        env.close()

  def shutdown(self) -> None:
    """Frees every environment and removes the actor's directory."""
    self.close(list(self._envs))
    shutil.rmtree(self._root, ignore_errors=True)


# A call: (the actor's index, what to submit to it).
_Submit = Callable[[Any], "ray.ObjectRef"]


class RayExecutor(executor_lib.Executor):
  """A pool of Ray actors holding episodes' environments (module doc).

  Attributes:
    settings: the executor's settings.
    name: the pool's name (its actors' directories are `<name>_<k>`), set
      when it starts.
    where: per actor, (host name, process id) when the pool started.
  """

  def __init__(self, settings: executor_lib.ExecutorConfig):
    self.settings = settings
    self.name = ""
    self._actors: list[Any] = []
    self.where: list[tuple[str, int]] = []

  def _pool(self) -> list[Any]:
    """The actors, started (and Ray connected) on first use.

    Raises:
      ExecutorError: one line naming the field: Ray cannot be reached,
        the actors did not start within the call deadline, or an actor's
        node cannot run the sandbox.
    """
    if self._actors:
      return self._actors
    s = self.settings
    if not ray.is_initialized():
      try:
        if s.grpo_ray_address:
          ray.init(address=s.grpo_ray_address, log_to_driver=False)
        else:
          ray.init(
              num_cpus=s.grpo_ray_actors,
              include_dashboard=False,
              log_to_driver=False,
          )
      except (ConnectionError, RuntimeError, ValueError) as e:
        raise executor_lib.ExecutorError(
            f"config.grpo_ray_address={s.grpo_ray_address!r}: Ray cannot be "
            f"reached: {e}"
        ) from None
    host = ray.remote(_Host).options(
        num_cpus=1, max_restarts=-1, max_task_retries=0, max_concurrency=1
    )
    self.name = f"maxtext_ray_{uuid.uuid4().hex[:12]}"
    actors = [
        host.remote(s.check_sandbox, f"{self.name}_{k}")
        for k in range(s.grpo_ray_actors)
    ]
    refs = [a.ready.remote() for a in actors]
    ready, _ = ray.wait(
        refs, num_returns=len(refs), timeout=s.grpo_ray_call_timeout_seconds
    )
    if len(ready) < len(refs):
      _end([a for a, r in zip(actors, refs) if r in ready], s)
      for a in actors:  # Those not started yet never start.
        ray.kill(a, no_restart=True)
      raise executor_lib.ExecutorError(
          f"config.grpo_ray_actors={s.grpo_ray_actors}: {len(ready)} actors "
          f"started within {s.grpo_ray_call_timeout_seconds:g} s "
          "(grpo_ray_call_timeout_seconds); "
          f"the cluster has {ray.cluster_resources().get('CPU', 0):g} CPUs"
      )
    for name, pid, problem in ray.get(refs):
      if problem:
        _end(actors, s)
        raise executor_lib.ExecutorError(
            f"config.grpo_tool_executor='ray': the actor on {name}: {problem}"
        )
      self.where.append((name, pid))
    self._actors = actors
    # Before Ray's own exit handler (registered earlier, run later).
    atexit.register(self.close)
    return actors

  def open(self, make_environment, tasks, episode_seconds, clock):
    actors = self._pool()
    return _RayBatch(
        self, actors, make_environment, tasks, episode_seconds, clock
    )

  def calls(self, calls: dict[int, tuple[int, _Submit]]) -> dict[int, Any]:
    """Runs `calls` (episode -> (actor index, submit)), one in flight per
    actor, each within the call deadline: episode -> its value or a Fault.
    An actor whose call passed its deadline is killed (Ray restarts it).

    Raises:
      ray.exceptions.RayTaskError: the environment itself raised.
    """
    queues = collections.defaultdict(collections.deque)
    for i, (actor, submit) in calls.items():
      queues[actor].append((i, submit))
    inflight, out = {}, {}
    while queues or inflight:
      busy = {actor for _, actor, _ in inflight.values()}
      for actor in [a for a in queues if a not in busy]:
        i, submit = queues[actor].popleft()
        if not queues[actor]:
          del queues[actor]
        deadline = (
            time.monotonic() + self.settings.grpo_ray_call_timeout_seconds
        )
        inflight[submit(self._actors[actor])] = (i, actor, deadline)
      first = min(deadline for _, _, deadline in inflight.values())
      ready, _ = ray.wait(
          list(inflight),
          num_returns=1,
          timeout=max(0.0, first - time.monotonic()),
      )
      for ref in ready:
        i, _, _ = inflight.pop(ref)
        out[i] = _value(ref)
      now = time.monotonic()
      for ref, (i, actor, deadline) in list(inflight.items()):
        if deadline <= now:
          del inflight[ref]
          out[i] = executor_lib.Fault(
              "no answer within "
              f"{self.settings.grpo_ray_call_timeout_seconds:g} s "
              "(grpo_ray_call_timeout_seconds): its actor was restarted"
          )
          ray.kill(self._actors[actor], no_restart=False)
    return out

  def close(self) -> None:
    """Ends the pool's actors, each after freeing what it holds (within
    the call deadline); Ray is left running. Run at exit too."""
    if self._actors and ray.is_initialized():
      _end(self._actors, self.settings)
    self._actors, self.where = [], []


def _end(actors, settings: executor_lib.ExecutorConfig) -> None:
  """Ends `actors`, each after freeing what it holds (`_Host.shutdown`,
  within the call deadline)."""
  _wait([a.shutdown.remote() for a in actors], settings)
  for a in actors:
    ray.kill(a, no_restart=True)


def _wait(refs, settings: executor_lib.ExecutorConfig) -> None:
  """Waits for `refs` within the call deadline, whatever they return (a
  dead actor's call fails: it holds nothing any more)."""
  if refs:
    ray.wait(
        refs,
        num_returns=len(refs),
        timeout=settings.grpo_ray_call_timeout_seconds,
    )


def _value(ref) -> Any:
  """A finished call's value, or a Fault when its actor failed it."""
  try:
    return ray.get(ref)
  except ray.exceptions.RayTaskError:
    raise  # The environment's own exception, with its remote traceback.
  except ray.exceptions.RayError as e:
    lines = str(e).strip().splitlines()
    return executor_lib.Fault(
        f"{type(e).__name__}: {lines[0] if lines else 'the call failed'}"
    )


class _RayBatch(executor_lib.Batch):
  """One run's episodes on the pool: episode i lives on `home[i]`."""

  def __init__(
      self, pool, actors, make_environment, tasks, episode_seconds, clock
  ):
    self._pool = pool
    self._actors = actors
    self._batch = uuid.uuid4().hex
    self.opened_at = [clock()] * len(tasks)
    maker = ray.put(make_environment)
    n = len(actors)
    # Episode i's actor: i % n, or the next one where its opening failed.
    self.home: list[int] = []

    def opener(i):
      return lambda a: a.open.remote(
          (self._batch, i), [maker], tasks[i], episode_seconds
      )

    try:
      started = pool.calls({i: (i % n, opener(i)) for i in range(len(tasks))})
      failed = [i for i, s in started.items() if _fault(s)]
      started.update(pool.calls({i: ((i + 1) % n, opener(i)) for i in failed}))
    except BaseException:
      self.home = [i % n for i in range(len(tasks))]
      self._close_everywhere()
      raise
    self.home = [
        (i + 1) % n if i in failed else i % n for i in range(len(tasks))
    ]
    for i, s in started.items():
      if _fault(s):
        self._close_everywhere()
        raise executor_lib.ExecutorError(
            f"config.grpo_tool_executor='ray': episode {i}'s environment "
            f"could not be opened, twice: {s.reason}"
        )
    self.started = [started[i] for i in range(len(tasks))]

  def _calls(self, method: str, arguments: dict[int, Any]):
    def submit(i, argument):
      return lambda a: getattr(a, method).remote((self._batch, i), argument)

    return self._pool.calls(
        {i: (self.home[i], submit(i, x)) for i, x in arguments.items()}
    )

  def step(self, turns):
    return self._calls("step", turns)

  def rewards(self, timed_out):
    return self._calls("reward", timed_out)

  def close(self):
    keys = collections.defaultdict(list)
    for i, actor in enumerate(self.home):
      keys[actor].append((self._batch, i))
    _wait(
        [self._actors[a].close.remote(held) for a, held in keys.items()],
        self._pool.settings,
    )

  def _close_everywhere(self) -> None:
    """Frees the batch's environments on every actor (an opening that
    failed may have left some on either of its two actors)."""
    keys = [(self._batch, i) for i in range(len(self.home))]
    _wait([a.close.remote(keys) for a in self._actors], self._pool.settings)


def _fault(value) -> bool:
  return isinstance(value, executor_lib.Fault)
