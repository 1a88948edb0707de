"""The console, JSONL and TensorBoard writer as a run listener."""

from maxtext.listeners import interface
from maxtext.metrics import jsonl
from maxtext.metrics import writers


class MetricsListener(interface.RunListener):
  """Writes each step's and each eval's record through a `MetricLogger`.

  Train records carry the step's reduced metrics; eval records carry each
  eval metric under its `jsonl.metric_key` ("loss" -> `eval_loss`), then
  `eval_time`.
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
    values = {
        jsonl.metric_key(jsonl.EVAL, name): metric.value
        for name, metric in record.metrics.items()
    }
    if jsonl.EVAL_TIME_KEY in values:
      raise ValueError(
          f"an eval metric named 'time' would write over "
          f"{jsonl.EVAL_TIME_KEY!r}, the eval's duration"
      )
    values[jsonl.EVAL_TIME_KEY] = record.eval_time
    self._logger.write_eval(record.step, values)

  def close(self) -> None:
    self._logger.close()
