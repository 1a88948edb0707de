"""import_bench on a tiny model: it runs the real import and reports."""

import re

import math

from absl.testing import absltest
from absl.testing import parameterized

from testing import runfiles


class ImportBenchTest(parameterized.TestCase):

  @parameterized.named_parameters(("bfloat16", False), ("fp8", True))
  def test_reports_the_import_against_the_models_bytes(self, fp8):
    done = runfiles.run_binary(
        "tools/benchmarks/import_bench",
        [
            "--layers=3",
            "--emb_dim=64",
            "--mlp_dim=128",
            "--vocab=512",
            "--shards=2",
        ]
        + (["--fp8"] if fp8 else []),
        timeout_s=600,
    )
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(
        rf"import_bench: format={'fp8' if fp8 else 'bfloat16'} layers=3 "
        r"model_bytes=(\d+) imported_bytes=(\d+) "
        r"peak_rss=(\d+) floor_rss=(\d+) ratio=([\d.]+)",
        last,
    )
    self.assertIsNotNone(match, last)
    model, imported, peak, floor, ratio = match.groups()
    # bfloat16 tensors: 2 bytes per parameter; FP8 matrices 1 byte per
    # parameter and a float32 scale per 128x128 block; plus the headers.
    e, m, v, q, kv = 64, 128, 512, 8 * 64, 2 * 64
    matrices = [(q, e), (kv, e), (kv, e), (e, q), (m, e), (m, e), (e, m)]
    matrix_params = 3 * sum(r * c for r, c in matrices)
    other_params = 2 * v * e + e + 3 * 2 * e
    if fp8:
      scales = 3 * sum(
          math.ceil(r / 128) * math.ceil(c / 128) for r, c in matrices
      )
      expected = matrix_params + 4 * scales + 2 * other_params
    else:
      expected = 2 * (matrix_params + other_params)
    self.assertBetween(int(model) - expected, 0, 64 * 1024)
    self.assertGreater(int(imported), 0)
    self.assertGreater(int(floor), 0)
    self.assertAlmostEqual(float(ratio), int(peak) / int(model), places=2)


if __name__ == "__main__":
  absltest.main()
