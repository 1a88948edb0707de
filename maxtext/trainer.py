"""The training loop: `run(config)` trains, evaluates, checkpoints and logs one run.

`train_main` parses flags and calls `run`; tests call it in-process. One run:

  validate config -> jax.distributed -> mesh -> run directory -> MLPerf init events
  -> data, parameters, optimizer, engine, checkpoint restore -> hyperparameters,
  init_stop, run_start, block_start -> steps (K micro-batches, update, metrics,
  eval every eval_interval, checkpoint between steps) -> run_stop -> close.

Every writer (console, JSONL, TensorBoard, MLPerf log, GCS mirror) is driven from
the host values the step already fetched; the loop adds no device syncs beyond the
one per step that brings the step's metrics to the host. A step's records are
written while the device runs the next step's micro-batches (see `_train_loop`).
"""

import dataclasses
import datetime
import functools
import os
import time
from typing import Callable, Optional

from absl import logging
import jax
import numpy as np

from maxtext.storage import checkpointing
from maxtext import config_lib
from maxtext import data
from maxtext import distributed
from maxtext import engine as engine_lib
from maxtext.storage import gcs_mirror
from maxtext import mesh as mesh_lib
from maxtext.metrics import writers as metric_logger
from maxtext.metrics import recorder as metrics_recorder
from maxtext.mllog import logger as mllog_utils
from maxtext import model
from maxtext import optimizer as optimizer_lib
from maxtext import preemption
from maxtext.storage import run_dir as run_dir_lib

SUCCESS = "success"  # Reached target_eval_loss.
COMPLETED = "completed"  # Ran the step budget (no target, or not reached).
INTERRUPTED = "interrupted"  # Stopped by SIGTERM/SIGINT after a checkpoint.


class TrainingError(RuntimeError):
  """The run cannot go on (e.g. too many consecutive non-finite steps)."""


class HardwareError(RuntimeError):
  """The accelerator the config asks for is not there (and no CPU fallback)."""


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What a run did.

  Attributes:
    status: SUCCESS, COMPLETED or INTERRUPTED.
    run_dir: the local run directory.
    start_step: the step the run started from (0, or the restored checkpoint's).
    final_step: completed optimizer steps at the end.
    last_eval_loss: the newest eval loss, or None if no eval ran.
    last_train_loss: the newest train loss, or None if no step ran.
    stop_reason: for INTERRUPTED, the signal that stopped the run.
  """
  status: str
  run_dir: str
  start_step: int
  final_step: int
  last_eval_loss: Optional[float]
  last_train_loss: Optional[float]
  stop_reason: Optional[str] = None


def _check_hardware(config) -> None:
  """Logs the backend and devices; a missing accelerator is an error unless allowed."""
  backend = jax.default_backend()
  devices = jax.devices()
  logging.info("JAX backend %s: %d device(s) (%s), %d process(es).", backend,
               len(devices), ", ".join(sorted({d.device_kind for d in devices})),
               jax.process_count())
  if config.hardware != backend:
    if config.hardware != "cpu" and backend == "cpu" and config.allow_cpu_fallback:
      logging.warning("hardware=%r requested but JAX found only the CPU; running on "
                      "the CPU because allow_cpu_fallback=True.", config.hardware)
    else:
      raise HardwareError(
          f"hardware={config.hardware!r} requested but JAX's backend is {backend!r} "
          f"(devices: {devices}). Install the {config.hardware} packages or set "
          "--config.allow_cpu_fallback=True to run on the CPU.")


def _run_name(config) -> str:
  """config.run_name, or a timestamp that every process agrees on."""
  if config.run_name:
    return config.run_name
  if jax.process_count() == 1:
    return run_dir_lib.default_run_name()
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  stamp = multihost_utils.broadcast_one_to_all(np.asarray(int(time.time()), np.int64))
  return run_dir_lib.default_run_name(
      datetime.datetime.fromtimestamp(int(stamp), datetime.timezone.utc))


def _abstract(tree, host_sharding):
  """ShapeDtypeStructs (with shardings) of a pytree of arrays.

  Host (NumPy) leaves such as the step counter have no sharding of their own;
  they are restored onto `host_sharding`.
  """
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(
          np.shape(x), x.dtype,
          sharding=getattr(x, "sharding", None) or host_sharding), tree)


class _Run:
  """The state of one run; `run()` below drives it."""

  def __init__(self, config, process_index: Optional[int]):
    self.config = config
    self.process_index = jax.process_index() if process_index is None else process_index
    self.is_primary = self.process_index == 0
    self.mesh = mesh_lib.make_mesh(config)
    mesh_lib.check_batch_layout(config, self.mesh)
    self.paths = run_dir_lib.make_run_paths(config, _run_name(config))
    self.mirror = None
    self.mllog = mllog_utils.MLLogger.disabled()
    self.checkpointer = None
    self.metrics = None
    self.engine = None
    self.profiling = False  # A profiler trace is open (closed by close()).
    self.step_callback = None  # run()'s step_callback.
    # Samples trained so far, resumed ones included; None until restore() has
    # said where the run starts. An aborted run_stop reports it.
    self.samples = None

  # -- set-up ----------------------------------------------------------------

  def prepare_run_dir(self) -> None:
    paths = self.paths
    config = self.config
    if paths.remote_url and not os.path.isdir(paths.run_dir):
      # Resume on a new machine: the GCS mirror holds the run.
      try:
        files = gcs_mirror.download_prefix(
            paths.remote_url, paths.run_dir,
            request_timeout_s=config.gcs_request_timeout_seconds)
      except gcs_mirror.GcsError as e:
        # GCS trouble never stops a run: it starts from what is local (nothing),
        # and resume=True still fails below when no checkpoint is found.
        logging.warning("Could not read the GCS mirror %s (%s); starting without "
                        "its files.", paths.remote_url, e)
        files = []
      if files:
        logging.info("Restored %d files of %s from %s.", len(files), paths.run_dir,
                     paths.remote_url)
    os.makedirs(paths.run_dir, exist_ok=True)
    if paths.remote_url and self.is_primary:
      self.mirror = gcs_mirror.GcsMirror(
          paths.run_dir, paths.remote_url,
          min_interval_s=config.gcs_sync_interval_seconds,
          request_timeout_s=config.gcs_request_timeout_seconds,
          final_timeout_s=config.gcs_final_timeout_seconds)

  def start_mllog(self) -> None:
    config = self.config
    path = config.mllog_file or mllog_utils.default_log_path(config, self.paths.run_dir)
    if config.mllog_file:  # A local path (config_lib refuses gs:// here).
      path = run_dir_lib.resolve_local_path(path)
    self.mllog = mllog_utils.create_mllogger(config, path,
                                             process_index=self.process_index)
    self.mllog.cache_clear()
    self.mllog.init_start()
    self.mllog.submission_info()

  def build(self) -> None:
    config = self.config
    fsdp = self.mesh.shape[mesh_lib.FSDP_AXIS]
    init = functools.partial(model.init_params, config)
    rng = jax.random.PRNGKey(config.seed)
    abstract_params = jax.eval_shape(init, rng)
    self.param_shardings = mesh_lib.param_shardings(
        model.param_partition_specs(abstract_params, fsdp), self.mesh)
    self.batch_sharding = mesh_lib.batch_sharding(self.mesh)
    if config.load_parameters_path:
      params = checkpointing.restore_params_only(
          config.load_parameters_path,
          jax.tree_util.tree_map(
              lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
              abstract_params, self.param_shardings))
    else:
      params = jax.jit(init, out_shardings=self.param_shardings)(rng)
    logging.info("Model: %s parameters.", f"{model.num_params(params):,}")
    self.schedule = optimizer_lib.make_schedule(config)
    self.engine = engine_lib.Engine(
        functools.partial(model.loss_fn, config=config),
        params,
        # The engine clips with the gradient norm it measures for the metrics.
        optimizer_lib.make_optimizer(config, self.schedule, include_clipping=False),
        self.schedule,
        metrics_recorder.MetricsRecorder(mode="train"),
        config.gradient_accumulation_steps,
        param_shardings=self.param_shardings,
        batch_sharding=self.batch_sharding,
        grad_clip_norm=config.grad_clip_norm)
    self.dataset = data.make_dataset(config, jax.process_index(), jax.process_count())
    self.checkpointer = checkpointing.Checkpointer(
        self.paths.checkpoint_dir,
        save_period=config.checkpoint_period or config.steps,
        max_to_keep=config.max_checkpoints_to_keep)

  def restore(self) -> dict:
    """Restores the newest checkpoint, if any; returns its metadata ({} if none)."""
    step = self.checkpointer.latest_step()
    if step is None:
      if self.config.resume:
        raise ValueError(
            f"resume=True but {self.paths.checkpoint_dir} holds no checkpoint (set "
            "run_name to the run to resume)")
      return {}
    replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    state, metadata = self.checkpointer.restore(
        step, _abstract(self.engine.state, replicated))
    self.engine.set_state(state)
    logging.info("Resumed from the checkpoint of step %d in %s.", step,
                 self.paths.checkpoint_dir)
    return metadata

  # -- the loop ----------------------------------------------------------------

  def global_batch(self, local_batch):
    return mesh_lib.global_batch(local_batch, self.batch_sharding)

  def evaluate(self) -> float:
    losses = [self.engine.eval_step(self.global_batch(self.dataset.get_eval_batch(i)))
              for i in range(self.config.eval_steps)]
    return float(np.mean(jax.device_get(losses)))

  def save(self, step: int, samples: int, force: bool = False) -> None:
    saved = self.checkpointer.save(step, self.engine.state,
                                   {"samples_count": samples, "step": step},
                                   force=force)
    if saved:
      logging.info("Checkpoint of step %d: %s", step, self.paths.checkpoint_dir)

  def sync_mirror(self) -> None:
    if self.mirror is not None:
      self.mirror.request_sync()

  def close(self) -> None:
    for closer in (
        # A run that stops inside the profiler window still writes its trace.
        lambda: self.profiling and jax.profiler.stop_trace(),
        lambda: self.metrics and self.metrics.close(),
        lambda: self.checkpointer and self.checkpointer.close(),
        lambda: self.engine and self.engine.close(),
        self.mllog.close,
        lambda: self.mirror and self.mirror.close(),
    ):
      try:
        closer()
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("Closing the run's writers: %s", e)


def _hyperparameters(config, mesh, start_step: int, config_filename: str) -> dict:
  summary = optimizer_lib.schedule_summary(config)
  return mllog_utils.hyperparameters_from_config(
      config,
      warmup_steps=summary["warmup_steps"],
      schedule_steps=summary["schedule_steps"],
      end_learning_rate=summary["end_learning_rate"],
      decay_schedule=summary["decay_schedule"],
      train_samples=config_lib.train_samples(config),
      eval_samples=config_lib.eval_samples(config),
      init_checkpoint_step=start_step,
      micro_batch_size=(config_lib.micro_batch_size(config) //
                        mesh.shape[mesh_lib.DATA_AXIS]),
      config_filename=config_filename,
  )


def run(config, *, config_filename: str = "unknown",
        process_index: Optional[int] = None,
        stop_request: Optional[preemption.StopRequest] = None,
        step_callback: Optional[Callable[[int, float], None]] = None) -> RunResult:
  """Trains one run as the config says.

  Args:
    config: the run's ml_collections config (base.py's fields). It is validated
      here, before any device work.
    config_filename: the config file's name, for the MLPerf log's disclosure.
    process_index: overrides jax.process_index() for the MLPerf log's
      process-0 rule (tests).
    stop_request: where stop requests come from; by default SIGTERM/SIGINT
      handlers are installed for the duration of the run.
    step_callback: called on the host after every optimizer step with
      (completed steps, step time in seconds), the step time the JSONL and
      MLPerf logs report (eval time excluded); the step's records may be
      written later (see `_train_loop`). For benchmarks and tests; it runs
      inside the loop, so its own time counts toward the next step.

  Returns:
    The RunResult.

  Raises:
    ValueError/TypeError: a bad config field, named.
    TrainingError: the run could not go on (e.g. non-finite gradients).
  """
  config_lib.validate(config)
  distributed.initialize(config)
  if config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir",
                      run_dir_lib.resolve_local_path(config.jax_compilation_cache_dir))
  _check_hardware(config)

  own_stop = stop_request is None
  stop = preemption.StopRequest() if own_stop else stop_request
  r = _Run(config, process_index)
  r.step_callback = step_callback
  status = None
  try:
    r.prepare_run_dir()
    r.start_mllog()
    r.build()
    metadata = r.restore()
    start_step = r.engine.step
    r.samples = int(metadata.get("samples_count",
                                 start_step * config.global_batch_size))
    if r.is_primary:
      run_dir_lib.write_config_json(
          r.paths.config_json, config,
          dict(run_dir_lib.provenance(), run_name=r.paths.run_name,
               start_step=start_step, remote_url=r.paths.remote_url))
    r.metrics = metric_logger.MetricLogger(
        r.paths.run_dir, is_primary=r.is_primary, log_period=config.log_period,
        total_steps=config.steps,
        tokens_per_step=config.global_batch_size * config.max_sequence_length,
        first_step=start_step)
    r.mllog.hyperparameters(_hyperparameters(config, r.mesh, start_step,
                                         config_filename))
    r.mllog.init_stop()
    r.mllog.run_start()
    r.mllog.block_start(r.samples)
    r.sync_mirror()

    status, last_eval, last_train = _train_loop(r, start_step, stop)
    return RunResult(status=status, run_dir=r.paths.run_dir, start_step=start_step,
                     final_step=r.engine.step, last_eval_loss=last_eval,
                     last_train_loss=last_train, stop_reason=stop.reason)
  finally:
    if status != SUCCESS:
      # The samples really trained, also when no eval reported them yet.
      r.mllog.run_stop(mllog_utils.ABORTED, r.samples)
    r.close()
    if own_stop:
      stop.close()


@dataclasses.dataclass(frozen=True)
class _StepRecord:
  """A finished step's metrics, waiting to be reduced and written."""
  step: int  # 0-based index of the step.
  buffer: metrics_recorder.MetricsBuffer  # Its flushed metrics (host arrays).
  step_time: float  # Seconds, eval time left out.


def _write_step(r: _Run, record: _StepRecord) -> dict:
  """Writes one step's train record: console/JSONL/TensorBoard and the MLPerf log.

  Returns:
    The step's reduced metrics (name -> float).
  """
  scalars = metrics_recorder.reduce_buffer(record.buffer)
  r.metrics.write_train(record.step, scalars, step_time=record.step_time)
  r.mllog.tracked_stats(record.step + 1, {"train_loss": scalars.get("loss"),
                                          "step_time": record.step_time})
  r.sync_mirror()
  return scalars


def _device_batches(r: _Run, step: int) -> list:
  """Step `step`'s micro-batches, as global arrays on the devices."""
  return [r.global_batch(micro) for micro in data.split_micro_batches(
      r.dataset.get_batch(step), r.config.gradient_accumulation_steps)]


def _train_loop(r: _Run, start_step: int, stop):
  """Runs steps until the target, the budget or a stop request. Returns the outcome.

  The host keeps ahead of the device: once a step's micro-batches are
  dispatched, it puts the next step's micro-batches on the devices and writes
  the previous step's records (reduced metrics to the console, JSONL,
  TensorBoard and MLPerf lines) while the device computes, and only then
  waits in `update()` for the step's metrics. So between the optimizer's
  dispatch and the next step's first micro-batch, the host only looks at the
  step's skip flag and what comes next. A step followed by more than the
  next step (an eval, a checkpoint, a stop, the end) writes its records
  first, so every file keeps step order.
  """
  config = r.config
  consecutive_skipped = 0
  last_eval = last_train = None
  unwritten = None  # A _StepRecord written after the next step's dispatch.
  step_start = time.monotonic()
  batches = _device_batches(r, start_step) if start_step < config.steps else []
  try:
    for step in range(start_step, config.steps):
      if config.profiler_steps and r.is_primary and step == config.profiler_start_step:
        jax.profiler.start_trace(r.paths.tensorboard_dir)
        r.profiling = True
      for micro in batches:
        r.engine.fwd_bwd(micro)
      # The next step's data goes to the devices while this step computes (a
      # run that stops early leaves one batch unused).
      batches = _device_batches(r, step + 1) if step + 1 < config.steps else []
      if unwritten is not None:
        record, unwritten = unwritten, None
        last_train = _write_step(r, record).get("loss")
      buffer = r.engine.update()
      # The step's buffer leaves the recorder (it lives on in its record), so
      # the recorder's history never grows.
      r.engine.recorder.get_metrics_history(clear=True)
      r.samples += config.global_batch_size
      samples = r.samples
      completed = step + 1
      now = time.monotonic()
      step_time, step_start = now - step_start, now
      unwritten = _StepRecord(step, buffer, step_time)
      if r.step_callback is not None:
        r.step_callback(completed, step_time)
      if r.profiling and step + 1 >= config.profiler_start_step + config.profiler_steps:
        jax.profiler.stop_trace()
        r.profiling = False

      if buffer.scalar_metrics["step_skipped"][-1] > 0:
        consecutive_skipped += 1
        logging.warning("Step %d skipped: gradients not finite (%d in a row).", step,
                        consecutive_skipped)
        if consecutive_skipped >= config.max_consecutive_skipped_steps:
          raise TrainingError(
              f"{consecutive_skipped} consecutive steps had non-finite gradients "
              f"(max_consecutive_skipped_steps={config.max_consecutive_skipped_steps}); "
              f"stopping at step {step}. The last checkpoint holds the last good state.")
      else:
        consecutive_skipped = 0

      eval_due = completed % config.eval_interval == 0 or completed == config.steps
      stopping = stop.should_stop(completed)
      save_due = r.checkpointer.due(completed) or completed == config.steps
      if not (eval_due or stopping or save_due):
        continue  # Its records are written once the next step is dispatched.
      record, unwritten = unwritten, None
      last_train = _write_step(r, record).get("loss")

      if eval_due:
        r.mllog.block_stop(samples)
        eval_start = time.monotonic()
        r.mllog.eval_start(samples)
        last_eval = r.evaluate()
        eval_time = time.monotonic() - eval_start
        r.mllog.eval_accuracy(last_eval, samples)
        r.mllog.eval_stop(samples)
        r.mllog.tracked_stats(completed, {"validation_time": eval_time})
        r.metrics.write_eval(step, {"eval_loss": last_eval, "eval_time": eval_time})
        if config.target_eval_loss and last_eval <= config.target_eval_loss:
          logging.info("Eval loss %.4f <= target %.4f at step %d: success.", last_eval,
                       config.target_eval_loss, step)
          r.save(completed, samples, force=True)
          r.mllog.run_stop(mllog_utils.SUCCESS, samples)
          r.sync_mirror()
          return SUCCESS, last_eval, last_train
        if completed < config.steps:
          r.mllog.block_start(samples)
        step_start = time.monotonic()  # Eval time is not step time.

      if stopping:
        r.save(completed, samples, force=True)
        logging.warning("Stopped by %s after step %d; checkpoint saved in %s.",
                        stop.reason, step, r.paths.checkpoint_dir)
        r.sync_mirror()
        return INTERRUPTED, last_eval, last_train
      r.save(completed, samples, force=completed == config.steps)
      r.sync_mirror()
  finally:
    # A step that finished before an error still gets its records.
    if unwritten is not None:
      try:
        _write_step(r, unwritten)
      except Exception:  # pylint: disable=broad-except
        logging.exception("Could not write the records of step %d.", unwritten.step)
  return COMPLETED, last_eval, last_train  # close() ends a trace still open.
