"""The `grpo_main` binary as a subprocess: a short real run, a bad field,
SIGTERM."""

import os
import signal
import subprocess
import time

from absl.testing import absltest

from maxtext.metrics import jsonl
from maxtext.storage import checkpointing
from testing import runfiles

# The tiny test model (testing/tiny_configs.py's shape) as flags.
_TINY = [
    "--config.vocab_size=32",
    "--config.emb_dim=32",
    "--config.num_layers=1",
    "--config.num_heads=2",
    "--config.num_kv_heads=1",
    "--config.head_dim=16",
    "--config.mlp_dim=64",
    "--config.max_sequence_length=16",
    "--config.global_batch_size=8",
    "--config.grpo_num_generations=4",
    "--config.gradient_accumulation_steps=2",
    "--config.grpo_prompt_length=3",
    "--config.grpo_max_completion_length=4",
    "--config.grpo_eval_prompts=8",
    "--config.eval_interval=2",
    "--config.steps=2",
    # grpo_tiny writes an MLPerf log; a test needs no cold page cache.
    "--config.cache_clear_command=sync",
]


# The train records' metrics on which two runs of the same steps agree
# (testing/grpo_start.py's COMPARED_METRICS) and the samples' age.
_COMPARED = (
    "loss",
    "pg_loss",
    "rewards/mean",
    "completions/mean_length",
    "advantage/abs_mean",
    "grad_norm",
    "rollout/age_max",
)


def _run_until_sigterm(test, command, metrics, records):
  """Runs `command` until `records` train records are in `metrics`, sends
  SIGTERM, and returns (exit status, stdout, stderr)."""
  with subprocess.Popen(
      command,
      env=runfiles.binary_environ(command),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  ) as proc:
    try:
      deadline = time.monotonic() + 300
      # Wait until the loop is running: the records written, so the signal
      # comes during an update or between updates.
      while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(metrics):
          with open(metrics, encoding="utf-8") as f:
            if f.read().count('"kind": "train"') >= records:
              break
        time.sleep(0.05)
      test.assertIsNone(proc.poll(), "grpo_main exited before the signal")
      proc.send_signal(signal.SIGTERM)
      stdout, stderr = proc.communicate(timeout=300)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.communicate()
  return proc.returncode, stdout, stderr


def _train_records(metrics):
  """A run's train records by step."""
  return {
      r["step"]: r for r in jsonl.read_jsonl(metrics) if r["kind"] == "train"
  }


class GrpoMainTest(absltest.TestCase):

  def test_short_run(self):
    out = self.create_tempdir().full_path
    done = runfiles.run_binary(
        "maxtext/grpo_main",
        [f"--config.base_output_directory={out}", *_TINY],
        timeout_s=300,
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertIn("grpo_main: completed after step 2", done.stdout)
    records = jsonl.read_jsonl(
        os.path.join(out, "grpo_tiny", jsonl.METRICS_FILENAME)
    )
    self.assertEqual(
        [(r["step"], r["kind"]) for r in records],
        [(0, "train"), (1, "train"), (1, "eval")],
    )
    self.assertIn("rewards/exact_match", records[0])
    # grpo_tiny's MLPerf log, of the GRPO benchmark.
    with open(
        os.path.join(out, "grpo_tiny", "mllog.log"), encoding="utf-8"
    ) as f:
      self.assertIn('"value": "qwen35_397b_grpo"', f.read())

  def test_sigterm_stops_after_the_rollouts_last_update(self):
    # Two updates per rollout: the stop falls after a rollout's second
    # update, with a checkpoint there, exit status 1 and the resume line.
    out = self.create_tempdir().full_path
    metrics = os.path.join(out, "grpo_tiny", jsonl.METRICS_FILENAME)
    command = runfiles.binary_command("maxtext/grpo_main") + [
        f"--config.base_output_directory={out}",
        *_TINY,
        "--config.steps=100000",
        "--config.grpo_num_iterations=2",
        "--config.eval_interval=100000",
        "--config.checkpoint_period=100000",
        "--config.enable_mllog=False",
    ]
    returncode, stdout, stderr = _run_until_sigterm(self, command, metrics, 3)
    self.assertEqual(returncode, 1, stderr[-3000:])
    self.assertIn(
        "grpo_main: stopped by SIGTERM; resume with the same run_name.",
        stderr,
    )
    train = [
        r["step"] for r in jsonl.read_jsonl(metrics) if r["kind"] == "train"
    ]
    stop_step = len(train)
    self.assertEqual(train, list(range(stop_step)))
    self.assertEqual(stop_step % 2, 0, "stopped inside a rollout")
    self.assertIn(f"grpo_main: interrupted after step {stop_step} ", stdout)
    with checkpointing.Checkpointer(
        os.path.join(out, "grpo_tiny", "checkpoints"),
        save_period=1,
        max_to_keep=0,
    ) as ckpt:
      self.assertEqual(ckpt.all_steps(), [stop_step])

  def test_sigterm_with_a_rollout_ahead_resumes_as_if_never_stopped(self):
    # grpo_max_age=1: the checkpoint after the stop holds the rollout drawn
    # ahead (with the parameters before the last update); the resumed run's
    # records are those of a run never stopped, ages included.
    out, straight = (self.create_tempdir().full_path for _ in range(2))
    metrics = os.path.join(out, "grpo_tiny", jsonl.METRICS_FILENAME)
    flags = [
        *_TINY,
        "--config.grpo_max_age=1",
        "--config.lr_schedule_steps=100000",
        "--config.eval_interval=100000",
        "--config.checkpoint_period=100000",
        "--config.enable_mllog=False",
    ]
    command = runfiles.binary_command("maxtext/grpo_main") + [
        f"--config.base_output_directory={out}",
        *flags,
        "--config.steps=100000",
    ]
    returncode, _, stderr = _run_until_sigterm(self, command, metrics, 2)
    self.assertEqual(returncode, 1, stderr[-3000:])
    stop_step = len(_train_records(metrics))
    steps = f"--config.steps={stop_step + 2}"
    for directory in (out, straight):
      done = runfiles.run_binary(
          "maxtext/grpo_main",
          [f"--config.base_output_directory={directory}", *flags, steps],
          timeout_s=300,
      )
      self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    resumed = _train_records(metrics)
    uninterrupted = _train_records(
        os.path.join(straight, "grpo_tiny", jsonl.METRICS_FILENAME)
    )
    self.assertEqual(sorted(resumed), list(range(stop_step + 2)))
    self.assertEqual(resumed[stop_step]["rollout/age_max"], 1)
    for step in range(stop_step + 2):
      for name in _COMPARED:
        self.assertAlmostEqual(
            resumed[step][name], uninterrupted[step][name], places=5
        )

  def test_a_hostile_reward_stops_with_one_line_and_a_checkpoint(self):
    # A reward stopped at its timeout after a completed step, and one that
    # fails in the first rollout. The worker's other messages for the same
    # path (a value no float holds, ...) are rewards_test's.
    cases = {
        # Scores the first rollout, then never returns.
        "hangs_after_8_calls": (
            "on prompt 0 (sample 0) did not return within 3 s "
            "(config.grpo_reward_timeout_seconds); it was stopped"
        ),
        "exits": "on prompt 0 (sample 0) raised SystemExit: 0",
    }
    for name, message in cases.items():
      with self.subTest(name):
        out = self.create_tempdir().full_path
        done = runfiles.run_binary(
            "maxtext/grpo_main",
            [
                f"--config.base_output_directory={out}",
                *_TINY,
                "--config.steps=4",
                "--config.eval_interval=4",
                "--config.enable_mllog=False",
                "--config.grpo_reward_functions="
                f"testing.hostile_rewards:{name}",
                "--config.grpo_reward_timeout_seconds=3",
            ],
            timeout_s=300,
        )
        self.assertEqual(done.returncode, 1, done.stderr[-3000:])
        self.assertNotIn("Traceback", done.stderr)
        lines = [
            line
            for line in done.stderr.splitlines()
            if line.startswith("grpo_main: ")
        ]
        self.assertEqual(
            lines,
            [
                "grpo_main: error: reward function "
                f"testing.hostile_rewards:{name} {message}"
            ],
        )
        # The last completed step is kept: step 1 after the hang in the
        # second rollout, the start (0) otherwise.
        self.assertEqual(
            os.listdir(os.path.join(out, "grpo_tiny", "checkpoints")),
            ["1" if name.startswith("hangs") else "0"],
        )

  def test_bad_field_is_one_line_and_exit_2(self):
    out = self.create_tempdir().full_path
    done = runfiles.run_binary(
        "maxtext/grpo_main",
        [
            f"--config.base_output_directory={out}",
            *_TINY,
            "--config.grpo_num_generations=1",
        ],
        timeout_s=120,
    )
    self.assertEqual(done.returncode, 2, done.stderr[-3000:])
    self.assertEqual(
        done.stderr.strip().splitlines()[-1],
        "grpo_main: error: config.grpo_num_generations=1: must be >= 2",
    )
    self.assertEqual(os.listdir(out), [])

  def test_closed_division_is_refused_naming_the_key(self):
    # The tiny run's MLPerf log cannot be a closed qwen35_397b_grpo one:
    # refused before any device work, one line naming the field.
    out = self.create_tempdir().full_path
    done = runfiles.run_binary(
        "maxtext/grpo_main",
        [
            f"--config.base_output_directory={out}",
            *_TINY,
            "--config.submission_division=closed",
        ],
        timeout_s=120,
    )
    self.assertEqual(done.returncode, 2, done.stderr[-3000:])
    last = done.stderr.strip().splitlines()[-1]
    self.assertTrue(
        last.startswith(
            "grpo_main: error: closed-division pre-flight against the "
            "reference convergence points: config.global_batch_size=8 is "
            "outside the "
            "qwen35_397b_grpo reference convergence points' batch sizes "
            "[256, 1024]"
        ),
        last,
    )
    self.assertEqual(os.listdir(out), [])


if __name__ == "__main__":
  absltest.main()
