r"""Benchmark: a rollout's tools through the local executor and Ray actors.

Runbook:

  tools/bazel run //tools/benchmarks:tool_executor_bench -- \
      [--episodes=16] [--turns=3] [--sleep_seconds=0.5] [--actors=1,2,4]

Plays `--episodes` episodes of `--turns` model turns through
`maxtext.env.episodes.run`, each turn one tool call that runs
`sleep --sleep_seconds` in the episode's bubblewrap sandbox (a test run
that waits rather than computes, so the figures show how many calls are in
flight, not this machine's cores), first through the local executor (one
call after another, in process 0), then through a pool of 1, 2 and 4 Ray
actors (`--actors`) on one Ray instance started here. The policy is a
function that writes the tool call, so generation costs nothing. Each row:
the rollout's wall time, episodes per second, the speed-up over the local
executor and the episodes that ended with an executor error (0 expected).
The last line:

  tool_executor_bench: local_episodes_per_s=<r> ray<k>_episodes_per_s=<r> ...

Where bubblewrap cannot run, `--isolated=false` runs the tools unisolated.
"""

import os
import shutil
import tempfile
import time

from absl import app
from absl import flags

# pylint: disable-next=import-error  # In the @pypi_ray lock, not lint's.
import ray

from maxtext.env import environment
from maxtext.env import episodes
from maxtext.env import executor
from maxtext.env import ray_executor
from maxtext.env import sandbox
from maxtext.env import tool_calls
from maxtext.generation import sampling
from maxtext.text import byte_chat
from maxtext.text import chat

_EPISODES = flags.DEFINE_integer("episodes", 16, "Episodes in the rollout.")
_TURNS = flags.DEFINE_integer("turns", 3, "Model turns (tool calls) each.")
_SLEEP = flags.DEFINE_float("sleep_seconds", 0.5, "Each tool call's sleep.")
_ACTORS = flags.DEFINE_list("actors", ["1", "2", "4"], "Ray pool sizes.")
_ISOLATED = flags.DEFINE_bool(
    "isolated", True, "Run the tools under bubblewrap."
)


class Sleeper(environment.ToolEnvironment):
  """An episode whose one tool sleeps in its sandbox."""

  def __init__(self, task):
    super().__init__("sleep")
    self._prompt = task["prompt"]
    self._seconds = task["seconds"]
    self._box = sandbox.Sandbox(
        {}, sandbox.Limits(wall_seconds=60), task["isolated"]
    )
    self.add_tool("wait", self.wait, "Sleeps.")

  def start(self):
    return [{"role": "user", "content": self._prompt}]

  def wait(self) -> str:
    result = self._box.run(
        ["sleep", str(self._seconds)], deadline=self.deadline
    )
    if not result.ok:
      raise environment.ToolError(result.error or result.stderr)
    return "slept"

  def close(self):
    self._box.close()


def _policy(tokenizer: chat.ChatTokenizer):
  """A generation function whose every turn calls `wait`."""
  text = tool_calls.format_xml(tool_calls.ToolCall("wait", {}))
  ids = tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
  ids.append(tokenizer.end_of_turn_id)

  def generate(contexts, options, budgets):
    del options, budgets
    return [episodes.Completion(ids, [0.0] * len(ids)) for _ in contexts]

  return generate


def measure(pool, tokenizer) -> tuple[float, int]:
  """(the rollout's wall seconds, its episodes with an executor error)."""
  tasks = [
      {
          "prompt": f"episode {i}",
          "seconds": _SLEEP.value,
          "isolated": _ISOLATED.value,
      }
      for i in range(_EPISODES.value)
  ]
  options = sampling.SamplingOptions(
      max_new_tokens=64, stop_ids=tokenizer.stop_ids
  )
  limits = episodes.Limits(
      max_turns=_TURNS.value, max_tokens=100 * _TURNS.value + 100
  )
  began = time.perf_counter()
  played = episodes.run(
      tasks,
      Sleeper,
      tokenizer,
      _policy(tokenizer),
      options,
      limits,
      executor=pool,
  )
  wall = time.perf_counter() - began
  for e in played:
    if e.tool_errors:
      raise RuntimeError(f"a tool call failed: {e.model_text}")
  return wall, sum(bool(e.executor_error) for e in played)


def _row(name, actors, wall, errors, local_wall) -> str:
  rate = _EPISODES.value / wall
  return (
      f"{name:<9} {actors:>6} {_EPISODES.value:>8} {wall:>8.2f} "
      f"{rate:>10.2f} {local_wall / wall:>8.2f} {errors:>6}"
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _ISOLATED.value:
    sandbox.check_available()
  sizes = [int(a) for a in _ACTORS.value]
  with tempfile.TemporaryDirectory() as directory:
    tokenizer = chat.ChatTokenizer.load(byte_chat.write(directory))
  print(
      f"tool_executor_bench: {_EPISODES.value} episodes x {_TURNS.value} "
      f"tool calls of {_SLEEP.value:g} s; {os.cpu_count()} CPUs here"
  )
  print(
      f"{'executor':<9} {'actors':>6} {'episodes':>8} {'wall_s':>8} "
      f"{'episodes/s':>10} {'speedup':>8} {'errors':>6}"
  )
  local_wall, errors = measure(executor.LocalExecutor(), tokenizer)
  print(_row("local", "-", local_wall, errors, local_wall), flush=True)
  summary = [f"local_episodes_per_s={_EPISODES.value / local_wall:.3f}"]
  ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Short: sockets.
  ray.init(
      num_cpus=max(sizes),
      include_dashboard=False,
      log_to_driver=False,
      # Nothing large travels: Ray's least object store.
      object_store_memory=80 << 20,
      _temp_dir=ray_dir,
  )
  try:
    for size in sizes:
      pool = ray_executor.RayExecutor(
          executor.ExecutorConfig(
              executor.RAY, "", size, 600.0, _ISOLATED.value
          )
      )
      try:
        # The actors start before the clock runs.
        pool.open(Sleeper, [], 60.0, time.monotonic).close()
        wall, errors = measure(pool, tokenizer)
      finally:
        pool.close()
      print(_row("ray", size, wall, errors, local_wall), flush=True)
      summary.append(f"ray{size}_episodes_per_s={_EPISODES.value / wall:.3f}")
  finally:
    ray.shutdown()
    shutil.rmtree(ray_dir, ignore_errors=True)
  print("tool_executor_bench: " + " ".join(summary))


if __name__ == "__main__":
  app.run(main)
