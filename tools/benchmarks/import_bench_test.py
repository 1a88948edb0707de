"""import_bench on a tiny model: it runs the real import and reports."""

import re

from absl.testing import absltest

from testing import runfiles


class ImportBenchTest(absltest.TestCase):

  def test_reports_the_import_against_the_models_bytes(self):
    done = runfiles.run_binary(
        "tools/benchmarks/import_bench",
        [
            "--layers=3",
            "--emb_dim=64",
            "--mlp_dim=128",
            "--vocab=512",
            "--shards=2",
        ],
        timeout_s=600,
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(
        r"import_bench: layers=3 model_bytes=(\d+) imported_bytes=(\d+) "
        r"peak_rss=(\d+) floor_rss=(\d+) ratio=([\d.]+)",
        last,
    )
    self.assertIsNotNone(match, last)
    model, imported, peak, floor, ratio = match.groups()
    # bfloat16 tensors: 2 bytes per parameter, plus the headers.
    e, m, v, q, kv = 64, 128, 512, 8 * 64, 2 * 64
    params = 2 * v * e + e + 3 * (2 * e + 2 * q * e + 2 * kv * e + 3 * m * e)
    self.assertBetween(int(model) - 2 * params, 0, 64 * 1024)
    self.assertGreater(int(imported), 0)
    self.assertGreater(int(floor), 0)
    self.assertAlmostEqual(float(ratio), int(peak) / int(model), places=2)


if __name__ == "__main__":
  absltest.main()
