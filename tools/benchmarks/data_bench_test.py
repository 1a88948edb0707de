"""Runs the data_bench binary small: its shape lines, table and last line.

Times are not checked (tests never assert on speed); what is checked is that
the benchmark prepares the corpus, reads it through Grain with and without
worker processes, trains the shrunk default shape here and paces the shrunk
gpu_1b shape at its FLOP-based step time, and that the figures it prints
agree with each other: the ratio is pipeline over demand, the FLOP-based
demand is the one `maxtext.metrics.throughput` gives, and the last line
names the worst row and the verdict those rows imply.
"""

import re

from absl.testing import absltest

from maxtext.configs import gpu_1b
from maxtext.metrics import throughput
from testing import runfiles
from testing import tiny_configs

# default.py shrunk to testing/tiny_configs' model (vocabulary raised to the
# tokenizer's 512 by the benchmark); gpu_1b at 2 sequences of 2048 tokens.
_TINY_DEFAULT = {
    "emb_dim": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "head_dim": 16,
    "mlp_dim": 64,
    "max_sequence_length": 16,
    "global_batch_size": 8,
}
_GPU_BATCH = 2
_ROW = re.compile(
    r"^(default|gpu_1b)\s+(\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+"
    r"(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)%\s+(\S+)$"
)
_LAST_LINE = re.compile(
    r"^data_bench: min_ratio=(\d+\.\d\d) worst_wait_share=(\d+\.\d\d)% "
    r"goal=(met|missed)$"
)


def _run(*args):
  return runfiles.run_binary(
      "tools/benchmarks/data_bench",
      [f"--compilation_cache_dir={tiny_configs.compilation_cache_dir()}"]
      + list(args),
      timeout_s=600,
  )


class DataBenchTest(absltest.TestCase):

  def test_table_and_verdict(self):
    proc = _run(
        "--shapes=default,gpu_1b",
        "--workers=0,1",
        "--batches=6",
        "--warmup_batches=2",
        "--steps=4",
        "--warmup_steps=2",
        "--corpus_files=5",
        f"--set=gpu_1b.global_batch_size={_GPU_BATCH}",
        *[f"--set=default.{k}={v}" for k, v in _TINY_DEFAULT.items()],
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    self.assertRegex(lines[0], r"^data_bench: grain over 5 stdlib files")
    self.assertIn("vocab 512", lines[0])
    self.assertIn("goal wait_share <= 2.00%", lines[0])
    self.assertTrue(
        any(
            l.startswith("default: global batch 8 x seq 16 (128 tokens)")
            and "this CPU:" in l
            for l in lines
        ),
        proc.stdout,
    )
    gpu_line = [l for l in lines if l.startswith("gpu_1b: ")]
    self.assertLen(gpu_line, 1)
    self.assertIn(f"global batch {_GPU_BATCH} x seq 2048", gpu_line[0])
    self.assertNotIn("this CPU", gpu_line[0])

    rows = [m.groups() for m in map(_ROW.match, lines) if m]
    self.assertEqual(
        [(r[0], r[1]) for r in rows],
        [("default", "0"), ("default", "1"), ("gpu_1b", "0"), ("gpu_1b", "1")],
    )
    # gpu_1b's demand: its FLOPs per step at 40% of an H200's bf16 peak.
    config = gpu_1b.get_config()
    config.global_batch_size = _GPU_BATCH
    run = throughput.StepThroughput.for_run(config, ["NVIDIA H200"])
    demand = 0.4 * run.peak_flops_per_device / run.flops_per_step
    for shape, _, rate, need, ratio, step_ms, wait_ms, share, source in rows:
      rate, need, ratio = float(rate), float(need), float(ratio)
      self.assertGreater(rate, 0)
      self.assertGreater(need, 0)
      self.assertAlmostEqual(ratio, rate / need, delta=0.01 + 0.001 * ratio)
      self.assertGreater(float(step_ms), 0)
      # The wait is part of the step; the share is waits over step times.
      self.assertLessEqual(float(wait_ms), float(step_ms))
      self.assertLessEqual(float(share), 100.0)
      if shape == "gpu_1b":
        self.assertEqual(source, "NVIDIA_H200@40%MFU")
        self.assertAlmostEqual(need, demand, delta=0.001)
        # Paced: no step is shorter than the demanded step time.
        self.assertGreaterEqual(float(step_ms), 1e3 / demand - 0.01)
      else:
        self.assertEqual(source, "cpu")

    match = _LAST_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    min_ratio = min(float(r[4]) for r in rows)
    worst = max(float(r[7]) for r in rows)
    self.assertAlmostEqual(float(match.group(1)), min_ratio, delta=0.006)
    self.assertAlmostEqual(float(match.group(2)), worst, delta=0.006)
    met = worst <= 2.0 and min_ratio >= 1
    self.assertEqual(match.group(3), "met" if met else "missed")

  def test_bad_override_is_a_usage_error(self):
    proc = _run("--shapes=gpu_1b", "--set=gpu_1b.no_such_field=1")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("gpu_1b has no field 'no_such_field'", proc.stderr)

  def test_unknown_device_is_a_usage_error(self):
    proc = _run("--shapes=gpu_1b", "--device_kind=cpu")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("device_kind='cpu': no bfloat16 peak", proc.stderr)


if __name__ == "__main__":
  absltest.main()
