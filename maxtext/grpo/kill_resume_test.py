"""A GRPO run killed with `kill -9` resumes to the records of a run that was
never interrupted: the real `grpo_main`, a real SIGKILL."""

import os
import signal
import subprocess

from absl.testing import absltest

from maxtext.metrics import jsonl
from testing import child
from testing import grpo_start
from testing import runfiles
from testing import tiny_configs

_TIMEOUT_S = 300
# A step budget the killed run never reaches.
_FOREVER = 100000


def _command() -> list[str]:
  return runfiles.binary_command("maxtext/grpo_main")


def _train_records(run_dir: str) -> list[dict]:
  return [
      r
      for r in jsonl.read_jsonl(os.path.join(run_dir, jsonl.METRICS_FILENAME))
      if r["kind"] == "train"
  ]


def _finished_checkpoints(run_dir: str) -> list[int]:
  directory = os.path.join(run_dir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


class KillResumeTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.checkpoints = grpo_start.pretrained_checkpoints(
        absltest.get_default_test_tmpdir()
    )

  def _flags(self, out, run_name, steps):
    # Every GRPO field the run depends on is given, whatever grpo_tiny.py
    # (grpo_main's default config) says.
    return tiny_configs.tiny_flags(
        out,
        run_name=run_name,
        steps=steps,
        extra=dict(
            grpo_start.RUN_FIELDS,
            load_parameters_path=self.checkpoints,
            grpo_temperature=1.0,
            eval_interval=2,
            checkpoint_period=2,
        ),
    )

  def _run(self, out, run_name, steps) -> subprocess.CompletedProcess:
    """grpo_main to `steps` in `out`/`run_name`; it must succeed."""
    done = subprocess.run(
        _command() + self._flags(out, run_name, steps),
        cwd=out,
        env=runfiles.cached_environ(_command()),
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    return done

  def test_killed_run_resumes_to_the_uninterrupted_records(self):
    out = self.create_tempdir().full_path
    run_dir = os.path.join(out, "killed")
    victim = child.Child(
        _command() + self._flags(out, "killed", _FOREVER),
        out,
        runfiles.cached_environ(_command()),
    )
    self.addCleanup(victim.kill)
    victim.wait_until(
        lambda: 2 in _finished_checkpoints(run_dir),
        "the checkpoint of step 2",
        _TIMEOUT_S,
    )
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=_TIMEOUT_S)
    self.assertEqual(victim.returncode, -signal.SIGKILL)
    newest = max(_finished_checkpoints(run_dir))
    steps = newest + 3

    again = self._run(out, "killed", steps)
    self.assertIn(f"completed after step {steps}", again.stdout)
    straight = os.path.join(out, "straight")
    self._run(out, "straight", steps)

    resumed, uninterrupted = _train_records(run_dir), _train_records(straight)
    # The killed attempt's records past its checkpoint were replaced.
    self.assertEqual([r["step"] for r in resumed], list(range(steps)))
    self.assertEqual([r["step"] for r in uninterrupted], list(range(steps)))
    for got, want in zip(resumed, uninterrupted):
      for name in grpo_start.COMPARED_METRICS:
        self.assertAlmostEqual(
            got[name], want[name], places=5, msg=f"{name} at {got['step']}"
        )
    # Not a trivial comparison: the policy was trained on non-zero signals.
    self.assertGreater(max(r["advantage/abs_mean"] for r in resumed), 0.0)


if __name__ == "__main__":
  absltest.main()
