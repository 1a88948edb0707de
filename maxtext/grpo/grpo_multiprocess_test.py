"""GRPO as one job of two real `grpo_main` processes (jax.distributed on the
CPU): the records of a one-process run, written once. With one device each
and rollouts drawn synchronously; and with four devices each, two of which
generate (grpo_generation_devices 4: each process copies its training
devices' parameters to its generation devices), with rollouts drawn one
update ahead (grpo_max_age 1: every process dispatches the rollout's
programs, the copy included, in the loop's one order)."""

import os

from absl.testing import absltest
from absl.testing import parameterized

from maxtext import grpo_main
from maxtext import train_main
from maxtext.metrics import jsonl
from maxtext.runtime import cpu_devices
from testing import absl_main
from testing import grpo_start
from testing import multiprocess
from testing import runfiles
from testing import tiny_configs

_TIMEOUT_S = 600


def _flags(root, start, run_name, max_age):
  """A 4-step GRPO run's flags from the pretrained `start`."""
  return tiny_configs.tiny_flags(
      root,
      run_name=run_name,
      steps=4,
      extra=dict(
          grpo_start.RUN_FIELDS,
          load_parameters_path=start,
          eval_interval=2,
          checkpoint_period=2,
          grpo_max_age=max_age,
      ),
  )


def _four_devices():
  """The processes' environment for 4 CPU devices each: this process's
  XLA_FLAGS (the suite's compile level) with the device count."""
  return {
      "XLA_FLAGS": cpu_devices.with_device_count(
          os.environ.get("XLA_FLAGS", ""), 4
      )
  }


def _records(root, run_name):
  return jsonl.read_jsonl(os.path.join(root, run_name, jsonl.METRICS_FILENAME))


class GrpoMultiProcessTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # One pretrained start, shared by the cases, and one one-process run per
    # `grpo_max_age`: a job's records depend on max_age alone, not on how
    # many devices generate. The one-process runs are grpo_main's `main` in
    # this process (its flags and default config), which has one device:
    # the second reuses the first's traced and compiled programs, where a
    # fresh grpo_main process would import JAX and trace them again.
    cls.root = absltest.get_default_test_tmpdir()
    cls.start = grpo_start.pretrained_checkpoints(cls.root)
    cls.alone = {}

  def _alone(self, max_age):
    """The records of the one-process run with `max_age`."""
    if max_age not in self.alone:
      run_name = f"single_{max_age}"
      code, stdout, stderr = absl_main.run(
          train_main,
          train_main.main,
          [
              f"--config={grpo_main.DEFAULT_CONFIG}",
              *_flags(self.root, self.start, run_name, max_age),
          ],
      )
      self.assertEqual(code, 0, stderr[-3000:])
      self.assertIn("completed after step 4", stdout)
      self.alone[max_age] = _records(self.root, run_name)
    return self.alone[max_age]

  @parameterized.named_parameters(
      ("synchronous", 0, 0),
      ("one_rollout_ahead_on_generation_devices", 1, 4),
  )
  def test_two_processes_give_the_one_process_records(
      self, max_age, generation_devices
  ):
    root = self.create_tempdir().full_path
    command = runfiles.binary_command("maxtext/grpo_main")
    job_flags, env = _flags(root, self.start, "job", max_age), None
    if generation_devices:
      job_flags.append(f"--config.grpo_generation_devices={generation_devices}")
      env = _four_devices()
    processes = multiprocess.launch(
        2, job_flags, os.path.join(root, "logs"), command=command, env=env
    )
    codes = multiprocess.wait_all(processes, _TIMEOUT_S)
    self.assertEqual(
        codes,
        [0, 0],
        processes[0].output()[-3000:] + processes[1].output()[-3000:],
    )
    for process in processes:
      self.assertIn("grpo_main: completed after step 4", process.output())
    job, alone = _records(root, "job"), self._alone(max_age)
    # One record per step and eval: process 0 alone wrote them.
    self.assertEqual(
        [(r["step"], r["kind"]) for r in job],
        [(r["step"], r["kind"]) for r in alone],
    )
    self.assertLen([r for r in job if r["kind"] == "train"], 4)
    for got, want in zip(job, alone):
      names = (
          grpo_start.COMPARED_METRICS
          + (("rollout/age_max",) if max_age else ())
          if got["kind"] == "train"
          else ("eval_pass@1",)
      )
      if generation_devices and got["kind"] == "train":
        # The copy is in the job's records (the one-process run has none).
        self.assertGreater(got["rollout/weight_copy_bytes"], 0)
        self.assertNotIn("rollout/weight_copy_bytes", want)
      for name in names:
        self.assertAlmostEqual(
            got[name], want[name], places=5, msg=f"{name} at {got['step']}"
        )
    self.assertGreater(max(r.get("kl", 0.0) for r in job), 0.0)

  def test_generation_devices_the_processes_cannot_share_are_refused(self):
    root = self.create_tempdir().full_path
    flags = tiny_configs.tiny_flags(
        root,
        run_name="job",
        steps=1,
        extra=dict(grpo_start.RUN_FIELDS, grpo_generation_devices=3),
    )
    processes = multiprocess.launch(
        2,
        flags,
        os.path.join(root, "logs"),
        command=runfiles.binary_command("maxtext/grpo_main"),
        env=_four_devices(),
    )
    self.assertEqual(multiprocess.wait_all(processes, _TIMEOUT_S), [2, 2])
    for process in processes:
      self.assertIn(
          "grpo_main: error: grpo_generation_devices=3: each of the 2 "
          "processes gives generation the same number of its devices, so it "
          "must be a multiple of 2\n",
          process.output(),
      )


if __name__ == "__main__":
  absltest.main()
