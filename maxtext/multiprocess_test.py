"""Two real train_main processes forming one jax.distributed job on loopback.

Each process sees one CPU device; together they train on a 2-device mesh. Only
process 0 writes the run's logs. A peer that never arrives, and a SIGTERM that
reaches only one process, must both end the job cleanly.
"""

import glob
import json
import os
import re
import time

from absl.testing import absltest

from testing import compliance_checker
from testing import multiprocess

_TIMEOUT_S = 900


def _flags(output_dir, run_name, **overrides):
  values = dict(
      base_output_directory=output_dir,
      run_name=run_name,
      log_period=5,
      jax_compilation_cache_dir=os.environ.get("JAX_COMPILATION_CACHE_DIR", ""),
  )
  values.update(overrides)
  return [f"--config.{key}={value}" for key, value in values.items()]


def _final_line(process):
  lines = re.findall(
      r"^train_main: \w+ after step \d+ \(eval loss [^)]*\).*$",
      process.output(),
      re.M,
  )
  return lines[-1] if lines else None


def _train_records(run_dir):
  with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
    return [r for r in map(json.loads, f) if r["kind"] == "train"]


class MultiProcessTest(absltest.TestCase):

  def test_two_processes_train_one_job_and_process_0_writes_the_logs(self):
    root = self.create_tempdir().full_path
    processes = multiprocess.launch(
        2, _flags(root, "job"), os.path.join(root, "logs")
    )
    codes = multiprocess.wait_all(processes, _TIMEOUT_S)
    self.assertEqual(
        codes,
        [0, 0],
        processes[0].output()[-3000:] + processes[1].output()[-3000:],
    )
    # Both processes report the same outcome and eval loss.
    self.assertIsNotNone(_final_line(processes[0]))
    self.assertEqual(
        _final_line(processes[0]).split(";")[0],
        _final_line(processes[1]).split(";")[0],
    )
    self.assertIn("success", _final_line(processes[0]))
    run_dir = os.path.join(root, "job")
    self.assertEqual(
        sorted(os.path.basename(p) for p in glob.glob(run_dir + "/*.log")),
        ["mllog.log"],
    )
    self.assertIn("MLPerf log:", processes[0].output())
    self.assertNotIn("MLPerf log:", processes[1].output())
    records = _train_records(run_dir)
    self.assertEqual([r["step"] for r in records], list(range(len(records))))
    result = compliance_checker.run_checker(
        os.path.join(run_dir, "mllog.log"), ruleset="6.1.0"
    )
    self.assertTrue(result.passed, result.output)

  def test_peer_that_never_arrives_fails_with_a_clear_message(self):
    root = self.create_tempdir().full_path
    # launch returns one process per id; pylint infers its list as empty.
    [lone] = multiprocess.launch(  # pylint: disable=unbalanced-tuple-unpacking
        2,
        _flags(root, "lone", distributed_init_timeout_seconds=5),
        os.path.join(root, "logs"),
        process_ids=[0],
    )
    # Bounded: the coordinator gives up after its 5 s timeout.
    code = lone.wait(timeout=120)
    self.assertNotEqual(code, 0)
    self.assertIn(
        "could not gather all 2 processes at coordinator 127.0.0.1:",
        lone.output(),
    )
    self.assertIn("distributed_init_timeout_seconds=5", lone.output())

  def test_sigterm_to_one_process_stops_both_at_one_checkpoint_and_resumes(
      self,
  ):
    root = self.create_tempdir().full_path
    run_dir = os.path.join(root, "pre")
    flags = _flags(
        root,
        "pre",
        steps=60,
        # A fixed schedule, so the resume below may change `steps`.
        lr_schedule_steps=60,
        target_eval_loss=0.0,
        eval_interval=50,
        checkpoint_period=1000,
        warmup_steps=5,
    )
    processes = multiprocess.launch(2, flags, os.path.join(root, "logs"))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + _TIMEOUT_S
    while time.monotonic() < deadline:
      if os.path.exists(metrics) and len(_train_records(run_dir)) >= 3:
        break
      self.assertIsNone(
          processes[0].popen.poll(), processes[0].output()[-3000:]
      )
      time.sleep(0.2)
    processes[1].signal()  # Only process 1 is preempted.
    codes = multiprocess.wait_all(processes, _TIMEOUT_S)
    self.assertEqual(codes, [1, 1])
    steps = sorted(
        int(s)
        for s in os.listdir(os.path.join(run_dir, "checkpoints"))
        if s.isdigit()
    )
    self.assertLen(steps, 1)
    stop_step = steps[0]
    self.assertBetween(stop_step, 3, 59)
    for process in processes:
      self.assertIn(
          f"after step {stop_step}; checkpoint step {stop_step} saved",
          process.output(),
      )
    self.assertEqual(len(_train_records(run_dir)), stop_step)

    resumed = multiprocess.launch(
        2,
        _flags(
            root,
            "pre",
            steps=stop_step + 2,
            lr_schedule_steps=60,
            target_eval_loss=0.0,
            eval_interval=50,
            checkpoint_period=1000,
            warmup_steps=5,
        ),
        os.path.join(root, "logs_resumed"),
    )
    self.assertEqual(multiprocess.wait_all(resumed, _TIMEOUT_S), [0, 0])
    for process in resumed:
      self.assertIn(
          f"Resumed from the checkpoint of step {stop_step}", process.output()
      )
    self.assertEqual(
        [r["step"] for r in _train_records(run_dir)], list(range(stop_step + 2))
    )


if __name__ == "__main__":
  absltest.main()
