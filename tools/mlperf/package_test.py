"""End to end: the packager binary on tiny MLPerf runs, and its refusals.

The binary trains llama31_8b's required number of tiny runs (--runs mode, a
few seconds each with the persistent compilation cache), packages them, and
the official package checker and result summarizer pass on the tree (open
division). The same run directories are then packaged again as arguments, and
altered copies of them are refused, or packaged with a warning: among them
copies recording another git revision than the packager's. A refusal of run
directories is what the packager decides: its `main` runs in this process
(`testing/absl_main.py`); the refusals of --runs mode and of an existing
package start the binary.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.configs import default
from testing import absl_main
from testing import mlperf_runs
from testing import runfiles
from tools.mlperf import layout
from tools.mlperf import run_logs
from tools.mlperf import submission

_COUNT = submission.required_runs("llama31_8b")
_LAST_LINE = re.compile(
    rf"^mlperf_package: checker=ok runs={_COUNT} score=(\d+\.\d+)$"
)
_ORG, _SYSTEM = "maxtext-engine", "cpu"
_OTHER = "0123456789abcdef" * 2 + "01234567"
_REVISION = re.compile(r"^([0-9a-f]{40}(\+dirty)?|unknown)$")


def run_package(args, timeout_s=900):
  """Runs //tools/mlperf:package with `args`; returns the CompletedProcess."""
  command = runfiles.binary_command("tools/mlperf/package")
  return subprocess.run(
      command + list(args),
      env=runfiles.cached_environ(command),
      capture_output=True,
      text=True,
      timeout=timeout_s,
      check=False,
  )


def package_here(args):
  """`run_package` with the packager's `main` in this process."""
  # Imported once this test's own flags are parsed: the packager's
  # --output_dir is required, and absl_main's calls give it.
  # pylint: disable-next=import-outside-toplevel
  from tools.mlperf import package

  code, stdout, stderr = absl_main.run(package, package.main, args)
  return subprocess.CompletedProcess(args, code, stdout, stderr)


def set_revision(run_dir, revision):
  """Makes a run directory name `revision` as if it had been built from it.

  config.json's provenance and the MLPerf log's submission_platform metadata
  are both rewritten, as a binary built from `revision` writes them.
  """
  path = os.path.join(run_dir, "config.json")
  with open(path, encoding="utf-8") as f:
    document = json.load(f)
  document["provenance"]["git_revision"] = revision
  with open(path, "w", encoding="utf-8") as f:
    json.dump(document, f)
  log_path = os.path.join(run_dir, "mllog.log")
  prefix = ":::MLLOG "
  with open(log_path, encoding="utf-8") as f:
    lines = f.readlines()
  with open(log_path, "w", encoding="utf-8") as f:
    for line in lines:
      if line.startswith(prefix) and '"git_revision"' in line:
        event = json.loads(line[len(prefix) :])
        event["metadata"]["git_revision"] = revision
        line = prefix + json.dumps(event) + "\n"
      f.write(line)


def output_of(proc):
  return f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


class PackageTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.out = os.path.join(cls.tmp, "out")
    cls.proc = run_package(
        [
            f"--output_dir={cls.out}",
            f"--runs={_COUNT}",
            f"--config={os.path.abspath(default.__file__)}",
            *mlperf_runs.tiny_mlperf_flags(cls.tmp),
        ]
    )
    cls.run_dirs = sorted(glob.glob(os.path.join(cls.out, "runs", "run_*")))

  def setUp(self):
    super().setUp()
    self.new_out = self.create_tempdir().full_path

  def test_runs_mode_packages_runs_that_pass_the_official_tools(self):
    self.assertEqual(self.proc.returncode, 0, output_of(self.proc))
    last = self.proc.stdout.strip().splitlines()[-1]
    match = _LAST_LINE.match(last)
    self.assertIsNotNone(match, output_of(self.proc))
    self.assertGreater(float(match.group(1)), 0.0)
    self.assertIn("package checker found no errors", self.proc.stdout)

    self.assertLen(self.run_dirs, _COUNT)
    seeds = [run_logs.read_run(d).seed for d in self.run_dirs]
    self.assertLen(set(seeds), _COUNT, seeds)  # A fresh seed per run.

    results = sorted(
        os.listdir(layout.results_dir(self.out, _ORG, _SYSTEM, "llama31_8b"))
    )
    self.assertEqual(results, sorted(f"result_{i}.txt" for i in range(_COUNT)))
    with open(
        layout.system_json(self.out, _ORG, _SYSTEM), encoding="utf-8"
    ) as f:
      desc = json.load(f)
    self.assertLen(desc, 33)
    self.assertEqual(desc["division"], "open")
    self.assertEqual(desc["status"], "Available on-premise")
    self.assertEqual(desc["submitter"], _ORG)
    impl = layout.implementation_dir(
        self.out, _ORG, "llama31_8b", layout.DEFAULT_IMPLEMENTATION
    )
    for source in (
        "maxtext/run/trainer.py",
        "maxtext/configs/default.py",
        "tools/mlperf/package.py",
        "third_party/py/requirements_lock.txt",
    ):
      self.assertTrue(os.path.isfile(os.path.join(impl, source)), source)

  def read_build_info(self, out):
    impl = layout.implementation_dir(
        out, _ORG, "llama31_8b", layout.DEFAULT_IMPLEMENTATION
    )
    with open(os.path.join(impl, "build_info.json"), encoding="utf-8") as f:
      return json.load(f)

  def test_run_directories_are_packaged(self):
    proc = run_package([f"--output_dir={self.new_out}", *self.run_dirs])
    self.assertEqual(proc.returncode, 0, output_of(proc))
    self.assertRegex(proc.stdout.strip().splitlines()[-1], _LAST_LINE)
    # The implementation names the packager's revision and the runs' one;
    # each run whose revision is not the packager's clean one (this
    # checkout may be modified, or have moved on) is one WARNING line.
    recorded = {run_logs.read_run(d).git_revision for d in self.run_dirs}
    self.assertLen(recorded, 1)
    info = self.read_build_info(self.new_out)
    self.assertRegex(info["git_revision"], _REVISION)
    self.assertEqual(info["runs_git_revision"], recorded.pop())
    warnings = [
        line[len("mlperf_package: WARNING: ") :]
        for line in proc.stdout.splitlines()
        if line.startswith("mlperf_package: WARNING: ")
    ]
    self.assertEqual(info["warnings"], warnings)
    clean = info["git_revision"] == info["runs_git_revision"] and (
        info["modified"] is False
    )
    self.assertLen(warnings, 0 if clean else _COUNT)

  def copies_of_the_runs(self, revision=_OTHER, **edit):
    """Copies of every run directory recording `revision`, logs edited."""
    base = self.create_tempdir().full_path
    copies = []
    for i, run_dir in enumerate(self.run_dirs):
      copy = os.path.join(base, f"run_copy_{i}")
      shutil.copytree(run_dir, copy)
      set_revision(copy, revision)
      if edit:
        mlperf_runs.edit_log(os.path.join(copy, "mllog.log"), **edit)
      copies.append(copy)
    return copies

  def test_another_revision_is_packaged_with_warnings_in_the_open_division(
      self,
  ):
    copies = self.copies_of_the_runs()
    proc = run_package([f"--output_dir={self.new_out}", *copies])
    self.assertEqual(proc.returncode, 0, output_of(proc))
    self.assertRegex(proc.stdout.strip().splitlines()[-1], _LAST_LINE)
    for copy in copies:
      self.assertRegex(
          proc.stdout,
          rf"mlperf_package: WARNING: {re.escape(copy)}: the run recorded "
          rf"git_revision '{_OTHER}', the packaged implementation is "
          rf"'([0-9a-f]{{40}}(\+dirty)?|unknown)'",
      )
    info = self.read_build_info(self.new_out)
    self.assertEqual(info["runs_git_revision"], _OTHER)
    self.assertLen(info["warnings"], _COUNT)

  @parameterized.named_parameters(("other", _OTHER), ("unknown", "unknown"))
  def test_closed_division_refuses_a_revision_not_the_packagers(self, revision):
    copies = self.copies_of_the_runs(
        revision, set_value=("submission_division", "closed")
    )
    self.assert_refused(
        copies,
        rf"refused: closed division: {_COUNT} of {_COUNT} runs do not name "
        rf"the packaged implementation's clean revision.*\n"
        rf"  {re.escape(copies[0])}: the run recorded git_revision "
        rf"'{revision}', the packaged implementation is "
        rf"'([0-9a-f]{{40}}(\+dirty)?|unknown)'",
    )

  def test_runs_of_different_revisions_are_refused(self):
    copies = self.copies_of_the_runs()
    set_revision(copies[3], "unknown")
    self.assert_refused(
        copies,
        rf"refused: the runs were built from 2 different revisions.*\n"
        rf"  {_OTHER}: .*\n  unknown: {re.escape(copies[3])}$",
    )

  def altered_copy(self, **edit):
    """A copy of the first run directory with its log edited."""
    copy = os.path.join(self.create_tempdir().full_path, "run_altered")
    shutil.copytree(self.run_dirs[0], copy)
    mlperf_runs.edit_log(os.path.join(copy, "mllog.log"), **edit)
    return copy

  def assert_refused(self, args, pattern, binary=False):
    """Refused in one line matching `pattern`, nothing written; by the
    packager's `main` in this process, or with `binary` by the binary."""
    run = run_package if binary else package_here
    proc = run([f"--output_dir={self.new_out}", *args])
    self.assertEqual(proc.returncode, 2, output_of(proc))
    self.assertRegex(proc.stderr, pattern)
    self.assertFalse(os.path.exists(os.path.join(self.new_out, _ORG)))

  def test_refuses_a_log_failing_the_compliance_checker(self):
    broken = self.altered_copy(drop_key="run_stop")
    self.assert_refused(
        [broken, *self.run_dirs[1:]],
        r"refused: 1 of 10 logs fail the MLPerf compliance checker:\n"
        r".*run_altered/mllog.log",
    )

  def test_refuses_a_log_that_disagrees_with_its_metrics(self):
    edited = self.altered_copy(set_value=("eval_accuracy", 0.5))
    self.assert_refused(
        [edited, *self.run_dirs[1:]],
        r"refused: .*run_altered/mllog\.log:\d+: eval_accuracy 0\.5 after"
        r" step \d+ but eval_loss \S+ \(in .*run_altered/metrics\.jsonl\)",
    )

  def test_refused_packaging_writes_nothing_into_an_existing_package(self):
    def tree():
      files = {}
      for directory, _, names in os.walk(self.out):
        for name in names:
          path = os.path.join(directory, name)
          with open(path, "rb") as f:
            files[path] = f.read()
      return files

    before = tree()
    self.assertIn(
        os.path.join(self.out, "checker_logs", "compliance_checker.log"),
        before,
    )
    proc = run_package([f"--output_dir={self.out}", *self.run_dirs])
    self.assertEqual(proc.returncode, 2, output_of(proc))
    self.assertRegex(proc.stderr, r"refused: results directory .* not empty")
    self.assertEqual(tree(), before)

  def test_refuses_mixed_divisions(self):
    closed = self.altered_copy(set_value=("submission_division", "closed"))
    self.assert_refused(
        [closed, *self.run_dirs[1:]],
        r"refused: mixed divisions \['closed', 'open'\]",
    )

  @parameterized.named_parameters(("too_few", -1), ("too_many", 1))
  def test_refuses_the_wrong_number_of_runs(self, delta):
    run_dirs = list(self.run_dirs[: _COUNT + delta])
    if delta > 0:
      run_dirs.append(self.altered_copy())
    self.assert_refused(
        run_dirs,
        rf"refused: wrong number of runs for llama31_8b: got "
        rf"{_COUNT + delta}, the benchmark needs exactly {_COUNT}",
    )

  def test_runs_mode_refuses_the_wrong_count_before_training(self):
    self.assert_refused(
        ["--runs=2", f"--config={os.path.abspath(default.__file__)}"],
        r"wrong number of runs for llama31_8b: got 2",
        binary=True,
    )
    self.assertFalse(os.path.exists(os.path.join(self.new_out, "runs")))


if __name__ == "__main__":
  absltest.main()
