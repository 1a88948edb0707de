"""Runs the engine_bench binary on a tiny model: its table and closing line.

Times are not checked (tests never assert on speed); what is checked is that
the benchmark runs end to end through the real trainer in both pairings, times
the steps it says it times, and ends with the line other tools parse.
"""

import re

from absl.testing import absltest
from absl.testing import parameterized

from testing import runfiles
from testing import tiny_configs

_TIMEOUT_S = 600
_LAST_LINE = re.compile(
    r"^engine_bench: ratio=(\d+\.\d{3}) tokens_per_s=(\d+)$"
)


def _run(*args):
  # testing/tiny_configs' config as --config overrides (eval and checkpoint
  # every 3 steps); the benchmark sets its own output directory and steps.
  return runfiles.run_binary(
      "tools/benchmarks/engine_bench",
      tiny_configs.tiny_flags(absltest.get_default_test_tmpdir()) + list(args),
      timeout_s=_TIMEOUT_S,
  )


class EngineBenchTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("step", "step", "3/3"), ("block", "block", "3/5")
  )
  def test_runs_and_reports(self, pairing, timed):
    # 7 steps, the first 2 left out as warm-up. Eval and checkpoint every 3
    # steps: the trainer's steps 4 and 7 (after them) are left out, so 3, 5
    # and 6 are timed; a bare block times all 5, a step pairing only the
    # bare steps paired with a timed trainer step.
    proc = _run(
        "--rounds=2", "--steps=7", "--warmup_steps=2", f"--pairing={pairing}"
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    self.assertIn(f"7 steps per run, pairing={pairing}", lines[0])
    self.assertIn("emb 32, 1 layers, seq 16, global batch 8 in K=2", lines[0])
    self.assertIn("eval every 3, checkpoint every 3", lines[0])
    rows = [l.split() for l in lines if re.match(r"^\s+\d+\s", l)]
    self.assertEqual([r[0] for r in rows], ["0", "1"])
    for row in rows:
      self.assertEqual(row[-1], timed)
      trainer_ms, bare_ms, ratio = map(float, row[1:4])
      self.assertGreater(trainer_ms, 0)
      self.assertGreater(bare_ms, 0)
      self.assertGreater(ratio, 0)
    self.assertRegex(proc.stdout, r"over 2 rounds")
    self.assertRegex(proc.stdout, r"MFU n/a")  # No peak is known for a CPU.
    match = _LAST_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    ratios = sorted(float(r[3]) for r in rows)
    # The reported ratio is the median of the rounds' ratios.
    self.assertAlmostEqual(float(match.group(1)), sum(ratios) / 2, delta=0.0011)
    self.assertGreater(int(match.group(2)), 0)

  def test_too_few_steps_is_a_usage_error(self):
    proc = _run("--steps=3", "--warmup_steps=2")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn(
        "need --rounds >= 1 and --steps > --warmup_steps + 1", proc.stderr
    )


if __name__ == "__main__":
  absltest.main()
