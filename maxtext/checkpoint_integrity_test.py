"""A checkpoint with flipped bytes, read by every binary that reads one.

A real tiny `train_main` run writes checkpoints 4 and 8; one byte in every
4,096 of the largest data file of step 8 is inverted (same size, so only
the checksums see it; orbax would read garbage values, as users found).
Then each reader, as a user starts it:

* `tools/export_checkpoint` and `tools/generate` refuse, exit 2, one line
  naming the damaged file, and the export writes nothing;
* `train_main` with `load_parameters_path` on it (how fine-tunes and GRPO's
  reference start) refuses the same way;
* a resume of the run moves step 8 aside and trains on from step 4;
* a step directory copied in from another run is moved aside the same way
  (its checksums.json names the other run).
"""

import glob
import json
import os
import re
import shutil
import subprocess
import tempfile

from absl.testing import absltest

from testing import process_output
from testing import runfiles
from testing import tiny_configs

_TIMEOUT_S = 300
_DAMAGED = re.compile(
    r"checkpoint step 8: (\S+/checkpoints/8/state/\S+) is damaged "
    r"\(crc32c [0-9a-f]{8}, [0-9a-f]{8} recorded at save\)"
)


def _flip_bytes(path: str, every: int = 4096) -> None:
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    for i in range(0, len(data), every):
      data[i] ^= 0xFF
    f.seek(0)
    f.write(data)


class CheckpointIntegrityTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.out = os.path.join(cls.tmp, "runs")
    done = cls.train("run", steps=8)
    assert done.returncode == 0, done.stderr[-5000:]
    cls.run_dir = os.path.join(cls.out, "run")
    checkpoints = os.path.join(cls.run_dir, "checkpoints")
    steps = sorted(int(n) for n in os.listdir(checkpoints) if n.isdigit())
    assert steps == [4, 8], steps
    data_files = glob.glob(
        os.path.join(checkpoints, "8", "state", "ocdbt.process_0", "d", "*")
    )
    cls.damaged = max(data_files, key=os.path.getsize)
    _flip_bytes(cls.damaged)

  @classmethod
  def train(cls, run_name, steps, **extra):
    flags = tiny_configs.tiny_flags(
        cls.out,
        run_name=run_name,
        steps=steps,
        extra=dict(checkpoint_period=4, lr_schedule_steps=20, **extra),
    )
    return runfiles.run_binary(
        "maxtext/train_main",
        flags,
        timeout_s=_TIMEOUT_S,
        cwd=cls.tmp,
        cache_compilations=True,
    )

  def assert_refused(self, done: subprocess.CompletedProcess, program: str):
    output = done.stdout + done.stderr
    self.assertEqual(done.returncode, 2, output[-5000:])
    self.assertNotIn("Traceback", output)
    line = process_output.one_line_starting(
        done.stderr, f"{program}: error: ", output
    )
    match = _DAMAGED.search(line)
    self.assertIsNotNone(match, line)
    self.assertEqual(match.group(1), self.damaged)

  def test_export_refuses_and_writes_nothing(self):
    output_dir = os.path.join(self.tmp, "exported")
    done = runfiles.run_binary(
        "tools/export_checkpoint",
        [f"--run_dir={self.run_dir}", f"--output_dir={output_dir}"],
        timeout_s=_TIMEOUT_S,
        cwd=self.tmp,
    )
    self.assert_refused(done, "export_checkpoint")
    self.assertFalse(os.path.exists(output_dir))
    self.assertEqual(
        glob.glob(os.path.join(self.tmp, "exported.exporting-*")), []
    )

  def test_generate_refuses(self):
    done = runfiles.run_binary(
        "tools/generate",
        [f"--run_dir={self.run_dir}", "--prompt_ids=1,2", "--max_new_tokens=2"],
        timeout_s=_TIMEOUT_S,
        cwd=self.tmp,
    )
    self.assert_refused(done, "generate")

  def test_load_parameters_path_refuses(self):
    done = self.train(
        "fine_tune",
        steps=2,
        load_parameters_path=os.path.join(self.run_dir, "checkpoints"),
    )
    self.assert_refused(done, "train_main")
    # The older, intact step loads.
    done = self.train(
        "fine_tune_from_4",
        steps=2,
        load_parameters_path=os.path.join(self.run_dir, "checkpoints", "4"),
    )
    self.assertEqual(done.returncode, 0, done.stderr[-5000:])
    self.assertIn(
        "Verified checkpoint step 4 in "
        f"{os.path.join(self.run_dir, 'checkpoints')} (state)",
        done.stderr,
    )

  def test_resume_falls_back_to_the_newest_that_verifies(self):
    done = self.train("run", steps=10)
    self.assertEqual(done.returncode, 0, done.stderr[-5000:])
    self.assertNotIn("Traceback", done.stderr)
    checkpoints = os.path.join(self.run_dir, "checkpoints")
    self.assertRegex(
        done.stderr,
        r"Checkpoint of step 8 could not be restored \(ChecksumError: "
        rf"checkpoint step 8: {re.escape(self.damaged)} is damaged .*\); "
        rf"moved to {re.escape(checkpoints)}/8\.corrupt-\S+\. Resuming from "
        r"the older step 4 instead\.",
    )
    (moved,) = glob.glob(os.path.join(checkpoints, "8.corrupt-*"))
    # Moved as it was: the damaged file is there, still damaged.
    self.assertTrue(
        os.path.exists(
            os.path.join(moved, os.path.relpath(self.damaged, checkpoints)[2:])
        )
    )
    steps = sorted(int(n) for n in os.listdir(checkpoints) if n.isdigit())
    self.assertEqual(steps[0], 4)
    self.assertEqual(steps[-1], 10)

  def test_another_runs_step_is_set_aside_on_resume(self):
    for name, steps in (("mine", 4), ("theirs", 8)):
      done = self.train(name, steps=steps)
      self.assertEqual(done.returncode, 0, done.stderr[-5000:])
    mine = os.path.join(self.out, "mine", "checkpoints")
    shutil.copytree(
        os.path.join(self.out, "theirs", "checkpoints", "8"),
        os.path.join(mine, "8"),
    )
    with open(
        os.path.join(self.out, "theirs", "config.json"), encoding="utf-8"
    ) as f:
      theirs = json.load(f)["provenance"]["run_id"]
    # Step 8 would pass for the run's end: the run trains to it instead.
    done = self.train("mine", steps=8)
    self.assertEqual(done.returncode, 0, done.stderr[-5000:])
    self.assertRegex(
        done.stderr,
        r"Checkpoint of step 8 could not be restored \(ChecksumError: "
        rf"checkpoint step 8: \S+ names run '{theirs}', not this run "
        r"\([0-9a-f]{32}\): a checkpoint of another run\); moved to "
        rf"{re.escape(mine)}/8\.corrupt-\S+\. Resuming from the older step 4 "
        r"instead\.",
    )
    self.assertEqual(
        sorted(int(n) for n in os.listdir(mine) if n.isdigit()), [4, 8]
    )
    # Step 8 is this run's own now.
    with open(os.path.join(mine, "8", "checksums.json"), encoding="utf-8") as f:
      self.assertNotEqual(json.load(f)["run_id"], theirs)


if __name__ == "__main__":
  absltest.main()
