"""checksum_bench on a small state: a real checkpoint checksummed, reported."""

import re

from absl.testing import absltest

from testing import runfiles


class ChecksumBenchTest(absltest.TestCase):

  def test_reports_each_figure(self):
    done = runfiles.run_binary(
        "tools/benchmarks/checksum_bench",
        ["--mib=8", "--repeats=1", f"--dir={self.create_tempdir().full_path}"],
        timeout_s=300,
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(
        r"checksum_bench: bytes=(\d+) crc32c_gbps=([\d.]+) write_s=([\d.]+) "
        r"verify_s=([\d.]+) save_s=([\d.]+) restore_s=([\d.]+) "
        r"verify_share=([\d.]+)",
        last,
    )
    self.assertIsNotNone(match, last)
    size = int(match.group(1))
    # 8 MiB of random normal float32: zstd saves a few percent (their
    # exponents repeat), orbax adds its metadata.
    self.assertBetween(size, 7 * 2**20, 9 * 2**20)
    self.assertGreater(float(match.group(2)), 0)
    # The restore includes the verification.
    self.assertLessEqual(float(match.group(7)), 1.0)


if __name__ == "__main__":
  absltest.main()
