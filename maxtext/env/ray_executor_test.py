"""The ray executor on a real Ray instance, with real faults.

One Ray instance on this host (loopback, no dashboard) serves every test of
the target; each executor starts its own actors (real processes). The tools
run in the real bubblewrap sandbox on the actors. The policy is a
generation function that writes given texts, so each test knows every
turn.
"""

import functools
import glob
import os
import shutil
import signal
import socket
import tempfile
import time

from absl.testing import absltest

# pylint: disable-next=import-error  # In the @pypi_ray lock, not lint's.
import ray

from maxtext.env import environment
from maxtext.env import episodes
from maxtext.env import executor
from maxtext.env import executors
from maxtext.env import ray_executor
from maxtext.env import repair_task
from maxtext.env import sandbox
from maxtext.env import tasks
from maxtext.env import tool_calls
from maxtext.generation import sampling
from maxtext.text import byte_chat
from maxtext.text import chat

_TOOLS = tasks.ToolSettings(sandbox.Limits(wall_seconds=120), True, 60.0)


# Ray's directory: a short one, for the Unix sockets under it.
_RAY_DIR = []


def setUpModule():
  _RAY_DIR.append(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
  # CPUs for the shared pair of actors and one test's pool at a time.
  ray.init(
      num_cpus=5,
      include_dashboard=False,
      log_to_driver=False,
      # Nothing large travels: Ray's least object store.
      object_store_memory=80 << 20,
      _temp_dir=_RAY_DIR[0],
  )


def tearDownModule():
  ray.shutdown()
  shutil.rmtree(_RAY_DIR[0], ignore_errors=True)


def call(name, **arguments) -> str:
  return tool_calls.format_xml(tool_calls.ToolCall(name, arguments))


def _scratches(pool) -> list[str]:
  """The sandbox scratch directories under `pool`'s actors' directories."""
  return glob.glob(
      os.path.join(
          sandbox.scratch_parent(), f"{pool.name}_*", "maxtext_sandbox_*"
      )
  )


class Probe(environment.ToolEnvironment):
  """Tools that run a shell command in the sandbox, say which episode and
  process answer, and kill their own process; reward 1 when the scratch
  holds a file `ok`."""

  def __init__(self, task):
    super().__init__("probe")
    self._name = task["prompt"]
    self._box = sandbox.Sandbox({}, _TOOLS.limits, _TOOLS.isolated)
    self.add_tool("shell", self.shell, "Runs a shell command.")
    self.add_tool("whoami", self.whoami, "Says the episode and process.")
    self.add_tool("die", self.die, "Kills the tool's process.")
    self.add_tool("submit", self.finish, "Ends the episode.")

  def start(self):
    return [{"role": "user", "content": self._name}]

  def shell(self, command: str) -> str:
    result = self._box.run(["/bin/sh", "-c", command], deadline=self.deadline)
    return (
        f"status {result.returncode} {result.error}\n"
        f"{result.stdout}{result.stderr}"
    )

  def whoami(self) -> str:
    return f"I am {self._name} in process {os.getpid()} at {self._box.scratch}"

  def die(self) -> str:
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"

  def reward(self):
    return float(os.path.exists(os.path.join(self._box.scratch, "ok")))

  def close(self):
    self._box.close()


class Scripted:
  """A generation function writing `scripts[key][turn]` for the episode
  whose prompt holds `key`."""

  def __init__(self, chat_tokenizer, scripts):
    self.chat = chat_tokenizer
    self.scripts = scripts

  def __call__(self, contexts, options, budgets):
    del options
    out = []
    for context, budget in zip(contexts, budgets):
      text = self.chat.tokenizer.decode(context, skip_special_tokens=False)
      key = next(k for k in self.scripts if k in text)
      turn = text.count("<|im_start|>assistant") - 1
      ids = self.chat.tokenizer.encode(
          self.scripts[key][turn], add_special_tokens=False
      ).ids + [self.chat.end_of_turn_id]
      out.append(episodes.Completion(ids[:budget], [-0.5] * len(ids[:budget])))
    return out


class RayExecutorTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.chat = chat.ChatTokenizer.load(byte_chat.write(tempfile.mkdtemp()))
    cls.options = sampling.SamplingOptions(
        max_new_tokens=8, temperature=1.0, seed=3, stop_ids=cls.chat.stop_ids
    )
    cls.limits = episodes.Limits(
        max_turns=6, max_tokens=6000, max_turn_tokens=1500
    )
    # Two actor processes, shared by the tests that do not break them.
    cls.pair = executors.create(
        executor.ExecutorConfig(
            executor.RAY, grpo_ray_actors=2, check_sandbox=True
        )
    )

  @classmethod
  def tearDownClass(cls):
    cls.pair.close()
    super().tearDownClass()

  def _run(self, records, make, scripts, pool=None, limits=None):
    return episodes.run(
        records,
        make,
        self.chat,
        Scripted(self.chat, scripts),
        self.options,
        limits or self.limits,
        executor=pool,
    )

  def _pool(self, actors, call_seconds=900.0):
    pool = ray_executor.RayExecutor(
        executor.ExecutorConfig(executor.RAY, "", actors, call_seconds, True)
    )
    self.addCleanup(pool.close)
    return pool

  def test_a_repair_rollout_on_two_actors_has_the_local_records(self):
    records = [repair_task.problem(i) for i in (3, 5)]
    for record in records:
      # unittest prints its own time; the records compared must not.
      record["test_command"] = [
          "/bin/sh",
          "-c",
          "out=$(python3 -B -m unittest -q 2>&1); status=$?; "
          "echo \"$out\" | sed 's/ in [0-9.]*s$//'; exit $status",
      ]
    scripts = {}
    for record in records:
      turns = [
          m["content"]
          for m in repair_task.RepairTask(1).demonstration(record)
          if m["role"] == "assistant"
      ]
      scripts[record["problem_statement"]] = turns
    # The second record's episodes skip the edit: its tests fail, reward 0.
    second = records[1]["problem_statement"]
    scripts[second] = [scripts[second][0]] + scripts[second][2:]
    tasks_ = [r for r in records for _ in range(2)]
    make = functools.partial(
        repair_task.RepairTask(1).make_environment, tools=_TOOLS
    )
    local = self._run(tasks_, make, scripts)
    remote = self._run(tasks_, make, scripts, pool=self.pair)
    self.assertEqual(remote, local)
    self.assertEqual([e.env_reward for e in remote], [1.0, 1.0, 0.0, 0.0])
    self.assertTrue(all(e.done and not e.executor_error for e in remote))
    pids = {pid for _, pid in self.pair.where}
    self.assertLen(pids, 2)
    self.assertNotIn(os.getpid(), pids)
    # The rollout's end freed the episodes' sandboxes on the actors.
    self.assertEqual(_scratches(self.pair), [])

  def test_faults_end_their_episodes_and_the_run_goes_on(self):
    pool = self._pool(3, call_seconds=20.0)
    ok = call("shell", command="touch ok")
    scripts = {
        "episode-A.": [ok, call("die")],  # actor 0: its process dies.
        "episode-B.": [ok, call("submit")],  # actor 1
        "episode-C.": [ok, call("shell", command="sleep 100")],  # actor 2
        "episode-D.": [ok, call("shell", command="true")],  # actor 0
    }
    played = self._run(
        [{"prompt": k} for k in scripts], Probe, scripts, pool=pool
    )
    a, b, c, d = played
    self.assertRegex(a.executor_error, "Actor")
    self.assertEqual((b.executor_error, b.env_reward, b.done), ("", 1.0, True))
    self.assertRegex(c.executor_error, "no answer within 20 s")
    # Its environment went with actor 0: the call reached the restarted
    # actor, or found it still restarting.
    self.assertRegex(
        d.executor_error, "its environment is gone|ActorUnavailableError"
    )
    for e in (a, c, d):
      self.assertIsNone(e.env_reward)
      self.assertEqual(e.turns, 2)  # The turn that failed is kept.
      self.assertFalse(e.done or e.timed_out or e.turn_limit)
    # The pool restarted its actors: the next rollout plays on them.
    again = self._run(
        [{"prompt": k} for k in scripts],
        Probe,
        {k: [ok, call("submit")] for k in scripts},
        pool=pool,
    )
    self.assertEqual([e.env_reward for e in again], [1.0] * 4)
    self.assertTrue(all(not e.executor_error for e in again))
    # Once every actor is up again, nothing of the episodes is left: the
    # rollout freed its own, and each restarted actor removed what its
    # killed process's episodes (A, C, D) had left.
    actors = pool._actors  # pylint: disable=protected-access
    ray.get([actor.ready.remote() for actor in actors], timeout=120)
    self.assertEqual(_scratches(pool), [])
    directories = glob.glob(
        os.path.join(sandbox.scratch_parent(), f"{pool.name}_*")
    )
    self.assertNotEmpty(directories)
    pool.close()
    self.assertFalse(any(os.path.exists(d) for d in directories))

  def test_a_pool_smaller_than_the_episodes_plays_them_all(self):
    pool = self._pool(1)
    names = [f"episode-{k}." for k in range(5)]
    scripts = {
        n: [call("whoami"), call("shell", command="touch ok"), call("submit")]
        for n in names
    }
    played = self._run([{"prompt": n} for n in names], Probe, scripts, pool)
    for name, e in zip(names, played):
      self.assertTrue(e.done and not e.executor_error)
      self.assertEqual(e.env_reward, 1.0)
      said = self.chat.tokenizer.decode(e.ids, skip_special_tokens=False)
      # Each answer is its own episode's, from the one actor.
      self.assertIn(f"I am {name} in process {pool.where[0][1]}", said)
      self.assertEqual(said.count("I am episode-"), 1)
      # Its sandbox was under the actor's own directory.
      home = os.path.join(sandbox.scratch_parent(), f"{pool.name}_0")
      self.assertIn(f" at {home}/maxtext_sandbox_", said)

  def test_an_opening_on_a_dead_actor_is_retried_on_the_next(self):
    pool = self._pool(2)
    pool.open(Probe, [], 60.0, time.monotonic).close()  # Starts the actors.
    # Actor 0 is gone for good (its node left, none to restart it on).
    ray.kill(pool._actors[0], no_restart=True)  # pylint: disable=protected-access
    names = [f"episode-{k}." for k in range(3)]
    scripts = {n: [call("whoami"), call("submit")] for n in names}
    played = self._run([{"prompt": n} for n in names], Probe, scripts, pool)
    for name, e in zip(names, played):
      self.assertTrue(e.done and not e.executor_error)
      said = self.chat.tokenizer.decode(e.ids, skip_special_tokens=False)
      self.assertIn(f"I am {name} in process {pool.where[1][1]}", said)

  def test_a_pool_the_cluster_cannot_hold_is_refused_in_one_line(self):
    pool = self._pool(9, call_seconds=3.0)
    with self.assertRaisesRegex(
        executor.ExecutorError,
        r"^config.grpo_ray_actors=9: [0-8] actors started within 3 s .* "
        r"the cluster has 5 CPUs$",
    ):
      self._run([{"prompt": "episode-Z."}], Probe, {}, pool)
    # No actor made its directory: no episode was opened.
    self.assertEqual(
        glob.glob(os.path.join(sandbox.scratch_parent(), f"{pool.name}_*")),
        [],
    )

  def test_tools_on_an_actor_reach_neither_ray_nor_its_token(self):
    host, port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
    # From the host, the cluster's port answers and its token is there.
    socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
    token = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    self.assertTrue(os.path.isfile(token))
    connect = (
        "python3 -c 'import socket, sys; "
        "socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)' "
    )
    scripts = {
        "episode-X.": [
            call("shell", command=f"{connect} 127.0.0.1 {port}"),
            call("shell", command=f"{connect} {host} {port}"),
            call("shell", command=f"cat {token}"),
            call("shell", command="env"),
            call("submit"),
        ]
    }
    (e,) = self._run([{"prompt": "episode-X."}], Probe, scripts, self.pair)
    said = self.chat.tokenizer.decode(e.ids, skip_special_tokens=False)
    answers = said.split("status ")[1:]
    self.assertLen(answers, 4)
    for answer in answers[:3]:
      self.assertFalse(answer.startswith("0 "), answer)
    self.assertIn("Connection refused", said)
    self.assertIn("No such file", said)
    self.assertTrue(answers[3].startswith("0 "))
    self.assertNotIn("RAY", answers[3])
    self.assertIn("HOME=/task", answers[3])


if __name__ == "__main__":
  absltest.main()
