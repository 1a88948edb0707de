"""End-to-end test of //tools:math_heldout at a tiny scale: every phase runs,
the arms train as many samples, and each evaluation is where it belongs."""

import json
import os
import tarfile

from absl.testing import absltest

from testing import runfiles

_TINY = (
    "--sft_config=maxtext/configs/sft_math_tiny.py",
    "--grpo_config=maxtext/configs/grpo_math_tiny.py",
    "--seeds=0",
    "--demonstrations=64",
    "--sft_config.steps=20",
    "--sft_config.warmup_steps=2",
    "--sft_config.checkpoint_period=10",
    "--sft_config.max_checkpoints_to_keep=0",
    "--grpo_config.steps=2",
    "--grpo_config.eval_interval=2",
    "--grpo_config.grpo_eval_prompts=8",
    "--grpo_config.grpo_eval_temperature=0.1",
    "--grpo_config.grpo_eval_top_p=0.95",
)


def _configs(archive: str) -> dict[str, dict]:
  """Each run's recorded config (config.json's "config") in runs.tar.gz, by
  run name."""
  out = {}
  with tarfile.open(archive) as tar:
    for member in tar.getmembers():
      if member.name.endswith("/config.json"):
        record = json.load(tar.extractfile(member))
        out[member.name.split("/")[0]] = record["config"]
  return out


class MathHeldoutTest(absltest.TestCase):

  def test_a_tiny_experiment_runs_every_phase(self):
    root = self.create_tempdir().full_path
    out, work = os.path.join(root, "out"), os.path.join(root, "work")
    args = [f"--output_dir={out}", f"--work_dir={work}", *_TINY]
    done = runfiles.run_binary("tools/math_heldout", args, timeout_s=800)
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertEqual(
        sorted(os.listdir(out)),
        ["math_heldout.log", "runs.tar.gz", "summary.json", "summary.md"],
    )
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
      record = json.load(f)
    steps = record["sft_steps"]
    self.assertIn(steps, (10, 20))
    self.assertEqual(
        sorted(record["runs"]),
        sorted(
            ["sft_s0", "grpo_s0", "control_s0", "eval_control_s0"]
            + [f"probe_s0_{s}" for s in record["sft_probes"]]
        ),
    )
    (seed,) = record["seeds_done"]
    # The SFT checkpoint chosen is the one GRPO and the control start from,
    # evaluated alike by the probe and by the GRPO run.
    runs = record["runs"]
    self.assertEqual(seed["sft"], runs["grpo_s0"]["start_eval"])
    self.assertEqual(seed["sft"], runs[f"probe_s0_{steps}"]["start_eval"])
    self.assertEqual(seed["grpo"], runs["grpo_s0"]["last_eval"])
    self.assertEqual(seed["control"], runs["eval_control_s0"]["start_eval"])
    for arm in ("sft", "grpo", "control"):
      self.assertEqual(sorted(seed[arm]), ["pass@1", "pass@4"])
    configs = _configs(os.path.join(out, "runs.tar.gz"))
    grpo, control = configs["grpo_s0"], configs["control_s0"]
    self.assertEqual(
        grpo["steps"] * grpo["global_batch_size"],
        control["steps"] * control["global_batch_size"],
    )
    start = os.path.join(work, "runs", "sft_s0", "checkpoints", str(steps))
    self.assertEqual(grpo["load_parameters_path"], start)
    self.assertEqual(control["load_parameters_path"], start)
    self.assertEqual(
        configs["eval_control_s0"]["load_parameters_path"],
        os.path.join(work, "runs", "control_s0", "checkpoints"),
    )
    with open(os.path.join(out, "summary.md"), encoding="utf-8") as f:
      summary = f.read()
    self.assertIn("Verdict, pass@4: GRPO mean", summary)
    self.assertIn(summary.strip().splitlines()[-1], done.stdout)
    # The work directory now holds an experiment: a second one is refused
    # in one line before anything runs.
    again = runfiles.run_binary("tools/math_heldout", args, timeout_s=120)
    self.assertEqual(again.returncode, 2)
    self.assertIn(f"--work_dir={work} is not empty", again.stderr)


if __name__ == "__main__":
  absltest.main()
