"""The sandbox against hostile tools: each ends with an error or a timeout,
the host is untouched and the next command runs."""

import os
import socket
import tempfile
import threading
import time
import uuid

from absl.testing import absltest

from maxtext.env import sandbox
from maxtext.env import tiny_rootfs

PYTHON = "/usr/bin/python3"


def _python(code: str) -> list[str]:
  return [PYTHON, "-c", code]


def _processes_with(marker: str) -> list[int]:
  """Host pids whose command line holds `marker` (zombies have none)."""
  found = []
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/cmdline", "rb") as f:
        if marker.encode() in f.read():
          found.append(int(name))
    except OSError:
      pass  # Ended while we looked.
  return found


class SandboxTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    sandbox.check_available()
    self.box = sandbox.Sandbox(
        {"pkg/code.py": "X = 1\n", "data.txt": "hello"},
        sandbox.Limits(
            wall_seconds=20,
            cpu_seconds=20,
            memory_bytes=1 << 30,
            file_bytes=1 << 20,
            scratch_bytes=4 << 20,
        ),
    )
    self.addCleanup(self.box.close)

  def _still_works(self):
    result = self.box.run(_python("print(open('data.txt').read())"))
    self.assertTrue(result.ok, result)
    self.assertEqual(result.stdout.strip(), "hello")

  def test_runs_on_the_task_files_and_writes_the_scratch(self):
    result = self.box.run(
        _python(
            "import os; from pkg import code; print(code.X, os.getcwd());"
            "open('out.txt', 'w').write('made')"
        )
    )
    self.assertTrue(result.ok, result)
    self.assertEqual(result.stdout.split(), ["1", sandbox.TASK_DIR])
    with open(os.path.join(self.box.scratch, "out.txt"), encoding="utf-8") as f:
      self.assertEqual(f.read(), "made")

  def test_a_hanging_tool_times_out_and_the_next_runs(self):
    result = self.box.run(_python("while True: pass"), timeout_seconds=1)
    self.assertTrue(result.timed_out)
    self.assertIsNone(result.returncode)
    self.assertIn("limit", result.error)
    self.assertFalse(result.ok)
    self._still_works()

  def test_forked_and_daemonized_children_die_with_the_call(self):
    marker = f"sandbox-fork-{uuid.uuid4().hex}"
    code = (
        "import os, sys, time\n"
        "for _ in range(5):\n"
        "  if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv('/bin/sleep', ['sleep', '1000', '{marker}'])\n"
        "time.sleep(0.5)\n"
        "print('parent done')\n"
    )
    result = self.box.run(_python(code))
    self.assertEqual(result.stdout.strip(), "parent done")
    # The namespace's init ended with the command: the kernel kills the
    # rest; give it a moment to reap them.
    deadline = time.monotonic() + 10
    while _processes_with(marker) and time.monotonic() < deadline:
      time.sleep(0.1)
    self.assertEqual(_processes_with(marker), [])
    # And when the parent hangs instead, the timeout takes them all.
    result = self.box.run(_python(code + "time.sleep(1000)\n"), 2)
    self.assertTrue(result.timed_out)
    deadline = time.monotonic() + 10
    while _processes_with(marker) and time.monotonic() < deadline:
      time.sleep(0.1)
    self.assertEqual(_processes_with(marker), [])
    self._still_works()

  def test_filling_the_disk_fails_the_write(self):
    result = self.box.run(_python("open('big', 'wb').write(b'x' * (8 << 20))"))
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("File too large", result.stderr)
    # The limit is the file size exactly (1 MiB here), not a multiple.
    result = self.box.run(_python("open('edge', 'wb').write(b'x' * (1 << 20))"))
    self.assertTrue(result.ok, result)
    result = self.box.run(
        _python(
            "import os; f = os.open('over', os.O_WRONLY | os.O_CREAT); "
            "print(os.write(f, b'x' * (1 << 20))); os.write(f, b'x')"
        )
    )
    self.assertEqual(result.stdout.strip(), str(1 << 20))
    self.assertIn("File too large", result.stderr)
    # Many files each under the file limit: past the scratch limit.
    result = self.box.run(
        _python(
            "for i in range(8): open(f'f{i}', 'wb').write(b'x' * (900 << 10))"
        )
    )
    self.assertIn("scratch limit", result.error)
    self.assertFalse(result.ok)

  def test_host_files_outside_the_scratch_are_not_there(self):
    with tempfile.NamedTemporaryFile("w", suffix=".secret") as secret:
      secret.write("host secret")
      secret.flush()
      result = self.box.run(_python(f"print(open({secret.name!r}).read())"))
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("FileNotFoundError", result.stderr)
    self.assertNotIn("host secret", result.stdout)
    # The system is read-only.
    result = self.box.run(_python("open('/usr/evil', 'w')"))
    self.assertIn("Read-only file system", result.stderr)

  def test_commands_see_none_of_the_callers_environment(self):
    os.environ["MAXTEXT_SANDBOX_TEST_SECRET"] = "hunter2"
    self.addCleanup(os.environ.pop, "MAXTEXT_SANDBOX_TEST_SECRET")
    for isolated in (True, False):
      with sandbox.Sandbox({}, isolated=isolated) as box:
        result = box.run(_python("import os; print(dict(os.environ))"))
      self.assertTrue(result.ok, result)
      self.assertNotIn("hunter2", result.stdout)
      seen = eval(result.stdout)  # pylint: disable=eval-used  # Our repr.
      self.assertLessEqual(
          set(seen), {"PATH", "HOME", "TMPDIR", "LANG", "PWD"}, isolated
      )

  def test_commands_run_as_a_user_that_owns_nothing_on_the_host(self):
    # As root, the host's root-only files would be readable by their owner.
    result = self.box.run(_python("open('/etc/shadow').read()"))
    self.assertIn("PermissionError", result.stderr)
    # It still edits the task's files, and the host reads what it made.
    result = self.box.run(
        _python(
            "open('data.txt', 'a').write(' world'); "
            "import os; os.makedirs('new/dir'); open('new/dir/f', 'w')"
        )
    )
    self.assertTrue(result.ok, result)
    # On the host, what it made is not owned by the owner of the host's
    # files (root), whoever runs the test.
    made = os.stat(os.path.join(self.box.scratch, "new/dir/f")).st_uid
    self.assertNotEqual(made, os.stat("/etc/shadow").st_uid)
    self.assertNotEqual(made, 0)
    self.assertEqual(self.box.read_file("data.txt"), b"hello world")
    # Files the host writes for a tool stay the tool's to change.
    self.box.write_file("made/by/host.txt", b"1")
    result = self.box.run(_python("open('made/by/host.txt', 'a').write('2')"))
    self.assertTrue(result.ok, result)
    self.assertEqual(self.box.read_file("made/by/host.txt"), b"12")

  def test_empty_entries_count_against_the_scratch(self):
    limits = sandbox.Limits(scratch_bytes=1 << 30, scratch_entries=500)
    make = _python("import os\nfor i in range(600): os.mkdir(f'd{i}')")
    with sandbox.Sandbox({"a": "1"}, limits) as box:
      result = box.run(make)
      self.assertIn("entries (the scratch limit)", result.error)
      self.assertFalse(result.ok)
    # Empty directories take room on disk: counted as bytes too.
    limits = sandbox.Limits(scratch_bytes=1 << 20, scratch_entries=10**6)
    with sandbox.Sandbox({"a": "1"}, limits) as box:
      result = box.run(make)
      self.assertIn("bytes (the scratch limit)", result.error)

  def test_a_command_writing_without_end_is_stopped_while_it_runs(self):
    # Files each under the file limit, written until something stops the
    # command: its 20 s limit, or the scratch limit (4 MiB) on the way.
    fill = _python(
        "i = 0\nwhile True:\n"
        "  open(f'f{i}', 'wb').write(b'x' * (512 << 10)); i += 1"
    )
    result = self.box.run(fill)
    self.assertFalse(result.timed_out, result)
    self.assertEqual(result.returncode, -9)  # Killed, not ended.
    self.assertEqual(
        result.error,
        "the task's files grew by more than 4194304 bytes (the scratch "
        "limit): the command was killed while it ran",
    )
    # Entries too: empty directories made without end.
    limits = sandbox.Limits(
        wall_seconds=20, scratch_bytes=1 << 30, scratch_entries=300
    )
    mkdirs = _python("import os\ni = 0\nwhile True: os.mkdir(f'd{i}'); i += 1")
    for isolated in (True, False):
      with sandbox.Sandbox({"a": "1"}, limits, isolated=isolated) as box:
        result = box.run(mkdirs)
      self.assertFalse(result.timed_out, result)
      self.assertIn(
          "entries (the scratch limit): the command was killed", result.error
      )

  def test_a_call_gets_what_is_left_of_its_episode(self):
    # Its own limit is 20 s; the episode ends in 1 s: the episode's end
    # kills it.
    result = self.box.run(
        _python("import time; time.sleep(100)"),
        deadline=time.monotonic() + 1,
    )
    self.assertTrue(result.timed_out)
    self.assertIn("episode's time ran out", result.error)
    # With no time left nothing runs.
    result = self.box.run(
        _python("open('ran', 'w')"), deadline=time.monotonic() - 1
    )
    self.assertTrue(result.timed_out)
    self.assertIn("did not run", result.error)
    self.assertFalse(os.path.exists(os.path.join(self.box.scratch, "ran")))
    self._still_works()

  def test_arguments_the_os_rejects_are_an_error_result(self):
    for argv in (
        ["/bin/echo", "a\0b"],
        ["/bin/echo", "\ud800"],
        ["/bin/echo", "x" * (1 << 20)],
    ):
      result = self.box.run(argv)
      self.assertIn("cannot start", result.error, argv[1][:10])
      self.assertFalse(result.ok)
    self._still_works()

  def test_host_reads_regular_files_only(self):
    scratch = self.box.scratch
    os.mkfifo(os.path.join(scratch, "fifo"))
    os.symlink("/etc/passwd", os.path.join(scratch, "out"))
    with open(os.path.join(scratch, "big"), "wb") as f:
      f.write(b"x" * (self.box.limits.read_bytes + 1))
    for name, reason in (
        ("fifo", "not a regular file"),
        ("out", "outside the task's files"),
        ("pkg", "not a regular file"),
        ("big", "larger than"),
        ("missing", "no such file"),
        ("a\0b", "outside"),
    ):
      with self.assertRaisesRegex(sandbox.FileRefused, reason):
        self.box.read_file(name)
    for name in ("fifo", "out", "pkg", "a\0b"):
      with self.assertRaisesRegex(sandbox.FileRefused, name[:1]):
        self.box.write_file(name, b"y")
    self.box.write_file("new", b"y", create=True)
    with self.assertRaisesRegex(sandbox.FileRefused, "new: already exists"):
      self.box.write_file("new", b"y", create=True)
    with open("/etc/passwd", "rb") as f:
      self.assertNotEqual(f.read(1), b"y")

  def test_restoring_a_file_replaces_what_the_tool_left(self):
    scratch = self.box.scratch
    os.mkfifo(os.path.join(scratch, "fifo"))
    os.symlink("data.txt", os.path.join(scratch, "link"))
    os.symlink("/etc", os.path.join(scratch, "etc"))
    os.mkdir(os.path.join(scratch, "adir"))
    self.assertEqual(self.box.restore_file("fifo", b"1"), "")
    self.assertEqual(self.box.restore_file("link", b"2"), "")
    self.assertEqual(self.box.restore_file("gone/again/x", b"3"), "")
    self.assertEqual(
        [self.box.read_file(n) for n in ("fifo", "link", "gone/again/x")],
        [b"1", b"2", b"3"],
    )
    self.assertEqual(self.box.read_file("data.txt"), b"hello")
    self.assertIn("leads out", self.box.restore_file("etc/passwd", b"4"))
    self.assertIn("a directory", self.box.restore_file("adir", b"5"))

  def test_no_network(self):
    accepted = []
    with socket.socket() as server:
      server.bind(("127.0.0.1", 0))
      server.listen()
      server.settimeout(5)
      port = server.getsockname()[1]

      def accept():
        try:
          accepted.append(server.accept())
        except OSError:
          pass

      thread = threading.Thread(target=accept)
      thread.start()
      result = self.box.run(
          _python(
              "import socket; socket.create_connection("
              f"('127.0.0.1', {port}), timeout=3)"
          )
      )
      thread.join()
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("ConnectionRefusedError", result.stderr)
    self.assertEqual(accepted, [])

  def test_cpu_limit(self):
    for isolated in (True, False):
      with sandbox.Sandbox(
          {}, sandbox.Limits(wall_seconds=60, cpu_seconds=1), isolated=isolated
      ) as box:
        result = box.run(_python("while True: pass"))
        # Killed at the limit (SIGXCPU, or SIGKILL when the soft limit is
        # the hard one; bubblewrap reports its child's signal as 128 + its
        # number) long before the wall-clock limit.
        self.assertFalse(result.timed_out, isolated)
        self.assertIn(result.returncode, (-24, -9, 128 + 24, 128 + 9), isolated)

  def test_spawned_without_python_in_the_forked_child(self):
    # Python code between fork and exec in a threaded process can deadlock;
    # the at-fork hooks run only when the child runs Python (preexec_fn).
    forks = []
    os.register_at_fork(before=lambda: forks.append(1))
    self._still_works()
    self.assertEqual(forks, [])

  def test_memory_limit(self):
    result = self.box.run(_python("x = bytearray(3 << 30)"))
    self.assertIn("MemoryError", result.stderr)
    self._still_works()

  def test_output_is_cut(self):
    result = self.box.run(_python("print('y' * 100000)"))
    self.assertTrue(result.stdout.endswith("[output cut]"))
    self.assertLess(len(result.stdout), 20000)

  def test_paths_outside_the_scratch_are_refused(self):
    self.assertIsNone(self.box.path("../etc/passwd"))
    self.assertIsNone(self.box.path("/etc/passwd"))
    os.symlink("/etc", os.path.join(self.box.scratch, "link"))
    self.assertIsNone(self.box.path("link/passwd"))
    self.assertEqual(
        self.box.path("/task/pkg/code.py"),
        os.path.join(os.path.realpath(self.box.scratch), "pkg", "code.py"),
    )
    with self.assertRaisesRegex(ValueError, "'../x'"):
      sandbox.Sandbox({"../x": ""})

  def test_unavailable_bubblewrap_is_one_line(self):
    path = os.environ["PATH"]
    os.environ["PATH"] = tempfile.mkdtemp()
    try:
      with self.assertRaisesRegex(
          sandbox.SandboxUnavailable,
          r"^bwrap \(Debian's bubblewrap\) is not installed: tools cannot run "
          r"isolated \(apt-get install bubblewrap\)$",
      ):
        sandbox.check_available()
    finally:
      os.environ["PATH"] = path

  def test_unisolated_mode_keeps_limits_and_timeout(self):
    with sandbox.Sandbox({"a": "1"}, isolated=False) as box:
      result = box.run(_python("print(open('a').read())"))
      self.assertEqual(result.stdout.strip(), "1")
      result = box.run(_python("import time; time.sleep(100)"), 1)
      self.assertTrue(result.timed_out)

  def test_a_root_filesystem_bound_as_root(self):
    root = tiny_rootfs.make(self.create_tempdir().full_path)
    repository = os.path.join(root, "srv", "repo")
    os.makedirs(os.path.join(repository, "src"))
    with open(
        os.path.join(repository, "src", "a.txt"), "w", encoding="utf-8"
    ) as f:
      f.write("from the image\n")
    with sandbox.Sandbox(
        {"added.txt": "from the task\n"},
        root=root,
        workdir="/srv/repo",
        source=repository,
    ) as box:
      result = box.run([
          "/bin/bash", "-c",
          "cat /etc/os-release src/a.txt added.txt; pwd; echo new > b.txt; "
          "ls /usr/bin; test -e /usr/bin/python3 || echo no-python",
      ])  # fmt: skip
      self.assertTrue(result.ok, result)
      self.assertEqual(
          result.stdout.split("\n")[:4],
          [tiny_rootfs.OS_RELEASE.strip(), "from the image", "from the task",
           "/srv/repo"],
      )  # fmt: skip
      self.assertEqual(
          result.stdout.split("\n")[4:-2], sorted(tiny_rootfs.PROGRAMS)
      )
      self.assertIn("no-python", result.stdout)
      # Writes land in the scratch, never in the image; the image's other
      # directories and bubblewrap's own root are read-only.
      self.assertTrue(os.path.exists(os.path.join(box.scratch, "b.txt")))
      self.assertFalse(os.path.exists(os.path.join(repository, "b.txt")))
      result = box.run(["/bin/bash", "-c", "echo t > /tmp/t && cat /tmp/t"])
      self.assertEqual(result.stdout, "t\n")
      for path in ("/etc/x", "/srv/x", "/x"):
        result = box.run(["/bin/bash", "-c", f"echo x > {path}"])
        self.assertIn("Read-only file system", result.stderr, path)
      self.assertEqual(
          box.path("/srv/repo/src/a.txt"),
          os.path.join(os.path.realpath(box.scratch), "src", "a.txt"),
      )
      self.assertIsNone(box.path("/etc/os-release"))
      # The timeout as without a root.
      result = box.run(["/bin/bash", "-c", "while :; do :; done"], 1)
      self.assertTrue(result.timed_out)
    with self.assertRaisesRegex(ValueError, "needs bubblewrap"):
      sandbox.Sandbox({}, isolated=False, root=root)
    with self.assertRaisesRegex(ValueError, "sandbox root '/nowhere'"):
      sandbox.Sandbox({}, root="/nowhere")
    with self.assertRaisesRegex(ValueError, "workdir 'task'"):
      sandbox.Sandbox({}, workdir="task")

  def test_bad_limits(self):
    with self.assertRaisesRegex(ValueError, "wall_seconds=0"):
      sandbox.Limits(wall_seconds=0)


if __name__ == "__main__":
  absltest.main()
