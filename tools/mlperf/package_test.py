"""End to end: the packager binary on tiny MLPerf runs, and its refusals.

The binary trains llama31_8b's required number of tiny runs (--runs mode, a
few seconds each with the persistent compilation cache), packages them, and
the official package checker and result summarizer pass on the tree (open
division). The same run directories are then packaged again as arguments, and
altered copies of them are refused.
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


def run_package(args, timeout_s=900):
  """Runs //tools/mlperf:package with `args`; returns the CompletedProcess."""
  command = runfiles.binary_command("tools/mlperf/package")
  env = runfiles.binary_environ(
      command, {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  )
  return subprocess.run(
      command + list(args),
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout_s,
      check=False,
  )


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
        "maxtext/trainer.py",
        "maxtext/configs/default.py",
        "tools/mlperf/package.py",
        "third_party/py/requirements_lock.txt",
    ):
      self.assertTrue(os.path.isfile(os.path.join(impl, source)), source)

  def test_run_directories_are_packaged(self):
    proc = run_package([f"--output_dir={self.new_out}", *self.run_dirs])
    self.assertEqual(proc.returncode, 0, output_of(proc))
    self.assertRegex(proc.stdout.strip().splitlines()[-1], _LAST_LINE)

  def altered_copy(self, **edit):
    """A copy of the first run directory with its log edited."""
    copy = os.path.join(self.create_tempdir().full_path, "run_altered")
    shutil.copytree(self.run_dirs[0], copy)
    mlperf_runs.edit_log(os.path.join(copy, "mllog.log"), **edit)
    return copy

  def assert_refused(self, args, pattern):
    proc = run_package([f"--output_dir={self.new_out}", *args])
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
    )
    self.assertFalse(os.path.exists(os.path.join(self.new_out, "runs")))


if __name__ == "__main__":
  absltest.main()
