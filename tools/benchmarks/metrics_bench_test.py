"""Runs the metrics_bench binary small: its dispatch counts and closing line.

Times are not checked. The dispatch counts are exact and machine-independent,
so they are: per step, K micro-steps and one optimizer apply for every way,
plus what each way adds to bring the metrics home.
"""

from absl.testing import absltest

from testing import runfiles

_M = 5
_KS = (2, 8)


def _expected_dispatches(k: int) -> dict[str, int]:
  """Dispatches per step of each way, at K=k micro-batches of _M metrics."""
  plain = k + 1  # K micro-steps and the optimizer apply.
  return {
      "baseline": plain,
      "dict_step": plain,
      "a/append": plain + _M * k,  # One append per metric and micro-batch.
      "b/stack": plain + _M,  # One stack per metric.
      "c/engine": plain + 1,  # One concatenation of the packed arrays.
      "d/per_name": plain + 1,  # M*K <= 256 values: one launch.
  }


# The ways the binary reports.
_WAYS = tuple(_expected_dispatches(1))


class MetricsBenchTest(absltest.TestCase):

  def test_dispatch_counts_and_closing_line(self):
    proc = runfiles.run_binary(
        "tools/benchmarks/metrics_bench",
        [
            f"--num_metrics={_M}",
            f"--ks={','.join(map(str, _KS))}",
            "--rounds=2",
            "--block=1",
        ],
        timeout_s=600,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    dispatches = {}
    for line in proc.stdout.splitlines():
      fields = line.split()
      if len(fields) >= 4 and fields[0].isdigit() and fields[1] in _WAYS:
        dispatches[(int(fields[0]), fields[1])] = int(fields[-1])
    for k in _KS:
      self.assertEqual(
          {w: dispatches[(k, w)] for w in _WAYS},
          _expected_dispatches(k),
          f"K={k}",
      )
    self.assertRegex(
        proc.stdout.strip().splitlines()[-1],
        r"^metrics_bench: engine/stack=-?\d+\.\d{4} "
        r"engine/append=-?\d+\.\d{4} per_name/append=-?\d+\.\d{4}$",
    )


if __name__ == "__main__":
  absltest.main()
