"""Runs the tool_executor_bench binary small: its rows and last line.

Times are not checked; what is checked is that one run plays the rollout
through the local executor and each pool size, every episode without an
executor error, and that the closing line names each one's episodes/s.
"""

import re

from absl.testing import absltest

from testing import runfiles


class ToolExecutorBenchTest(absltest.TestCase):

  def test_local_and_two_pools_side_by_side(self):
    proc = runfiles.run_binary(
        "tools/benchmarks/tool_executor_bench",
        [
            "--episodes=3",
            "--turns=2",
            "--sleep_seconds=0.1",
            "--actors=1,2",
        ],
        timeout_s=240,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    rows = [
        line.split()
        for line in proc.stdout.splitlines()
        if re.match(r"^(local|ray) ", line)
    ]
    self.assertEqual([r[:3] for r in rows], [
        ["local", "-", "3"], ["ray", "1", "3"], ["ray", "2", "3"],
    ])  # fmt: skip
    for row in rows:
      self.assertGreater(float(row[3]), 0)  # wall_s
      self.assertEqual(row[6], "0")  # executor errors
    self.assertEqual(rows[0][5], "1.00")  # The local executor's own ratio.
    self.assertRegex(
        proc.stdout.splitlines()[-1],
        r"^tool_executor_bench: local_episodes_per_s=[\d.]+ "
        r"ray1_episodes_per_s=[\d.]+ ray2_episodes_per_s=[\d.]+$",
    )


if __name__ == "__main__":
  absltest.main()
