"""The console, JSONL and TensorBoard writer as a run listener."""

from maxtext.listeners import interface
from maxtext.metrics import writers


class MetricsListener(interface.RunListener):
  """Writes each step's and each eval's record through a `MetricLogger`.

  Train records carry the step's reduced metrics; eval records carry
  `eval_loss` and `eval_time`.
  """

  name = "metrics"

  def __init__(self, logger: writers.MetricLogger):
    self._logger = logger

  def on_step(self, record: interface.StepRecord) -> None:
    self._logger.write_train(
        record.step,
        record.metrics,
        step_time=record.step_time,
        data_wait=record.data_wait,
    )

  def on_eval(self, record: interface.EvalRecord) -> None:
    self._logger.write_eval(
        record.step,
        {"eval_loss": record.eval_loss, "eval_time": record.eval_time},
    )

  def close(self) -> None:
    self._logger.close()
