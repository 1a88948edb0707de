"""GRPO as one job of two real `grpo_main` processes (jax.distributed on the
CPU, one device each): the records of a one-process run, written once."""

import os

from absl.testing import absltest

from maxtext.metrics import jsonl
from testing import grpo_start
from testing import multiprocess
from testing import runfiles
from testing import tiny_configs

_TIMEOUT_S = 600


class GrpoMultiProcessTest(absltest.TestCase):

  def test_two_processes_give_the_one_process_records(self):
    root = self.create_tempdir().full_path
    start = grpo_start.pretrained_checkpoints(root)

    def flags(run_name):
      return tiny_configs.tiny_flags(
          root,
          run_name=run_name,
          steps=4,
          extra=dict(
              grpo_start.RUN_FIELDS,
              load_parameters_path=start,
              eval_interval=2,
              checkpoint_period=2,
          ),
      )

    command = runfiles.binary_command("maxtext/grpo_main")
    processes = multiprocess.launch(
        2, flags("job"), os.path.join(root, "logs"), command=command
    )
    codes = multiprocess.wait_all(processes, _TIMEOUT_S)
    self.assertEqual(
        codes,
        [0, 0],
        processes[0].output()[-3000:] + processes[1].output()[-3000:],
    )
    for process in processes:
      self.assertIn("grpo_main: completed after step 4", process.output())
    single = runfiles.run_binary(
        "maxtext/grpo_main",
        flags("single"),
        timeout_s=_TIMEOUT_S,
        cache_compilations=True,
    )
    self.assertEqual(single.returncode, 0, single.stderr[-3000:])

    def records(run_name):
      return jsonl.read_jsonl(
          os.path.join(root, run_name, jsonl.METRICS_FILENAME)
      )

    job, alone = records("job"), records("single")
    # One record per step and eval: process 0 alone wrote them.
    self.assertEqual(
        [(r["step"], r["kind"]) for r in job],
        [(r["step"], r["kind"]) for r in alone],
    )
    self.assertLen([r for r in job if r["kind"] == "train"], 4)
    for got, want in zip(job, alone):
      names = (
          grpo_start.COMPARED_METRICS
          if got["kind"] == "train"
          else ("eval_pass@1",)
      )
      for name in names:
        self.assertAlmostEqual(
            got[name], want[name], places=5, msg=f"{name} at {got['step']}"
        )
    self.assertGreater(max(r.get("kl", 0.0) for r in job), 0.0)


if __name__ == "__main__":
  absltest.main()
