"""Runs the memory_bench binary on a shrunk gpu_1b config over 2 CPU devices.

Memory figures are XLA's compiled analysis, deterministic for a given XLA,
so the test checks relations that must hold whatever the version: every
program and policy has a row, full rematerialisation needs fewer
temporaries than none, the update's peak is below every micro-step's, the
donating update's peak is below the non-donating one's by
at least the donated outputs, and the closing line parses.
"""

import re

from absl.testing import absltest

from testing import runfiles

_BINARY = "tools/benchmarks/memory_bench"
_DEEPSEEK = "--config=maxtext/configs/deepseekv3_671b.py"
_LAST_LINE = re.compile(r"^memory_bench: temp_full/none=(\d+\.\d{3})$")
_STATE_LINE = re.compile(
    r"^memory_bench state: total=(\d+\.\d{3}) GB fits 141=(yes|NO) "
    r"80=(yes|NO)$"
)
_SHRINK = {
    "emb_dim": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "mlp_dim": 128,
    "vocab_size": 256,
    "max_sequence_length": 64,
    "global_batch_size": 4,
    "eval_batch_size": 4,
    "loss_chunk_size": 16,
}


class MemoryBenchTest(absltest.TestCase):

  def _run(self, args, *, status=0, timeout_s=300):
    """Runs memory_bench with `args`; checks its exit status."""
    proc = runfiles.run_binary(_BINARY, args, timeout_s=timeout_s)
    self.assertEqual(proc.returncode, status, proc.stderr[-3000:])
    return proc

  def _report(self, args, timeout_s=300) -> list[str]:
    """The lines memory_bench prints with `args`, which must succeed."""
    return self._run(args, timeout_s=timeout_s).stdout.strip().splitlines()

  def test_report_over_two_devices(self):
    lines = self._report(
        [f"--config.{k}={v}" for k, v in _SHRINK.items()]
        + [
            "--host_devices=2",
            "--device_memory_gb=141,0.0001",
            "--unit=MB",
            # Two policies make the closing ratio; each row is compiled, so
            # the other two would only add time.
            "--remat_policy=none,full",
        ],
        timeout_s=600,
    )
    self.assertIn("memory_bench: 2 x cpu (cpu)", lines[0])
    self.assertIn("seq 64, global batch 4 in K=1", lines[0])
    rows = {}
    for line in lines:
      fields = line.split()
      if len(fields) == 10 and fields[1] in ("micro_step", "update"):
        rows[fields[0]] = [float(x) for x in fields[2:8]] + [fields[8:]]
    expected = {
        f"{a}/{r}" for a in ("einsum", "dot_product") for r in ("none", "full")
    }
    self.assertEqual(
        set(rows), expected | {"update/donated", "update/not_donated"}
    )
    for row in rows.values():
      args, out, alias, temp, resident, peak, fits = row
      self.assertAlmostEqual(
          peak, args + out - alias + temp + resident, delta=0.005
      )
      # Tiny: fits 141 GB, not 100 bytes.
      self.assertEqual(fits, ["yes", "NO"])
    for attention in ("einsum", "dot_product"):
      self.assertLess(
          rows[f"{attention}/full"][3], rows[f"{attention}/none"][3]
      )
    for label in expected:
      # The update holds less than any micro-step: the state and the
      # accumulator, no batch, no activations.
      self.assertLess(rows["update/donated"][5], rows[label][5])
    donated, kept = rows["update/donated"], rows["update/not_donated"]
    self.assertGreater(donated[2], 0)  # Parameters and moments aliased.
    self.assertEqual(kept[2], 0)
    self.assertLess(donated[5], kept[5])
    match = _LAST_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    self.assertLess(float(match.group(1)), 1.0)

  def test_deepseek_state_report_on_a_stated_mesh(self):
    # No devices and no compilation: shapes and partition specs only. Every
    # parameter splits 256 ways: the routed experts over expert x fsdp, the
    # other 17.1B over fsdp x expert (axis_rules.PARAMETERS).
    lines = self._report([_DEEPSEEK, "--mesh=expert=32,fsdp=8"])
    self.assertIn("mesh data=1 fsdp=8 expert=32 (256 devices)", lines[0])
    values = {
        l.split()[0]: float(l.split()[1]) for l in lines[2:6] if l.strip()
    }
    self.assertEqual(
        set(values), {"parameters", "gradients", "optimizer", "total"}
    )
    self.assertEqual(values["gradients"], values["parameters"])
    self.assertAlmostEqual(
        values["optimizer"], 2 * values["parameters"], delta=0.002
    )
    # Float32: 671.0B parameters / 256 (but the router's 14,848 correction
    # biases, split over the expert axis alone: 7 KB more).
    self.assertAlmostEqual(values["parameters"], 10.485, delta=0.001)
    match = _STATE_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    self.assertEqual(float(match.group(1)), values["total"])
    self.assertEqual(match.group(2, 3), ("yes", "yes"))

  def test_a_mesh_the_config_cannot_use_is_one_line(self):
    proc = self._run([_DEEPSEEK, "--mesh=expert=3,fsdp=8"], status=2)
    self.assertEqual(
        proc.stderr.strip().splitlines()[-1],
        "memory_bench: error: expert_parallelism=3 does not divide the 256 "
        "experts",
    )
    self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
  absltest.main()
