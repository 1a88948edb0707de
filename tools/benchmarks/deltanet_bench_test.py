"""deltanet_bench small: both forms timed and compared, the last line read.

Times are not checked; what is checked is that the four figures and both
ratios are reported and that the chunked and per-token forms agreed.
"""

import re

from absl.testing import absltest

from testing import runfiles


class DeltanetBenchTest(absltest.TestCase):

  def test_reports_both_forms(self):
    done = runfiles.run_binary(
        "tools/benchmarks/deltanet_bench",
        [
            "--tokens=40",
            "--chunk_size=16",
            "--emb_dim=16",
            "--head_dim=8",
            "--repeats=1",
        ],
        timeout_s=300,
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(
        r"deltanet_bench: tokens=40 chunk=16 forward_chunked_ms=([\d.]+) "
        r"forward_recurrent_ms=([\d.]+) forward_ratio=([\d.]+) "
        r"grad_chunked_ms=([\d.]+) grad_recurrent_ms=([\d.]+) "
        r"grad_ratio=([\d.]+) max_rel_diff=(\S+)",
        last,
    )
    self.assertIsNotNone(match, last)
    for group in range(1, 7):
      self.assertGreater(float(match.group(group)), 0)
    self.assertLess(float(match.group(7)), 1e-5)


if __name__ == "__main__":
  absltest.main()
