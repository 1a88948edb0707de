"""The MLPerf log as a run listener: run events become `:::MLLOG` events.

`start(mlperf, ...)` opens the attempt's log and writes what precedes the
model's initialisation (`cache_clear`, `init_start`, the `submission_*`
keys, the platform's metadata naming the source revision); the listener then
writes the rest as the run reports it:

  on_run_start   hyperparameters, warmup_time, init_stop, run_start,
                 block_start
  on_step        tracked_stats (train loss, step time; with a throughput
                 also samples/s, tokens/s, TFLOP/s per device and MFU
                 where the peak is known)
  on_eval_start  block_stop, eval_start
  on_eval        eval_accuracy (the metric the quality target is on),
                 eval_stop, tracked_stats (validation time),
                 then run_stop(success) at the target or block_start if the
                 run goes on
  on_eval_deferred
                 deferred_eval_checkpoint (`deferred_log`): a deferred_eval
                 run saved the point's weights in place of its eval
  on_run_end     run_stop(aborted) unless the run succeeded; if the
                 initialisation failed before on_run_start, the events of
                 on_run_start first, so the file is a complete sequence.
                 A deferred_eval run that trained its `steps` ends with
                 block_stop and deferred_eval_pending instead: its
                 run_stop comes with its deferred evaluation

Every value comes from the run: samples counts from the samples trained,
warmup and decay steps from the real schedule.
"""

from typing import Optional

from absl import logging

from maxtext.core import caller_paths
from maxtext.listeners import interface
from maxtext.metrics import throughput as throughput_lib
from maxtext.mllog import cache_flush
from maxtext.mllog import deferred_log
from maxtext.mllog import hyperparameters
from maxtext.mllog import logger as mllog_logger
from maxtext.mllog import mlperf_config
from maxtext.mllog import workload_header
from maxtext.storage import build_info


class MLLogListener(interface.RunListener):
  """Writes one attempt's MLPerf log; see the module docstring."""

  name = "mllog"

  def __init__(
      self,
      logger: mllog_logger.MLLogger,
      mlperf: mlperf_config.MlperfConfig,
      *,
      data_parallelism: int,
      config_filename: str,
      throughput: Optional[throughput_lib.StepThroughput] = None,
      header: Optional[workload_header.WorkloadHeader] = None,
  ):
    """Builds the listener over an opened log.

    Args:
      logger: the attempt's MLPerf logger.
      mlperf: the run's MLPerf log settings.
      data_parallelism: the mesh's data axis size.
      config_filename: the config file's name, for the 6.1 disclosure.
      throughput: the run's per-step constants; when given, each step's
        tracked_stats add samples_per_s, tokens_per_s, tflops_per_device and
        mfu (where the peak is known).
      header: the workload's part of the log; None = pretraining's.

    Raises:
      TypeError: `throughput` is neither None nor a StepThroughput.
    """
    if not (
        throughput is None
        or isinstance(throughput, throughput_lib.StepThroughput)
    ):
      raise TypeError(
          "throughput must be a throughput.StepThroughput or "
          f"None, got {throughput!r}"
      )
    self._throughput = throughput
    self._logger = logger
    self._mlperf = mlperf
    self._header = header
    self._data_parallelism = data_parallelism
    self._config_filename = config_filename
    self._started = False  # on_run_start has logged the run's start.

  @property
  def logger(self) -> mllog_logger.MLLogger:
    return self._logger

  # The parameter is named as in the RunListener interface; it shadows the
  # module's start() only inside this method, which does not call it.
  def on_run_start(  # pylint: disable=redefined-outer-name
      self, start: interface.RunStart
  ) -> None:
    self._started = True
    log = self._logger
    log.hyperparameters(
        hyperparameters.run_hyperparameters(
            self._mlperf,
            data_parallelism=self._data_parallelism,
            start_step=start.start_step,
            config_filename=self._config_filename,
            header=self._header,
        )
    )
    if start.warmup_time:
      # Compilation and warm-up, inside the untimed initialisation.
      log.event("warmup_time", round(start.warmup_time, 3))
    log.init_stop()
    log.run_start()
    log.block_start(start.samples)

  def on_step(self, record: interface.StepRecord) -> None:
    stats = {
        "train_loss": record.metrics.get("loss"),
        "step_time": record.step_time,
    }
    if self._throughput is not None and self._logger.enabled:
      # A division and a few products (the constants are precomputed).
      stats.update(self._throughput.figures(record.step_time))
    self._logger.tracked_stats(
        record.step + 1, stats, samples_count=record.samples
    )

  def on_eval_start(self, step: int, samples: int) -> None:
    self._logger.block_stop(samples)
    self._logger.eval_start(samples)

  def on_eval(self, record: interface.EvalRecord) -> None:
    log = self._logger
    # The benchmark's quality metric is the one its target is on: for the
    # language models' benchmarks, the eval loss (log perplexity).
    log.eval_accuracy(record.target_value, record.samples)
    log.eval_stop(record.samples)
    log.tracked_stats(record.step + 1, {"validation_time": record.eval_time})
    if record.target_reached:
      log.run_stop(mllog_logger.SUCCESS, record.samples)
    elif record.continues:
      log.block_start(record.samples)

  def on_eval_deferred(self, point: interface.DeferredEval) -> None:
    deferred_log.log_point(self._logger, point)

  def on_run_end(self, end: interface.RunEnd) -> None:
    if end.outcome == interface.RunOutcome.SUCCESS:
      return  # on_eval logged run_stop(success).
    if not self._started:
      # The initialisation failed after init_start. The log still becomes a
      # complete sequence whose run_stop says the run aborted having trained
      # nothing (the compliance checker then reports only the missing
      # eval_accuracy: there is no result).
      self.on_run_start(interface.RunStart(end.final_step, end.samples))
    elif (
        end.outcome == interface.RunOutcome.COMPLETED
        and self._mlperf.deferred_eval
    ):
      # The result is decided by the deferred evaluation, which closes it.
      deferred_log.log_pending(self._logger, end.samples, end.final_step)
      return
    # The samples really trained, also when no eval reported them yet.
    self._logger.run_stop(mllog_logger.ABORTED, end.samples)

  def close(self) -> None:
    self._logger.close()


def first_log_path(mlperf: mlperf_config.MlperfConfig, run_dir: str) -> str:
  """The path of a run's first attempt's log (`mllog_file`, a local path,
  or `<run_dir>/mllog.log`); later attempts' are `next_attempt_path`'s."""
  if mlperf.mllog_file:  # A local path (MlperfConfig refuses gs:// here).
    return caller_paths.resolve_local_path(mlperf.mllog_file)
  return mllog_logger.default_log_path(mlperf, run_dir)


def start(
    mlperf: mlperf_config.MlperfConfig,
    run_dir: str,
    *,
    process_index: Optional[int],
    data_parallelism: int,
    config_filename: str,
    throughput: Optional[throughput_lib.StepThroughput] = None,
    build: Optional[build_info.BuildInfo] = None,
    header: Optional[workload_header.WorkloadHeader] = None,
) -> MLLogListener:
  """Opens the attempt's MLPerf log and writes its initialisation events.

  With `enable_mllog`, every process first flushes its host's caches
  (`cache_clear_command`; a collective, so every process calls this), and
  `cache_clear` is logged True only if all of them succeeded.

  Args:
    mlperf: the run's MLPerf log settings.
    run_dir: the local run directory (the default log lives there).
    process_index: this process's index (only process 0 writes), or None for
      jax.process_index().
    data_parallelism: the mesh's data axis size.
    config_filename: the config file's name, for the 6.1 disclosure.
    throughput: the run's throughput constants, for each step's
      tracked_stats (samples/s, tokens/s, TFLOP/s per device, MFU); not
      used for a GRPO benchmark, whose steps they do not describe.
    build: the source the run was built from, named in the log's
      submission_platform metadata; pass the one config.json records
      (default: `build_info.loaded()`, this process's code).
    header: the workload's part of the log (`Workload.mlperf_header`);
      None = pretraining's.

  Returns:
    The listener; its logger writes nothing when `enable_mllog` is off or
    this is not process 0.
  """
  path = first_log_path(mlperf, run_dir)
  flushed = _flush_caches(mlperf)
  if hyperparameters.is_grpo_benchmark(mlperf):
    # A GRPO step generates before it trains, on rows of a prompt and a
    # completion: the pretraining step's token and FLOP counts are not its
    # own, so its tracked_stats carry the loss and the step time only.
    throughput = None
  logger = mllog_logger.create_mllogger(
      mlperf, path, process_index=process_index, build=build
  )
  if logger.enabled:
    logging.info("MLPerf log: %s", logger.path)
  logger.cache_clear(flushed)
  logger.init_start()
  logger.submission_info()
  return MLLogListener(
      logger,
      mlperf,
      data_parallelism=data_parallelism,
      config_filename=config_filename,
      throughput=throughput,
      header=header,
  )


def _flush_caches(mlperf: mlperf_config.MlperfConfig) -> bool:
  """Whether every host flushed its caches (a collective with the log on;
  off, nothing is flushed)."""
  if not mlperf.enable_mllog:
    return False
  # Every host flushes (a collective), before the log exists, so that the
  # log's cache_clear states what happened on all of them.
  flush = cache_flush.flush_all_hosts(mlperf.cache_clear_command)
  if not flush.flushed:
    logging.warning("MLPerf log: cache_clear is logged False: %s", flush.reason)
  return flush.flushed
