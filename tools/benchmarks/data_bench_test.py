"""Runs the data_bench binary small: its shape lines, table and last line.

Times are not checked (tests never assert on speed); what is checked is that
the benchmark prepares the corpus, reads it through Grain with and without
worker processes, trains the shrunk default shape with the trainer and
reports the data wait share of that run's own records (the test reads the
run's metrics.jsonl itself), paces the shrunk gpu_1b shape at its FLOP-based
step time and says so, and that the figures it prints agree with each
other: the ratio is pipeline over demand, the FLOP-based demand is the one
`maxtext.metrics.throughput` gives, and the last line names the worst row
and the verdict those rows imply.
"""

import json
import math
import os
import re

from absl.testing import absltest

from maxtext.configs import gpu_1b
from maxtext.metrics import jsonl
from maxtext.metrics import throughput
from testing import runfiles
from testing import tiny_configs

# default.py shrunk to testing/tiny_configs' model (vocabulary raised to the
# tokenizer's 512 by the benchmark); gpu_1b at 2 sequences of 2048 tokens,
# read by one worker count only.
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
_STEPS = 3
_WARMUP_STEPS = 1
_ROW = re.compile(
    r"^(default|gpu_1b)\s+(\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+"
    r"(\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)%\s+(\S+)\s+(\S+)$"
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


def _train_records(output_dir, workers):
  path = os.path.join(
      output_dir, "runs", f"default_workers{workers}", jsonl.METRICS_FILENAME
  )
  return [r for r in jsonl.read_jsonl(path) if r["kind"] == "train"]


class DataBenchTest(absltest.TestCase):

  def test_table_and_verdict(self):
    output_dir = self.create_tempdir().full_path
    proc = _run(
        "--shapes=default,gpu_1b",
        "--workers=0,1",
        "--batches=4",
        "--warmup_batches=1",
        f"--steps={_STEPS}",
        f"--warmup_steps={_WARMUP_STEPS}",
        "--corpus_files=5",
        f"--output_dir={output_dir}",
        f"--set=gpu_1b.global_batch_size={_GPU_BATCH}",
        "--set=gpu_1b.grain_worker_count=0",
        *[f"--set=default.{k}={v}" for k, v in _TINY_DEFAULT.items()],
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    self.assertRegex(lines[0], r"^data_bench: grain over 5 stdlib files")
    self.assertIn("vocab 512", lines[0])
    self.assertIn("goal wait_share <= 2.00%", lines[0])
    default_line = [l for l in lines if l.startswith("default: ")]
    self.assertLen(default_line, 1)
    self.assertIn("global batch 8 x seq 16 (128 tokens)", default_line[0])
    self.assertIn(
        f"trained here by trainer.run ({_STEPS + _WARMUP_STEPS} steps per "
        "row): wait share from its metrics.jsonl",
        default_line[0],
    )
    gpu_line = [l for l in lines if l.startswith("gpu_1b: ")]
    self.assertLen(gpu_line, 1)
    self.assertIn(f"global batch {_GPU_BATCH} x seq 2048", gpu_line[0])
    self.assertIn("wait share from a paced stand-in", gpu_line[0])
    self.assertIn("paced_stand-in rows (gpu_1b): not trained here", proc.stdout)

    rows = [m.groups() for m in map(_ROW.match, lines) if m]
    # --set=gpu_1b.grain_worker_count=0: gpu_1b at that one count.
    self.assertEqual(
        [(r[0], r[1]) for r in rows],
        [("default", "0"), ("default", "1"), ("gpu_1b", "0")],
    )
    # gpu_1b's demand: its FLOPs per step at 40% of an H200's bf16 peak.
    config = gpu_1b.get_config()
    config.global_batch_size = _GPU_BATCH
    run = throughput.StepThroughput.for_run(
        throughput.ThroughputConfig.from_config(config), ["NVIDIA H200"]
    )
    demand = 0.4 * run.peak_flops_per_device / run.flops_per_step
    for row in rows:
      shape, workers, rate, need, ratio, steps = row[:6]
      step_ms, wait_ms, share, times_from, demand_from = row[6:]
      rate, need, ratio = float(rate), float(need), float(ratio)
      step_ms, wait_ms, share = float(step_ms), float(wait_ms), float(share)
      self.assertGreater(rate, 0)
      self.assertGreater(need, 0)
      self.assertAlmostEqual(ratio, rate / need, delta=0.01 + 0.001 * ratio)
      self.assertEqual(int(steps), _STEPS)
      self.assertGreater(step_ms, 0)
      # The wait is part of the step; the share is waits over step times.
      self.assertLessEqual(wait_ms, step_ms)
      self.assertBetween(share, 0.0, 100.0)
      if shape == "gpu_1b":
        self.assertEqual(times_from, "paced_stand-in")
        self.assertEqual(demand_from, "NVIDIA_H200@40%MFU")
        self.assertAlmostEqual(need, demand, delta=0.001)
        # Paced: no step is shorter than the demanded step time.
        self.assertGreaterEqual(step_ms, 1e3 / demand - 0.01)
        continue
      self.assertEqual(times_from, "metrics.jsonl")
      self.assertEqual(demand_from, "trainer")
      # The figures are the trainer's own records past the warm-up.
      train = _train_records(output_dir, workers)
      self.assertEqual(
          [r["step"] for r in train], list(range(_STEPS + _WARMUP_STEPS))
      )
      timed = train[_WARMUP_STEPS:]
      step_s = math.fsum(r["step_time_s"] for r in timed)
      wait_s = math.fsum(r["data_wait_s"] for r in timed)
      self.assertBetween(wait_s / step_s, 0.0, 1.0)
      self.assertAlmostEqual(share, 100 * wait_s / step_s, delta=0.006)
      self.assertAlmostEqual(step_ms, 1e3 * step_s / _STEPS, delta=0.006)
      self.assertAlmostEqual(wait_ms, 1e3 * wait_s / _STEPS, delta=0.0006)
      # Demand: the steps with their data waits taken out.
      busy = _STEPS / (step_s - wait_s)
      self.assertAlmostEqual(need, busy, delta=0.0006 + 1e-6 * busy)

    match = _LAST_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    min_ratio = min(float(r[4]) for r in rows)
    worst = max(float(r[8]) for r in rows)
    self.assertAlmostEqual(float(match.group(1)), min_ratio, delta=0.006)
    self.assertAlmostEqual(float(match.group(2)), worst, delta=0.006)
    met = worst <= 2.0 and min_ratio >= 1
    self.assertEqual(match.group(3), "met" if met else "missed")

  def test_megatron_kind(self):
    output_dir = self.create_tempdir().full_path
    proc = _run(
        "--dataset_type=megatron",
        "--shapes=default",
        "--workers=0,2",
        "--batches=4",
        "--warmup_batches=1",
        f"--steps={_STEPS}",
        f"--warmup_steps={_WARMUP_STEPS}",
        "--corpus_files=5",
        f"--output_dir={output_dir}",
        *[f"--set=default.{k}={v}" for k, v in _TINY_DEFAULT.items()],
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    self.assertRegex(
        lines[0],
        r"^data_bench: megatron over 5 stdlib files .*int32 Megatron "
        r"indexed datasets",
    )
    prefix = os.path.join(output_dir, "data", "train_text_document")
    self.assertTrue(os.path.isfile(prefix + ".idx"))
    self.assertTrue(os.path.isfile(prefix + ".bin"))
    # Read in the trainer's thread: one row, at 0 workers, whatever --workers.
    rows = [m.groups() for m in map(_ROW.match, lines) if m]
    self.assertEqual([(r[0], r[1]) for r in rows], [("default", "0")])
    self.assertEqual(rows[0][9:], ("metrics.jsonl", "trainer"))
    # The trained run read the Megatron files.
    with open(
        os.path.join(output_dir, "runs", "default_workers0", "config.json"),
        encoding="utf-8",
    ) as f:
      recorded = json.load(f)
    self.assertIn('"dataset_type": "megatron"', json.dumps(recorded))
    train = _train_records(output_dir, 0)
    self.assertEqual(
        [r["step"] for r in train], list(range(_STEPS + _WARMUP_STEPS))
    )
    self.assertRegex(lines[-1], _LAST_LINE)

  def test_bad_override_is_a_usage_error(self):
    proc = _run("--shapes=gpu_1b", "--set=gpu_1b.no_such_field=1")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("gpu_1b has no field 'no_such_field'", proc.stderr)

  def test_unknown_device_is_a_usage_error(self):
    proc = _run("--shapes=gpu_1b", "--device_kind=cpu")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("device_kind='cpu': no bfloat16 peak", proc.stderr)

  def test_output_dir_with_files_is_a_usage_error(self):
    output_dir = self.create_tempdir()
    output_dir.create_file("left_over")
    proc = _run("--shapes=gpu_1b", f"--output_dir={output_dir.full_path}")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("want an empty or absent directory", proc.stderr)


if __name__ == "__main__":
  absltest.main()
