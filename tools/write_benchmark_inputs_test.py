"""End-to-end test of //tools:write_benchmark_inputs: the files it writes
load as the benchmark task with the flags it prints."""

import os

from absl.testing import absltest

from maxtext.env import benchmark_task
from maxtext.env import tasks
from testing import runfiles


class WriteBenchmarkInputsTest(absltest.TestCase):

  def test_writes_inputs_that_load_with_the_printed_flags(self):
    out = os.path.join(self.create_tempdir().full_path, "inputs")
    done = runfiles.run_binary(
        "tools/write_benchmark_inputs", [f"--output_dir={out}"], timeout_s=120
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    fields = {}
    for line in done.stdout.splitlines():
      name, _, value = line.removeprefix("--config.grpo_task_").partition("=")
      fields[name] = value
    self.assertEqual(
        sorted(fields),
        ["curriculum_path", "curriculum_sha256", "rootfs_dir",
         "validation_path", "validation_sha256"],
    )  # fmt: skip
    task = tasks.load(
        "maxtext.env.benchmark_task:make_task", 2, 0, tasks.TaskInputs(**fields)
    )
    self.assertIsInstance(task, benchmark_task.BenchmarkTask)
    self.assertLen(task.curriculum, 3)
    # A second write into the same directory is refused in one line.
    again = runfiles.run_binary(
        "tools/write_benchmark_inputs", [f"--output_dir={out}"], timeout_s=120
    )
    self.assertEqual(again.returncode, 2)
    self.assertIn(f"--output_dir={out}: already exists", again.stderr)


if __name__ == "__main__":
  absltest.main()
