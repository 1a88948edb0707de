"""Tests of the `train_main` binary.

The end-to-end tests run the binary as a subprocess: under Bazel the binary
is the `//maxtext:train_main` py_binary in this test's runfiles; run directly
(`python -m maxtext.train_main_test`), the test starts `python -m
maxtext.train_main` instead. Every run trains the tiny config of
`testing.tiny_configs`, given as --config.x overrides, into a temp dir.
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

from absl.testing import absltest
from absl.testing import parameterized

from maxtext import train_main
from maxtext.metrics import jsonl
from maxtext.storage import checkpointing
from testing import run_layout
from testing import runfiles
from testing import tiny_configs

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Start-up (imports, compilation) is slow on a loaded 2-core machine.
_RUN_TIMEOUT_S = 300


def _environ(**extra) -> dict[str, str]:
  return runfiles.cached_environ(runfiles.train_main_command(), **extra)


def _mllog_run_stop(path: str) -> dict:
  """Returns the run_stop event of the MLPerf log at path."""
  with open(path, encoding="utf-8") as f:
    events = [
        json.loads(line[len(":::MLLOG ") :])
        for line in f
        if line.startswith(":::MLLOG ")
    ]
  stops = [e for e in events if e["key"] == "run_stop"]
  if len(stops) != 1:
    raise AssertionError(f"{path}: expected one run_stop, got {stops}")
  return stops[0]


def _checkpoint_steps(run_dir: str) -> list[int]:
  with checkpointing.Checkpointer(
      os.path.join(run_dir, "checkpoints"), save_period=1, max_to_keep=0
  ) as ckpt:
    return ckpt.all_steps()


class DefaultConfigTest(absltest.TestCase):

  def test_import_leaves_sys_argv_alone(self):
    # The module is imported above; the test's own command line has no
    # --config, and importing must not have added one.
    self.assertFalse(any(a.startswith("--config") for a in sys.argv))

  def test_default_is_this_packages_default_config(self):
    path = train_main.DEFAULT_CONFIG
    self.assertEqual(
        path[-len("maxtext/configs/default.py") :].replace(os.sep, "/"),
        "maxtext/configs/default.py",
    )
    self.assertTrue(os.path.isfile(path))


class TrainMainTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path

  def run_main(self, args, cwd=None, env=None):
    return subprocess.run(
        runfiles.train_main_command() + list(args),
        cwd=cwd or self.tmp,
        env=env or _environ(),
        capture_output=True,
        text=True,
        timeout=_RUN_TIMEOUT_S,
        check=False,
    )

  def test_relative_output_resolves_against_caller_and_writes_layout(self):
    # As under `bazel run`: started elsewhere (the runfiles tree), with the
    # caller's directory in BUILD_WORKING_DIRECTORY.
    caller = os.path.join(self.tmp, "caller")
    elsewhere = os.path.join(self.tmp, "elsewhere")
    os.makedirs(caller)
    os.makedirs(elsewhere)
    args = tiny_configs.tiny_flags("rel/runs", run_name="smoke", steps=3)
    proc = self.run_main(
        args, cwd=elsewhere, env=_environ(BUILD_WORKING_DIRECTORY=caller)
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn("train_main: completed after step 3", proc.stdout)

    run_dir = os.path.join(caller, "rel", "runs", "smoke")
    self.assertEqual(os.listdir(elsewhere), [])
    self.assertContainsSubset(
        run_layout.RUN_DIR_ENTRIES, set(os.listdir(run_dir))
    )
    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
      document = json.load(f)
    self.assertEqual(document["config"]["steps"], 3)
    self.assertEqual(document["config"]["base_output_directory"], "rel/runs")
    self.assertIn("git_revision", document["provenance"])
    records = jsonl.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    self.assertEqual(
        [r["step"] for r in records if r["kind"] == "train"], [0, 1, 2]
    )
    self.assertEqual([r["step"] for r in records if r["kind"] == "eval"], [2])
    self.assertNotEmpty(
        glob.glob(os.path.join(run_dir, "tensorboard", "events.out.tfevents.*"))
    )
    self.assertEqual(_checkpoint_steps(run_dir), [3])
    self.assertEqual(
        _mllog_run_stop(os.path.join(run_dir, "mllog.log"))["metadata"][
            "status"
        ],
        "aborted",
    )

  @parameterized.named_parameters(
      (
          "misspelt_key",
          ["--config.stpes=3"],
          r"FATAL Flags parsing error: --config override of an unknown field: "
          r"'stpes'\nDid you mean \"steps\"",
      ),
      (
          "misspelt_key_with_config_file",
          [
              f"--config={_REPO_ROOT}/maxtext/configs/default.py",
              "--config.stpes=3",
          ],
          r"unknown field: 'stpes'",
      ),
      (
          "unparsable_value",
          ["--config.steps=abc"],
          r"FATAL Flags parsing error: flag --config.steps=abc",
      ),
      ("bad_value", ["--config.steps=0"], r"config\.steps=0: must be >= 1"),
      (
          "positional_argument",
          ["extra_arg"],
          r"Unexpected positional arguments: \['extra_arg'\]",
      ),
  )
  def test_bad_command_line_fails_clearly(self, args, message):
    output = os.path.join(self.tmp, "out")
    # A --config=file comes before any --config.x override.
    files = [a for a in args if a.startswith("--config=")]
    rest = [a for a in args if a not in files]
    proc = self.run_main(
        files
        + [f"--config.base_output_directory={output}", "--config.run_name=bad"]
        + rest
    )
    self.assertNotEqual(proc.returncode, 0)
    self.assertRegex(proc.stderr, message)
    self.assertFalse(os.path.exists(output))

  @parameterized.named_parameters(
      ("missing", None, [], r"--config=\S*/missing\.py: does not exist"),
      (
          "syntax_error",
          "def get_config(:\n",
          [],
          r"--config file cannot be loaded: SyntaxError: .*bad\.py, line 1\)",
      ),
      (
          "get_config_raises",
          "def get_config():\n  return 1 / 0\n",
          [],
          r"--config file cannot be loaded: ZeroDivisionError: "
          r"division by zero \(\S*bad\.py, line 2\)",
      ),
      (
          "no_get_config",
          "X = 1\n",
          [],
          r"--config: config file '\S*bad\.py' defines no get_config\(\)$",
      ),
      (
          # ml_collections reads the override as an unknown field.
          "no_get_config_with_override",
          "X = 1\n",
          ["--config.steps=3"],
          r"--config: config file '\S*bad\.py' defines no get_config\(\)$",
      ),
      (
          "get_config_returns_a_dict",
          "def get_config():\n  return {'steps': 3}\n",
          [],
          r"--config: get_config\(\) of '\S*bad\.py' returned dict, not a "
          r"ConfigDict$",
      ),
      (
          "get_config_returns_a_dict_with_override",
          "def get_config():\n  return {'steps': 3}\n",
          ["--config.steps=3"],
          r"--config: get_config\(\) of '\S*bad\.py' returned dict, not a "
          r"ConfigDict$",
      ),
  )
  def test_config_file_that_cannot_load_is_one_line(
      self, source, extra_args, message
  ):
    path = os.path.join(self.tmp, "missing.py" if source is None else "bad.py")
    if source is not None:
      with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    proc = self.run_main([f"--config={path}"] + extra_args)
    self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
    self.assertNotIn("Traceback", proc.stderr)
    (line,) = [l for l in proc.stderr.splitlines() if "train_main" in l]
    self.assertRegex(line, r"^train_main: error: " + message)

  def test_sigterm_stops_with_checkpoint_and_complete_files(self):
    output = os.path.join(self.tmp, "out")
    run_dir = os.path.join(output, "preempted")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    # A budget the run cannot finish before the signal; eval every 3 steps.
    args = tiny_configs.tiny_flags(output, run_name="preempted", steps=100000)
    with subprocess.Popen(
        runfiles.train_main_command() + args,
        cwd=self.tmp,
        env=_environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
      try:
        deadline = time.monotonic() + _RUN_TIMEOUT_S
        # Wait until the loop is running: two train records written.
        while time.monotonic() < deadline and proc.poll() is None:
          if os.path.exists(metrics):
            with open(metrics, encoding="utf-8") as f:
              if f.read().count('"kind": "train"') >= 2:
                break
          time.sleep(0.05)
        self.assertIsNone(proc.poll(), "train_main exited before the signal")
        proc.send_signal(signal.SIGTERM)
        try:
          stdout, stderr = proc.communicate(timeout=_RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
          # Say why: the child's signal masks and what it last wrote.
          with open(f"/proc/{proc.pid}/status", encoding="utf-8") as f:
            masks = [l.strip() for l in f if l.startswith("Sig")]
          proc.kill()
          stdout, stderr = proc.communicate()
          self.fail(
              f"train_main went on after SIGTERM; {masks}; stdout ends "
              f"{stdout[-2000:]!r}; stderr ends {stderr[-5000:]!r}"
          )
      finally:
        if proc.poll() is None:
          proc.kill()
          proc.communicate()
    self.assertEqual(proc.returncode, 1, stderr[-3000:])
    self.assertIn("train_main: interrupted after step", stdout)
    self.assertIn("stopped by SIGTERM", stderr)

    # Every line whole; the train records are steps 0..n-1 with no gap.
    with open(metrics, encoding="utf-8") as f:
      self.assertTrue(f.read().endswith("\n"))
    records = jsonl.read_jsonl(metrics)
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    stop_step = len(train_steps)
    self.assertGreaterEqual(stop_step, 2)
    self.assertLess(stop_step, 100000)
    self.assertEqual(train_steps, list(range(stop_step)))
    # One stop, one step number: the request's log line, the loop's line
    # and train_main's line all count completed steps.
    self.assertIn(f"interrupted after step {stop_step} ", stdout)
    self.assertIn(f"SIGTERM received: stopping after step {stop_step}.", stderr)
    self.assertIn(
        f"Stopped by SIGTERM after step {stop_step}; checkpoint step "
        f"{stop_step} saved in ",
        stderr,
    )
    stop_lines = r"(?:stopping|Stopped by SIGTERM|interrupted) after step (\d+)"
    self.assertEqual(
        set(re.findall(stop_lines, stdout + stderr)), {str(stop_step)}
    )
    # A checkpoint of the stop step (steps completed), readable with its
    # metadata.
    self.assertEqual(max(_checkpoint_steps(run_dir)), stop_step)
    run_stop = _mllog_run_stop(os.path.join(run_dir, "mllog.log"))
    self.assertEqual(run_stop["metadata"]["status"], "aborted")
    self.assertEqual(run_stop["metadata"]["samples_count"], stop_step * 8)


if __name__ == "__main__":
  absltest.main()
