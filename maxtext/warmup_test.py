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

from maxtext import trainer
from maxtext.listeners import interface
from testing import compile_counter
from testing import tiny_configs


class _RunStartTime(interface.RunListener):
  """Notes when the run's timed region began."""

  def __init__(self):
    self.at = None

  def on_run_start(self, start: interface.RunStart) -> None:
    del start
    self.at = time.monotonic()


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
    compile_counter.install()
    start = _RunStartTime()
    began = time.monotonic()
    result = trainer.run(config, extra_listeners=[start])
    self.assertEqual(result.status, trainer.RunOutcome.COMPLETED)
    self.assertIsNotNone(start.at)
    before = compile_counter.count_after(began) - compile_counter.count_after(
        start.at
    )
    after = compile_counter.count_after(start.at)
    self.assertGreater(before, 0)  # The events are seen at all.
    if warmup_steps:
      self.assertEqual(after, 0)
    else:
      self.assertGreater(after, 0)


if __name__ == "__main__":
  absltest.main()
