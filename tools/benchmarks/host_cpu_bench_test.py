"""Runs the host_cpu_bench binary small: two trees, its table and last line.

Times are not checked; what is checked is that each round runs every tree as
its own trainer process, in alternating order, and that the closing line
reports the first tree's median and each other tree's ratio to it.
"""

import os
import re

from absl.testing import absltest

from testing import runfiles


class HostCpuBenchTest(absltest.TestCase):

  def test_two_trees_side_by_side(self):
    # This test's own tree (the runfiles tree under Bazel) holds maxtext/.
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )
    proc = runfiles.run_binary(
        "tools/benchmarks/host_cpu_bench",
        [
            "--rounds=2",
            "--steps=8",
            "--skip_steps=2",
            f"--trees=a={root},b={root}",
            "--set=eval_interval=4",
            # default.py's 20 warm-up steps must fit in the 8 steps run here.
            "--set=warmup_steps=2",
            "--set=enable_mllog=false",
        ],
        timeout_s=600,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    rows = [
        line.split()
        for line in proc.stdout.splitlines()
        if re.match(r"^\s*\d+\s+[ab]\s", line)
    ]
    self.assertEqual(
        [(r[0], r[1]) for r in rows],
        [("0", "a"), ("0", "b"), ("1", "b"), ("1", "a")],
    )
    for row in rows:
      self.assertGreater(float(row[2]), 0)  # Main-thread ms per step.
      self.assertGreaterEqual(float(row[3]), float(row[2]))  # All threads.
    medians = {}
    for line in proc.stdout.splitlines():
      match = re.match(r"^([ab]): main thread (\d+\.\d+) ms/step", line)
      if match:
        medians[match.group(1)] = float(match.group(2))
    match = re.match(
        r"^host_cpu_bench: main_thread_ms=(\d+\.\d+) b/a=(\d+\.\d+)$",
        proc.stdout.strip().splitlines()[-1],
    )
    self.assertIsNotNone(match, proc.stdout[-500:])
    self.assertAlmostEqual(float(match.group(1)), medians["a"], places=3)
    self.assertAlmostEqual(
        float(match.group(2)), medians["b"] / medians["a"], places=2
    )


if __name__ == "__main__":
  absltest.main()
