"""The warm-up leaves no compilation to the timed region of a run.

MLPerf times a run from `run_start`. A run with `warmup_steps_before_run_start`
traces and compiles every program of its steps, its evaluation and its
checkpoints before `init_stop`; this test counts JAX's own compilation events
(`testing.compile_counter`) after `run_start`, a count that does not depend
on the machine's speed. The run without warm-up is the control: its first
steps compile in the timed region, so the count can fail.
"""

import time

from absl.testing import absltest
from absl.testing import parameterized

from maxtext import workloads
from maxtext.run import trainer
from testing import compile_counter
from testing import tiny_configs


class WarmUpTest(parameterized.TestCase):

  @parameterized.named_parameters(("warmed_up", 1), ("control", 0))
  def test_compilations_after_run_start(self, warmup_steps):
    # Steps, two evaluations and a checkpoint between them, as the default
    # config runs them; MLPerf logging on.
    config = tiny_configs.tiny_config(
        self.create_tempdir().full_path,
        steps=10,
        eval_interval=5,
        checkpoint_period=5,
        warmup_steps_before_run_start=warmup_steps,
    )
    counter = compile_counter.RunStartCounter()
    began = time.monotonic()
    result = workloads.run(config, extra_listeners=[counter])
    self.assertEqual(result.status, trainer.RunOutcome.COMPLETED)
    self.assertIsNotNone(counter.at)
    after = counter.count()
    before = compile_counter.count_after(began) - after
    self.assertGreater(before, 0)  # The events are seen at all.
    if warmup_steps:
      self.assertEqual(after, 0)
    else:
      self.assertGreater(after, 0)


if __name__ == "__main__":
  absltest.main()
