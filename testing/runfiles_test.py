"""Tests for testing.runfiles, on runfiles trees built in a temp dir."""

import os
import stat
import sys

from absl.testing import absltest
from absl.testing import parameterized

from testing import runfiles


class RunfilesTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path

  def _make(self, workspace, relative_path, executable=False):
    path = os.path.join(self.root, workspace, *relative_path.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write("#!/bin/sh\n")
    if executable:
      os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path

  @parameterized.named_parameters(
      ("test_srcdir_named_workspace", "TEST_SRCDIR", "maxtext_engine", None),
      ("runfiles_dir_module_workspace", "RUNFILES_DIR", "_main", None),
      ("test_workspace_variable", "TEST_SRCDIR", "other", "other"),
  )
  def test_find(self, root_var, workspace, test_workspace):
    expected = self._make(workspace, "maxtext/train_main.pyz")
    environ = {root_var: self.root}
    if test_workspace:
      environ["TEST_WORKSPACE"] = test_workspace
    self.assertEqual(runfiles.find("maxtext/train_main.pyz", environ), expected)
    self.assertIsNone(runfiles.find("maxtext/absent", environ))

  def test_find_without_a_runfiles_tree(self):
    self._make("maxtext_engine", "maxtext/train_main")
    self.assertIsNone(runfiles.find("maxtext/train_main", {}))

  def test_find_skips_directories(self):
    os.makedirs(os.path.join(self.root, "maxtext_engine", "maxtext"))
    self.assertIsNone(runfiles.find("maxtext", {"TEST_SRCDIR": self.root}))

  def test_train_main_command_prefers_the_executable_binary(self):
    binary = self._make("maxtext_engine", "maxtext/train_main", executable=True)
    self.assertEqual(
        runfiles.train_main_command({"TEST_SRCDIR": self.root}), [binary]
    )

  @parameterized.named_parameters(
      ("no_runfiles", False, False),
      ("not_executable", True, False),
  )
  def test_train_main_command_falls_back_to_module(self, present, executable):
    environ = {}
    if present:
      self._make("maxtext_engine", "maxtext/train_main", executable=executable)
      environ["TEST_SRCDIR"] = self.root
    self.assertEqual(
        runfiles.train_main_command(environ),
        [sys.executable, "-m", "maxtext.train_main"],
    )

  def test_binary_command_for_another_binary(self):
    binary = self._make(
        "maxtext_engine", "tools/benchmarks/engine_bench", executable=True
    )
    self.assertEqual(
        runfiles.binary_command(
            "tools/benchmarks/engine_bench", {"TEST_SRCDIR": self.root}
        ),
        [binary],
    )
    self.assertEqual(
        runfiles.binary_command("tools/benchmarks/engine_bench", {}),
        [sys.executable, "-m", "tools.benchmarks.engine_bench"],
    )

  def test_run_binary_falls_back_to_the_module_from_anywhere(self):
    # No executable testing/runfiles exists, so this runs `python -m
    # testing.runfiles` from a directory outside the repository: it imports
    # only with the repository root put on the child's PYTHONPATH.
    proc = runfiles.run_binary(
        "testing/runfiles", [], timeout_s=60, cwd=self.root
    )
    self.assertEqual(proc.returncode, 0, proc.stderr)

  def test_run_python_imports_what_this_process_imports(self):
    proc = runfiles.run_python(
        "import os, sys; from testing import runfiles; "
        "print(sys.argv[1], os.environ['EXTRA'], os.environ['JAX_PLATFORMS'])",
        ["arg"],
        timeout_s=120,
        extra_env={"EXTRA": "yes"},
    )
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertEqual(
        proc.stdout.split(),
        ["arg", "yes", os.environ.get("JAX_PLATFORMS", "cpu")],
    )


if __name__ == "__main__":
  absltest.main()
