"""The executor seam and the local executor, with real environments.

The ray executor has its own test (`ray_executor_test`, a real Ray); this
target has no Ray, so asking for it is refused in one line, as a product
without the ray lock refuses it.
"""

import itertools

from absl.testing import absltest

from maxtext.core import choices
from maxtext.env import environment
from maxtext.env import executor
from maxtext.env import executors


class Echo(environment.ToolEnvironment):
  """Echoes its task's name from a tool; reward: the turns it answered."""

  made = []

  def __init__(self, task):
    super().__init__("echo")
    if task.get("broken"):
      raise ValueError(f"task {task['name']}: broken")
    self.name = task["name"]
    self.turns = 0
    self.closed = False
    self.add_tool("name", lambda: self.name, "Says the episode's name.")
    Echo.made.append(self)

  def start(self):
    return [{"role": "user", "content": f"you are {self.name}"}]

  def step(self, text):
    self.turns += 1
    return environment.Reply(
        [{"role": "tool", "content": f"{self.name}: {text}"}], False, 1, 0
    )

  def reward(self):
    return float(self.turns)

  def timed_out_reward(self):
    return -1.0

  def close(self):
    self.closed = True


class LocalExecutorTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    Echo.made = []
    ticks = itertools.count()
    self.clock = lambda: float(next(ticks))

  def _open(self, names, seconds=60.0):
    return executor.LocalExecutor().open(
        Echo, [{"name": n} for n in names], seconds, self.clock
    )

  def test_open_makes_each_environment_in_order_with_its_deadline(self):
    batch = self._open(["a", "b", "c"], seconds=600.0)
    self.assertEqual([e.name for e in Echo.made], ["a", "b", "c"])
    self.assertEqual(
        batch.started[1],
        executor.Started(
            "echo",
            Echo.made[1].tools,
            [{"role": "user", "content": "you are b"}],
        ),
    )
    # The clock is read as each episode is opened (its time limit).
    self.assertEqual(batch.opened_at, [0.0, 1.0, 2.0])
    for env in Echo.made:
      self.assertIsNotNone(env.deadline)

  def test_answers_are_keyed_by_episode(self):
    batch = self._open(["a", "b", "c"])
    replies = batch.step({2: "x", 0: "y"})
    self.assertEqual(replies[2].messages[0]["content"], "c: x")
    self.assertEqual(replies[0].messages[0]["content"], "a: y")
    self.assertEqual(Echo.made[1].turns, 0)
    self.assertEqual(
        batch.rewards({0: False, 1: True, 2: False}),
        {0: 1.0, 1: -1.0, 2: 1.0},
    )

  def test_close_frees_every_environment(self):
    batch = self._open(["a", "b"])
    batch.close()
    self.assertTrue(all(env.closed for env in Echo.made))

  def test_a_failing_environment_closes_those_made_and_raises(self):
    with self.assertRaisesRegex(ValueError, "task b: broken"):
      executor.LocalExecutor().open(
          Echo,
          [{"name": "a"}, {"name": "b", "broken": True}],
          60.0,
          self.clock,
      )
    self.assertLen(Echo.made, 1)
    self.assertTrue(Echo.made[0].closed)


class SettingsTest(absltest.TestCase):

  def test_the_config_choices_are_the_executors(self):
    self.assertEqual(
        choices.GRPO_TOOL_EXECUTORS, (executor.LOCAL, executor.RAY)
    )
    self.assertIsInstance(
        executors.create(executor.ExecutorConfig(executor.LOCAL)),
        executor.LocalExecutor,
    )

  def test_ray_without_the_ray_package_is_refused_in_one_line(self):
    # This target carries no Ray: the field and the install are named.
    with self.assertRaisesRegex(
        ValueError,
        r"^config.grpo_tool_executor='ray': .*requirements_ray_lock.txt",
    ):
      executors.create(executor.ExecutorConfig(executor.RAY))

  def test_an_unknown_executor_is_refused(self):
    with self.assertRaisesRegex(ValueError, "grpo_tool_executor='dask'"):
      executors.create(executor.ExecutorConfig("dask"))


if __name__ == "__main__":
  absltest.main()
