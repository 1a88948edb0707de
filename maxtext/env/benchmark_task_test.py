"""The benchmark's inputs: digests, records, root filesystems, the CodeAct
tools and the reward, on tiny files in the same formats and the real
sandbox (bubblewrap)."""

import json
import os
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.env import benchmark_task
from maxtext.env import sandbox
from maxtext.env import tasks
from maxtext.env import tiny_benchmark_inputs
from maxtext.env import tool_calls

SPEC = "maxtext.env.benchmark_task:make_task"


def _call(name, **arguments) -> str:
  return tool_calls.format_xml(tool_calls.ToolCall(name, arguments))


def _edit(**arguments) -> str:
  return _call("str_replace_editor", **arguments)


def ids(records) -> list[str]:
  return [r["instance_id"] for r in records]


class BenchmarkTaskTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    sandbox.check_available()
    cls.directory = tempfile.mkdtemp()
    cls.files = tiny_benchmark_inputs.write(cls.directory)
    cls.inputs = tasks.TaskInputs(**cls.files)
    with open(cls.files["curriculum_path"], encoding="utf-8") as f:
      cls.lines = f.read().splitlines()
    # An absolute link in an image resolves on the host, out of the image.
    image = json.loads(cls.lines[1])["docker_image"]
    os.symlink("/etc", os.path.join(
        cls.files["rootfs_dir"], benchmark_task.rootfs_name(image), "escape"
    ))  # fmt: skip

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.directory)
    super().tearDownClass()

  def _task(self, num_eval=2, **changes):
    return tasks.load(
        SPEC, num_eval, 0, tasks.TaskInputs(**dict(self.files, **changes))
    )

  def _file(self, text: str, name="records.jsonl"):
    path = self.create_tempfile(name, content=text).full_path
    return path, benchmark_task.sha256_of(path)

  def test_the_curriculum_in_order_and_the_validation_set(self):
    task = self._task()
    self.assertEqual(task.kind, "swe")
    self.assertEqual(
        ids(task.train_records(0, 2)), ["tiny-funcs-0", "tiny-funcs-1"]
    )
    # Step 1 goes on in order and wraps to the start after the last.
    self.assertEqual(
        ids(task.train_records(1, 2)), ["tiny-funcs-2", "tiny-funcs-0"]
    )
    self.assertEqual(ids(task.eval_records()), ["tiny-funcs-3", "tiny-funcs-4"])
    self.assertEqual(ids(self._task(num_eval=1).eval_records()),
                     ["tiny-funcs-3"])  # fmt: skip
    with self.assertRaisesRegex(ValueError, r"grpo_eval_prompts=3: .* 2 rec"):
      self._task(num_eval=3)

  def test_a_wrong_digest_is_refused_before_the_file_is_read(self):
    path, _ = self._file("not json at all\n")
    expected = "0" * 64
    with self.assertRaises(ValueError) as caught:
      self._task(curriculum_path=path, curriculum_sha256=expected)
    message = str(caught.exception)
    self.assertEqual(message.count("\n"), 0)
    self.assertIn(path, message)
    self.assertIn(expected, message)
    self.assertIn(benchmark_task.sha256_of(path), message)
    self.assertIn("grpo_task_curriculum_sha256", message)
    with self.assertRaisesRegex(ValueError, "grpo_task_validation_sha256"):
      self._task(validation_sha256="f" * 64)
    with self.assertRaisesRegex(ValueError, "64 lowercase hex digits"):
      self._task(curriculum_sha256="F" * 64)

  @parameterized.named_parameters(
      ("not_json", lambda r: "{oops", "not JSON"),
      ("not_an_object", lambda r: "[1, 2]", "not a JSON object"),
      ("no_problem", lambda r: r.pop("problem_statement") and None,
       "field 'problem_statement': missing"),
      ("command_not_text", lambda r: r.update(test_command=["ls"]),
       "field 'test_command'"),
      ("relative_workdir", lambda r: r.update(workdir="testbed"),
       "field 'workdir'"),
      ("workdir_not_in_image", lambda r: r.update(workdir="/nowhere"),
       "field 'workdir': /nowhere is not a directory"),
      ("workdir_links_out", lambda r: r.update(workdir="/escape"),
       "field 'workdir': /escape is not a directory"),
      ("test_file_is_the_workdir", lambda r: r.update(test_files={".": ""}),
       "field 'test_files': '.' is outside"),
      ("no_rootfs", lambda r: r.update(docker_image="other/image:1"),
       "field 'docker_image': 'other/image:1' has no root filesystem"),
      ("test_file_outside", lambda r: r.update(test_files={"../x": "y"}),
       "field 'test_files': '../x' is outside"),
      ("test_files_not_text", lambda r: r.update(test_files={"a": 1}),
       "field 'test_files'"),
  )  # fmt: skip
  def test_a_malformed_record_is_refused_naming_file_line_field(
      self, change, message
  ):
    record = json.loads(self.lines[1])
    changed = change(record)
    line = changed if isinstance(changed, str) else json.dumps(record)
    path, digest = self._file("\n".join([self.lines[0], line]) + "\n")
    with self.assertRaises(ValueError) as caught:
      self._task(curriculum_path=path, curriculum_sha256=digest)
    self.assertIn(f"{path}:2: {message}", str(caught.exception))
    self.assertEqual(str(caught.exception).count("\n"), 0)

  def test_a_duplicate_id_and_an_empty_file_are_refused(self):
    path, digest = self._file("\n".join(self.lines[:2] + self.lines[:1]))
    with self.assertRaisesRegex(
        ValueError, rf"{path}:3: field 'instance_id': .* also line 1's"
    ):
      self._task(curriculum_path=path, curriculum_sha256=digest)
    path, digest = self._file("\n\n", "empty.jsonl")
    with self.assertRaisesRegex(ValueError, f"{path}: no records"):
      self._task(validation_path=path, validation_sha256=digest)

  def test_inputs_are_required_and_other_tasks_take_none(self):
    # Every input the task reads, named in one line before any is read.
    with self.assertRaisesRegex(
        ValueError,
        r"^config.grpo_task_curriculum_path, grpo_task_curriculum_sha256, "
        r"grpo_task_validation_path, grpo_task_validation_sha256, "
        r"grpo_task_rootfs_dir: empty; [^\n]*$",
    ):
      tasks.load(SPEC, 2, 0)
    with self.assertRaisesRegex(
        ValueError, r"^config.grpo_task_validation_sha256: empty; "
    ):
      self._task(validation_sha256="")
    with self.assertRaisesRegex(ValueError, "reads no input files"):
      tasks.load("maxtext.env.math_task:make_task", 2, 0, self.inputs)
    with self.assertRaisesRegex(ValueError, "grpo_task_rootfs_dir='/nowhere'"):
      self._task(rootfs_dir="/nowhere")

  def test_an_episode_fixes_the_bug_in_the_task_image(self):
    task = self._task()
    record = task.train_records(0, 1)[0]
    env = task.make_environment(record, tasks.ToolSettings())
    self.addCleanup(env.close)
    self.assertEqual(
        [t["function"]["name"] for t in env.tools],
        ["execute_bash", "str_replace_editor", "finish"],
    )
    system, user = env.start()
    self.assertIn("/testbed", system["content"])
    self.assertIn(record["problem_statement"], user["content"])
    # The image's own root: its os-release, not the host's programs; the
    # hidden test is not in the repository.
    reply = env.step(_call(
        "execute_bash",
        command="cat /etc/os-release; ls /usr/bin; pwd; ls tests; "
        "bash tests/test_funcs.sh && echo visible-pass",
    ))  # fmt: skip
    self.assertFalse(reply.done)
    (out,) = [m["content"] for m in reply.messages]
    self.assertIn("maxtext tiny rootfs", out)
    self.assertNotIn("python3", out)
    self.assertIn("/testbed\ntest_funcs.sh\nvisible-pass", out)
    self.assertIn("[exit code 0]", out)
    self.assertEqual(env.reward(), 0.0)
    path, old, new = tiny_benchmark_inputs.fix(record)
    absolute = f"/testbed/{path}"
    reply = env.step(
        _edit(command="view", path=absolute,
              view_range="[1, 2]")
        + _edit(command="str_replace", path=absolute,
                old_str=old, new_str=new)
        + _edit(command="create",
                path="/testbed/notes/fix.txt", file_text="fixed\n")
        + _edit(command="view", path="/testbed")
    )  # fmt: skip
    self.assertEqual(reply.tool_errors, 0, reply)
    view, edit, create, listing = [m["content"] for m in reply.messages]
    self.assertEqual(view.splitlines()[0], f"     1\t{old}")
    self.assertLen(view.splitlines(), 2)
    self.assertIn(f"\t{new}", edit)
    self.assertIn("File created", create)
    self.assertIn("/testbed/notes/fix.txt", listing.splitlines())
    reply = env.step(_call("execute_bash", command="cat notes/fix.txt")
                     + _call("finish", message="done"))  # fmt: skip
    self.assertTrue(reply.done)
    self.assertIn("fixed", reply.messages[0]["content"])
    self.assertEqual(env.reward(), 1.0)
    # The image itself is untouched: edits went to the episode's scratch.
    with open(os.path.join(record["source"], path), encoding="utf-8") as f:
      self.assertIn(old, f.read())

  def test_tool_errors_answer_and_the_episode_goes_on(self):
    task = self._task()
    env = task.make_environment(task.eval_records()[0], tasks.ToolSettings())
    self.addCleanup(env.close)
    reply = env.step(
        _edit(command="view", path="lib/funcs.sh")
        + _edit(command="view", path="/etc/os-release")
        + _edit(command="view", path="/testbed/missing.sh")
        + _edit(command="str_replace", path="/testbed/lib/funcs.sh",
                 old_str="echo", new_str="printf")
        + _edit(command="str_replace", path="/testbed/lib/funcs.sh",
                 old_str="no such text", new_str="x")
        + _edit(command="create", path="/testbed/lib/funcs.sh",
                 file_text="x")
        + _edit(command="delete", path="/testbed/lib/funcs.sh")
        + _edit(command="view", path="/testbed/lib/funcs.sh",
                 view_range="[3, 99]")
        + _call("execute_bash", command=" ")
        + _call("execute_bash", command="echo x > /usr/evil; exit 3")
    )  # fmt: skip
    self.assertFalse(reply.done)
    texts = [m["content"] for m in reply.messages]
    self.assertEqual(reply.tool_errors, 9, texts)
    for text, expected in zip(texts, [
        "give an absolute path", "outside /testbed", "no such file",
        "occurs 7 times", "occurs 0 times", "already exists",
        "one of view, create, str_replace", "lines are 1 to 6",
        "the command is empty", "Read-only file system",
    ]):  # fmt: skip
      self.assertIn(expected, text)
    self.assertIn("[exit code 3]", texts[-1])

  def test_edited_tests_and_links_do_not_pass(self):
    task = self._task()
    record = task.train_records(0, 1)[0]
    env = task.make_environment(record, tasks.ToolSettings())
    self.addCleanup(env.close)
    # The hidden test written as a passing one, then the tests directory
    # made a link out of the repository: the reward writes the real test
    # and refuses the link.
    env.step(
        _call(
            "execute_bash",
            command="printf 'exit 0' > "
            "tests/test_bug.sh; echo 'exit 0' > tests/test_funcs.sh",
        )
    )
    self.assertEqual(env.reward(), 0.0)
    env.step(_call("execute_bash", command="rm -r tests; ln -s /tmp tests"))
    self.assertEqual(env.reward(), 0.0)

  def test_what_the_model_writes_never_hangs_or_crashes_the_host(self):
    task = self._task()
    record = task.train_records(0, 1)[0]
    env = task.make_environment(record, tasks.ToolSettings())
    self.addCleanup(env.close)
    path, old, new = tiny_benchmark_inputs.fix(record)
    # FIFOs as a tool would make them (the tiny image has no mkfifo).
    scratch = env._box.scratch  # pylint: disable=protected-access
    os.mkfifo(os.path.join(scratch, "pipe"))
    os.mkfifo(os.path.join(scratch, "tests", "test_bug.sh"))
    reply = env.step(
        _edit(command="str_replace", path=f"/testbed/{path}", old_str=old,
              new_str=new)
        + _call("execute_bash", command="ls -l pipe")
        + _edit(command="view", path="/testbed/pipe")
        + _edit(command="str_replace", path="/testbed/pipe", old_str="a")
        + _call("execute_bash", command="echo " + "x" * 40000)
        + _call("execute_bash", command="echo a\0b")
        + _edit(command="view", path="/testbed", view_range="[1")
        + '<tool_call>{"name": "execute_bash", "arguments": {"command": 7}}'
        + "</tool_call>"
    )  # fmt: skip
    texts = [m["content"] for m in reply.messages]
    self.assertEqual(reply.tool_errors, 6, texts)
    for text, expected in zip(texts[2:], [
        "not a regular file", "not a regular file",
        "longer than 32768 characters", "cannot start: embedded null byte",
        "'view_range': must be array", "'command': must be string",
    ]):  # fmt: skip
      self.assertIn(expected, text)
    # The hidden test, a FIFO now, is written again: the fix scores.
    self.assertEqual(env.reward(), 1.0)

  def test_a_pinned_prompt_template(self):
    template = {"system": "Work in ${workdir}.",
                "user": "[${instance_id}] ${problem_statement}"}  # fmt: skip
    path, digest = self._file(json.dumps(template), "prompt.json")
    task = self._task(prompt_path=path, prompt_sha256=digest)
    record = task.eval_records()[0]
    env = task.make_environment(record, tasks.ToolSettings())
    self.addCleanup(env.close)
    self.assertEqual(env.start(), [
        {"role": "system", "content": "Work in /testbed."},
        {"role": "user", "content": "[tiny-funcs-3] "
         + record["problem_statement"]},
    ])  # fmt: skip
    with self.assertRaisesRegex(ValueError, "grpo_task_prompt_sha256"):
      self._task(prompt_path=path, prompt_sha256="a" * 64)
    template["user"] = "${problem} and ${workdir}"
    path, digest = self._file(json.dumps(template), "bad.json")
    with self.assertRaisesRegex(
        ValueError, rf"{path}: field 'user': unknown placeholder.*'problem'"
    ):
      self._task(prompt_path=path, prompt_sha256=digest)

  def test_a_root_filesystem_needs_isolation(self):
    task = self._task()
    with self.assertRaisesRegex(ValueError, "needs bubblewrap"):
      task.make_environment(
          task.eval_records()[0], tasks.ToolSettings(isolated=False)
      )


if __name__ == "__main__":
  absltest.main()
