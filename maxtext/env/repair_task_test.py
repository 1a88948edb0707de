"""The repair task in the real sandbox: bugs caught, fixes rewarded,
demonstrations that solve their task, and tools that refuse escapes."""

import os
import time

from absl.testing import absltest

from maxtext.env import environment
from maxtext.env import repair_task
from maxtext.env import sandbox
from maxtext.env import tasks
from maxtext.env import tool_calls

_SETTINGS = tasks.ToolSettings(sandbox.Limits(wall_seconds=30), True, 30.0)


def _say(env, name, **arguments):
  """The model's turn calling one tool; the tool's reply."""
  reply = env.step(tool_calls.format_xml(tool_calls.ToolCall(name, arguments)))
  return reply


class RepairTaskTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    sandbox.check_available()

  def test_every_bug_fails_a_test_and_its_fix_passes(self):
    for index in range(24):
      record = repair_task.problem(index)
      env = repair_task.RepairEnvironment(record, _SETTINGS)
      try:
        self.assertEqual(env.reward(), 0.0, record["instance_id"])
        fix = record["fix"]
        reply = _say(
            env, "edit_file", path=fix["path"], old=fix["old"], new=fix["new"]
        )
        self.assertEqual(reply.tool_errors, 0, reply)
        self.assertEqual(env.reward(), 1.0, record["instance_id"])
      finally:
        env.close()

  def test_demonstrations_solve_their_task(self):
    task = tasks.load("maxtext.env.repair_task:make_task", 3, 0)
    for record in task.eval_records() + task.train_records(0, 3):
      env = task.make_environment(record, _SETTINGS)
      try:
        messages = task.demonstration(record)
        self.assertEqual(env.start(), messages[:2])
        turns = [m for m in messages if m["role"] == "assistant"]
        tool_replies = [m for m in messages if m["role"] == "tool"]
        for i, turn in enumerate(turns):
          reply = env.step(turn["content"])
          self.assertEqual(reply.tool_errors, 0, reply)
          if i < len(tool_replies):
            self.assertFalse(reply.done)
            self.assertEqual(
                reply.messages[0]["content"].splitlines()[0],
                tool_replies[i]["content"].splitlines()[0],
            )
        self.assertTrue(reply.done)
        self.assertEqual(env.reward(), 1.0)
      finally:
        env.close()

  def test_editing_the_tests_does_not_pass(self):
    record = repair_task.problem(5)
    env = repair_task.RepairEnvironment(record, _SETTINGS)
    self.addCleanup(env.close)
    tests = record["files"]["tests/test_core.py"]
    first = tests[tests.index("    self.assertEqual") :].splitlines()[0]
    reply = _say(
        env,
        "edit_file",
        path="tests/test_core.py",
        old="import unittest\n",
        new="import unittest\nunittest.TestCase.assertEqual = print\n",
    )
    self.assertEqual(reply.tool_errors, 0)
    self.assertIn("tests passed", _say(env, "run_tests").messages[0]["content"])
    self.assertEqual(env.reward(), 0.0)
    self.assertTrue(first)

  def test_tool_errors(self):
    env = repair_task.RepairEnvironment(repair_task.problem(1), _SETTINGS)
    self.addCleanup(env.close)
    for name, arguments, message in (
        ("view_file", {"path": "../../etc/passwd"}, "outside the task's files"),
        ("view_file", {"path": "nope.py"}, "no such file"),
        ("edit_file", {"path": "tests/test_core.py", "old": "zzz", "new": ""},
         "found 0 times"),
        ("view_file", {}, "missing a required argument"),
        ("rm", {}, "no tool 'rm'"),
    ):  # fmt: skip
      reply = _say(env, name, **arguments)
      self.assertEqual(reply.tool_errors, 1, name)
      self.assertIn(message, reply.messages[0]["content"])
      self.assertFalse(reply.done)
    # A test command that hangs: the call is an error, the episode goes on.
    record = dict(repair_task.problem(1))
    record["test_command"] = ["python3", "-c", "while True: pass"]
    hanging = repair_task.RepairEnvironment(
        record, tasks.ToolSettings(sandbox.Limits(wall_seconds=1), True, 1.0)
    )
    self.addCleanup(hanging.close)
    reply = _say(hanging, "run_tests")
    self.assertEqual(reply.tool_errors, 1)
    self.assertIn("limit", reply.messages[0]["content"])
    self.assertEqual(hanging.reward(), 0.0)

  def test_each_call_gets_what_is_left_of_the_episode(self):
    record = dict(repair_task.problem(1))
    record["test_command"] = ["python3", "-c", "while True: pass"]
    env = repair_task.RepairEnvironment(record, _SETTINGS)
    self.addCleanup(env.close)
    # Each call may take 30 s; the episode has 1 s left.
    env.deadline = time.monotonic() + 1
    call = tool_calls.format_xml(tool_calls.ToolCall("run_tests", {}))
    reply = env.step(call * 3)
    texts = [m["content"] for m in reply.messages]
    self.assertEqual(reply.tool_errors, 3, texts)
    self.assertIn("episode's time ran out", texts[0])
    self.assertIn("did not run", texts[1])
    self.assertIn("did not run", texts[2])

  def test_files_the_model_made_never_hang_or_crash_the_host(self):
    record = repair_task.problem(3)
    fix = record["fix"]
    env = repair_task.RepairEnvironment(record, _SETTINGS)
    self.addCleanup(env.close)
    _say(env, "edit_file", path=fix["path"], old=fix["old"], new=fix["new"])
    # The episode's scratch, changed as a tool would change it.
    scratch = env._box.scratch  # pylint: disable=protected-access
    tests_dir = os.path.join(scratch, "tests")
    os.unlink(os.path.join(tests_dir, "test_core.py"))
    os.mkfifo(os.path.join(tests_dir, "test_core.py"))
    os.mkfifo(os.path.join(scratch, "pipe"))
    reply = _say(env, "view_file", path="pipe")
    self.assertIn("not a regular file", reply.messages[0]["content"])
    reply = _say(env, "edit_file", path="pipe", old="a", new="b")
    self.assertIn("not a regular file", reply.messages[0]["content"])
    # The verifier puts its test files back over a FIFO or a deleted
    # directory and scores the fix.
    self.assertEqual(env.reward(), 1.0)
    _say(env, "view_file", path="tests/test_core.py")
    for name in os.listdir(tests_dir):
      os.unlink(os.path.join(tests_dir, name))
    os.rmdir(tests_dir)
    self.assertEqual(env.reward(), 1.0)
    # A tests directory turned into a link out of the task: 0, said why.
    for name in os.listdir(tests_dir):
      os.unlink(os.path.join(tests_dir, name))
    os.rmdir(tests_dir)
    os.symlink(self.create_tempdir().full_path, tests_dir)
    with self.assertLogs(level="WARNING") as logs:
      self.assertEqual(env.reward(), 0.0)
    self.assertIn("leads out of the task", "\n".join(logs.output))

  def test_records_have_r2e_gym_fields(self):
    record = repair_task.problem(2)
    for field in (
        "instance_id", "problem_statement", "files", "test_files",
        "test_command",
    ):  # fmt: skip
      self.assertIn(field, record)
    task = repair_task.make_task(num_eval=4, seed=1)
    held_out = {r["instance_id"] for r in task.eval_records()}
    train = {r["instance_id"] for r in task.train_records(0, 16)}
    self.assertEmpty(held_out & train)
    self.assertIsInstance(
        task.make_environment(record, _SETTINGS), environment.ToolEnvironment
    )


if __name__ == "__main__":
  absltest.main()
