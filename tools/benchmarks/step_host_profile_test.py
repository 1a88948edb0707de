"""Runs the step_host_profile binary on a tiny model: its table and counts.

Times are not checked (tests never assert on speed). The counts are: a
trainer step of K = 2 micro-batches launches the micro-step twice (the last
one takes the update) and the flush's one concatenation, and brings its
metrics home with one `jax.device_get` and no other host read.
"""

import re

from absl.testing import absltest

from testing import runfiles
from testing import tiny_configs


class StepHostProfileTest(absltest.TestCase):

  def test_components_and_counts_of_a_step(self):
    proc = runfiles.run_binary(
        "tools/benchmarks/step_host_profile",
        tiny_configs.tiny_flags(absltest.get_default_test_tmpdir())
        + ["--steps=8", "--count_steps=7", "--skip_steps=3"],
        timeout_s=600,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    out = proc.stdout
    self.assertIn("timed: 4 steps from step 3", out)
    self.assertIn("counted: 3 steps from step 3", out)
    rows = {
        match.group(1).strip(): float(match.group(4))
        for match in re.finditer(
            r"^(\S[^\n]*?)\s+(\d+\.\d)\s+(\d+\.\d)\s+(\d+\.\d\d)$", out, re.M
        )
    }
    # Calls per step: two micro-batches, one update, one batch read (the
    # next step's), one record written (the previous step's).
    self.assertEqual(rows["engine.fwd_bwd"], 2.0)
    self.assertEqual(rows["engine.update"], 1.0)
    self.assertEqual(rows["data: read and place"], 1.0)
    self.assertEqual(rows["reduce_buffer"], 1.0)
    self.assertEqual(rows["on_step: metrics"], 1.0)
    self.assertIn(
        "launches per step: jit(_concat_groups) 1.00, jit(micro_step) 2.00\n",
        out,
    )
    # Each of the two micro-batches is placed on the devices with one call
    # per array (its inputs and targets).
    self.assertIn(
        "transfers per step: jax.device_get 1.00, "
        "jax.make_array_from_process_local_data 4.00\n",
        out,
    )
    self.assertNotIn("host read", out)
    match = re.search(
        r"^step_host_profile: launches_per_step=3\.00 "
        r"fetches_per_step=1\.00 host_cpu_us_per_step=\d+ tail_us=\d+$",
        out.strip().splitlines()[-1],
    )
    self.assertIsNotNone(match, out[-800:])


if __name__ == "__main__":
  absltest.main()
