"""Runs the mllog_bench binary small: three ways, real GCS emulator, its table.

Times are not checked; what is checked is that every way (logging off, a local
log, a log mirrored to a slow fake-gcs-server) trains through the real trainer
and that the closing line reports the worse of the two logging ways.
"""

import re

from absl.testing import absltest

from testing import runfiles


class MllogBenchTest(absltest.TestCase):

  def test_three_ways_and_closing_line(self):
    proc = runfiles.run_binary(
        "tools/benchmarks/mllog_bench",
        ["--blocks=1", "--steps=12", "--skip_steps=2", "--delay_ms=5"],
        timeout_s=600,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    ratios, cpu_added = {}, {}
    for line in proc.stdout.splitlines():
      fields = line.split()
      if fields and fields[0] in ("off", "local", "gcs"):
        ratios[fields[0]] = float(fields[2])
        self.assertGreater(float(fields[1]), 0)  # Median step in ms.
        self.assertGreater(float(fields[5]), 0)  # CPU ms per step.
        cpu_added[fields[0]] = float(fields[6].rstrip("%"))
        # Warmed up before run_start, every way compiles nothing after it.
        self.assertEqual(int(fields[10]), 0, line)
    self.assertEqual(set(ratios), {"off", "local", "gcs"})
    self.assertEqual(ratios["off"], 1.0)
    self.assertEqual(cpu_added["off"], 0.0)
    match = re.match(
        r"^mllog_bench: worst_ratio=(\d+\.\d{4}) "
        r"worst_cpu_added=(-?\d+\.\d{2})% "
        r"worst_main_thread_added=(-?\d+\.\d{2})%$",
        proc.stdout.strip().splitlines()[-1],
    )
    self.assertIsNotNone(match, proc.stdout[-500:])
    self.assertAlmostEqual(
        float(match.group(1)), max(ratios["local"], ratios["gcs"]), places=4
    )
    self.assertAlmostEqual(
        float(match.group(2)),
        max(cpu_added["local"], cpu_added["gcs"]),
        places=2,
    )


if __name__ == "__main__":
  absltest.main()
