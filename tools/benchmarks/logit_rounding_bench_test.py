"""Runs logit_rounding_bench on a tiny bfloat16 model: its closing line."""

import re

from absl.testing import absltest

from testing import runfiles

_LAST_LINE = re.compile(r"^logit_rounding_bench: max=(\d+\.\d{3}) bound=(\d+)$")
# A tiny model: 2 layers of width 32, 4 query heads sharing 2 key/value
# heads of 8, vocabulary 64, 32 positions.
_TINY = tuple(
    f"--config.{name}={value}"
    for name, value in dict(
        vocab_size=64, emb_dim=32, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=8, mlp_dim=64, max_sequence_length=32,
    ).items()
)  # fmt: skip


def _run(*args):
  return runfiles.run_binary(
      "tools/benchmarks/logit_rounding_bench", list(_TINY + args), timeout_s=300
  )


class LogitRoundingBenchTest(absltest.TestCase):

  def test_bfloat16_moves_the_difference_within_the_bound(self):
    proc = _run("--config.compute_dtype=bfloat16", "--rows=2", "--length=0")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    self.assertIn("bfloat16 against float32, 64 positions", lines[0])
    match = _LAST_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    self.assertGreater(float(match.group(1)), 0.0)
    self.assertLess(float(match.group(1)), int(match.group(2)))

  def test_a_length_past_the_context_is_a_usage_error(self):
    proc = _run("--length=33")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("--length=33 in 1..32 (max_sequence_length)", proc.stderr)


if __name__ == "__main__":
  absltest.main()
