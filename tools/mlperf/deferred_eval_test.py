"""Deferred evaluation end to end: grpo_main trains, deferred_eval closes.

A brief pretraining run (in-process) starts three tiny GRPO runs of one
command line through the real `grpo_main`, differing only in their name,
`deferred_eval` and the target: an in-run one that evaluates at every point
of the MLPerf schedule (scaled down: the first eval after 2 rollouts, then
after every rollout), and two deferred ones whose logs the real
`deferred_eval` binary closes. The deferred evaluation must give the in-run
evaluation's values at the same samples counts, in step order, stop at the
first checkpoint that reaches the target and date run_stop at its update
time, or end aborted when none does; the official checker then fails
exactly the checks a tiny run fails (`grpo_start.TINY_LOG_FAILURES`, as
`maxtext/grpo/mllog_test.py` pins them).
The binary's refusals leave the log as it was: all but the last run its
`main` in this process (`testing/absl_main.py`), which imported what it
needs for the pretraining already; the last starts the binary.
"""

import json
import os
import shutil
import subprocess

from absl.testing import absltest

from maxtext.metrics import jsonl
from maxtext.mllog import deferred_log
from maxtext.mllog import logger as mllog_logger
from maxtext.storage import weights_checkpoints
from tools.mlperf import deferred_eval as deferred_eval_main
from testing import absl_main
from testing import compliance_checker
from testing import grpo_start
from testing import runfiles
from testing import tiny_configs

_TIMEOUT_S = 600
_STEPS = 6
_BATCH = 8  # grpo_start.RUN_FIELDS' global batch: 2 prompts x 4 completions.
# The points of the schedule: after rollouts 2, 3, 4, 5 and 6.
_POINTS = [2, 3, 4, 5, 6]


def _config_file() -> str:
  """grpo_tiny.py, grpo_main's default config, from the runfiles or source."""
  found = runfiles.find("maxtext/configs/grpo_tiny.py")
  if found:
    return found
  return os.path.join(
      os.path.dirname(__file__),
      "..",
      "..",
      "maxtext",
      "configs",
      "grpo_tiny.py",
  )


def _events(path: str) -> list[dict]:
  return mllog_logger.read_events(path)


class DeferredEvalTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tiny_configs.fresh_output_dir("deferred_eval_")
    cls.checkpoints = grpo_start.pretrained_checkpoints(cls.root)

  def flags(self, run_name: str, deferred: bool, target: float) -> list[str]:
    """The training command line of a run (also the evaluation's)."""
    return [f"--config={_config_file()}"] + tiny_configs.tiny_flags(
        self.root,
        run_name=run_name,
        steps=_STEPS,
        extra=dict(
            grpo_start.RUN_FIELDS,
            **grpo_start.MLPERF_FIELDS,
            load_parameters_path=self.checkpoints,
            grpo_target_pass_rate=target,
            deferred_eval=deferred,
        ),
    )

  def run_binary(self, target_path: str, flags: list[str]):
    command = runfiles.binary_command(target_path)
    return subprocess.run(
        command + flags,
        cwd=self.root,
        env=runfiles.cached_environ(command),
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )

  def train(self, run_name: str, deferred: bool, target: float) -> str:
    done = self.run_binary(
        "maxtext/grpo_main", self.flags(run_name, deferred, target)
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    return os.path.join(self.root, run_name)

  def evaluate(self, run_name: str, deferred_target: float, *extra: str):
    return self.run_binary(
        "tools/mlperf/deferred_eval",
        self.flags(run_name, True, deferred_target) + list(extra),
    )

  def evaluate_here(self, run_name: str, deferred_target: float, *extra: str):
    """`evaluate`, with deferred_eval's `main` run in this process."""
    args = self.flags(run_name, True, deferred_target) + list(extra)
    code, stdout, stderr = absl_main.run(
        deferred_eval_main, deferred_eval_main.main, args
    )
    return subprocess.CompletedProcess(args, code, stdout, stderr)

  def assert_refused(self, done, message: str, log: str, before: bytes):
    """One line of refusal holding `message`, exit 2, the log as `before`."""
    self.assertEqual(done.returncode, 2, done.stdout + done.stderr[-3000:])
    lines = [
        line
        for line in done.stderr.splitlines()
        if line.startswith("deferred_eval: error:")
    ]
    self.assertLen(lines, 1, done.stderr[-3000:])
    self.assertIn(message, lines[0])
    with open(log, "rb") as f:
      self.assertEqual(f.read(), before, "a refusal changed the log")

  def assert_checker_fails_only_the_tiny_checks(self, log: str):
    checked = compliance_checker.run_checker(log)
    self.assertIsNone(grpo_start.tiny_log_problems(checked), checked.output)

  def test_deferred_evaluation_closes_the_log_as_the_in_run_one_would(self):
    # The in-run evaluation's values, at every point.
    inrun = self.train("inrun", deferred=False, target=0.0)
    evals = [
        r
        for r in jsonl.read_jsonl(os.path.join(inrun, jsonl.METRICS_FILENAME))
        if r["kind"] == "eval"
    ]
    self.assertEqual([r["step"] + 1 for r in evals], _POINTS)
    values = [r["eval_pass@4"] for r in evals]
    # The first point that betters every earlier one is the target of the
    # run that passes: the evaluation must go past earlier points to it.
    passing = next(
        i for i in range(1, len(values)) if values[i] > max(values[:i])
    )
    self.assertLess(max(values), 1.0)

    # None reaches 1.0: every checkpoint is evaluated, the run aborted.
    aborted = self.train("never", deferred=True, target=1.0)
    log = os.path.join(aborted, "mllog.log")
    training = _events(log)
    keys = [e["key"] for e in training]
    self.assertNotIn("eval_accuracy", keys)
    self.assertNotIn("run_stop", keys)
    points = [e for e in training if e["key"] == deferred_log.POINT_KEY]
    self.assertEqual([p["value"] for p in points], _POINTS)
    self.assertEqual(
        [p["metadata"]["samples_count"] for p in points],
        [s * _BATCH for s in _POINTS],
    )
    # Weights-only checkpoints at every point, beside the run's own
    # checkpoint (of the last step only), which they do not replace.
    self.assertEqual(
        sorted(
            int(n)
            for n in os.listdir(os.path.join(aborted, "checkpoints"))
            if n.isdigit()
        ),
        [_STEPS],
    )
    self.assertEqual(
        sorted(
            int(n)
            for n in os.listdir(weights_checkpoints.directory(aborted))
            if n.isdigit()
        ),
        _POINTS,
    )
    done = self.evaluate("never", 1.0)
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertIn(
        "deferred_eval: aborted: none of 5 checkpoint(s)", done.stdout
    )
    # The progress in the log (stderr): its last line counts all five.
    self.assertRegex(
        done.stderr,
        rf"deferred_eval: done, 5 checkpoints in [^;]+; step {_POINTS[-1]}: ",
    )
    closed = _events(log)
    accuracy = [e for e in closed if e["key"] == "eval_accuracy"]
    self.assertEqual([e["value"] for e in accuracy], values)
    self.assertEqual(
        [e["metadata"]["samples_count"] for e in accuracy],
        [s * _BATCH for s in _POINTS],
    )
    stop = closed[-1]
    self.assertEqual(stop["key"], "run_stop")
    self.assertEqual(stop["metadata"]["status"], "aborted")
    pending = [e for e in closed if e["key"] == deferred_log.PENDING_KEY]
    self.assertEqual(stop["time_ms"], pending[0]["time_ms"])
    self.assert_checker_fails_only_the_tiny_checks(log)

    # The target of the point found above: the deferred run passes there.
    target = values[passing]
    run = self.train("passes", deferred=True, target=target)
    log = os.path.join(run, "mllog.log")
    with open(log, "rb") as f:
      before = f.read()
    # Refusals: each one line, the log left as it was.
    self.assert_refused(
        self.evaluate_here("nosuch", target), "no run 'nosuch'", log, before
    )
    self.assert_refused(
        self.evaluate_here(
            "passes", target, "--config.grpo_eval_temperature=0.7"
        ),
        "grpo_eval_temperature: 0.5 -> 0.7",
        log,
        before,
    )
    weights = weights_checkpoints.directory(run)
    moved = os.path.join(self.root, "moved_aside")
    shutil.move(os.path.join(weights, "4"), moved)
    self.assert_refused(
        self.evaluate_here("passes", target), "step(s) 4 missing", log, before
    )
    shutil.move(moved, os.path.join(weights, "4"))
    # A data file of the first point's checkpoint, changed in one byte.
    data = max(
        (
            os.path.join(d, name)
            for d, _, names in os.walk(os.path.join(weights, "2", "state"))
            for name in names
        ),
        key=os.path.getsize,
    )
    with open(data, "rb") as f:
      original = f.read()
    with open(data, "wb") as f:
      f.write(original[:-1] + bytes([original[-1] ^ 0xFF]))
    self.assert_refused(
        self.evaluate_here("passes", target),
        "weights-only checkpoint step 2",
        log,
        before,
    )
    with open(data, "wb") as f:
      f.write(original)

    done = self.evaluate("passes", target)
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertIn(
        f"deferred_eval: success at checkpoint step {_POINTS[passing]}",
        done.stdout,
    )
    closed = _events(log)
    appended = closed[len(_events_of(before)) :]
    accuracy = [e for e in appended if e["key"] == "eval_accuracy"]
    # In step order, up to the passing one and no further, with the in-run
    # evaluation's values at its samples counts.
    self.assertEqual([e["value"] for e in accuracy], values[: passing + 1])
    self.assertEqual(
        [e["metadata"]["samples_count"] for e in accuracy],
        [s * _BATCH for s in _POINTS[: passing + 1]],
    )
    self.assertEqual(
        [
            e["metadata"]["step"]
            for e in appended
            if e["key"] == "tracked_stats"
        ],
        _POINTS[: passing + 1],
    )
    stop = appended[-1]
    self.assertEqual(stop["key"], "run_stop")
    self.assertEqual(stop["metadata"]["status"], "success")
    self.assertEqual(
        stop["metadata"]["samples_count"], _POINTS[passing] * _BATCH
    )
    point = [e for e in closed if e["key"] == deferred_log.POINT_KEY][passing]
    # Dated at the passing step's update, as the training logged it: after
    # run_start, before the training ended and the evaluation ran.
    self.assertEqual(stop["time_ms"], point["metadata"]["update_time_ms"])
    start = next(e for e in closed if e["key"] == "run_start")
    self.assertLess(start["time_ms"], stop["time_ms"])
    self.assertLess(stop["time_ms"], appended[0]["time_ms"])
    self.assert_checker_fails_only_the_tiny_checks(log)

    # Closed: a second evaluation is refused and appends nothing.
    with open(log, "rb") as f:
      after = f.read()
    self.assert_refused(
        self.evaluate("passes", target), "is already closed", log, after
    )


def _events_of(text: bytes) -> list[dict]:
  """The events of a log's bytes."""
  return [
      json.loads(line[len(mllog_logger.LINE_PREFIX) :])
      for line in text.decode().splitlines()
      if line.startswith(mllog_logger.LINE_PREFIX)
  ]


if __name__ == "__main__":
  absltest.main()
