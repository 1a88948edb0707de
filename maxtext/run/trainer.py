"""The training loop: `run(settings, workload=...)` trains, evaluates,
checkpoints one run.

The one loop of every workload (pretraining, SFT, GRPO; see
`maxtext/run/workload.py` for what a workload supplies). It takes the run's
settings (`run_settings.RunSettings`), which the caller that holds the
run's config builds once it is checked (`maxtext/workloads.py`: `check`
makes every check a run makes before any device work, and `run` calls this
module's); `train_main` and `grpo_main` parse flags and call
`workloads.run`, as tests and benchmarks do in-process. One run:

  jax.distributed ->
  run_state.build (mesh, run directory, outputs, the workload's engine and
  data, checkpoint restore) -> the workload's start (e.g. GRPO's eval of the
  starting parameters) and its batch source -> warm-up (compilation before
  the timed region) -> on_run_start -> steps (K micro-batches pulled from
  the batch source, update, records, evals as `eval_schedule` says,
  checkpoint between steps) -> on_run_end -> close.

With `deferred_eval` the evals are not run: at each point the schedule
names, the loop saves the weights (`RunState.save_weights`) and reports the
point (`on_eval_deferred`); `maxtext/run/deferred_eval.py` evaluates them
after the run with this module's `evaluate`.

The loop knows no output: it reports to the run's listeners (console, JSONL,
TensorBoard, MLPerf log, GCS mirror, profiler; see `maxtext/listeners/`),
which write from host values the step already fetched. A critical listener
that fails, or user code that fails (`batch_source.UserCodeError`: a GRPO
reward function), stops the run after a checkpoint of the last completed
step.
"""

import dataclasses
import time
from typing import Optional, Sequence

from absl import logging
import jax

from maxtext.core import caller_paths
from maxtext.runtime import distributed
from maxtext.core import eval_metrics
from maxtext.config import eval_schedule
from maxtext.runtime import preemption
from maxtext.run import batch_source as batch_source_lib
from maxtext.run import run_settings
from maxtext.run import run_state as run_state_lib
from maxtext.run import workload as workload_lib
from maxtext.listeners import interface
from maxtext.listeners import multi_listener
from maxtext.metrics import recorder as metrics_recorder

RunOutcome = interface.RunOutcome
ListenerError = multi_listener.ListenerError


class ConfigError(ValueError):
  """The config, a path it names or the run's directory cannot be used.

  Raised before any training step (before any device work for the config's
  own fields and paths); the message names the field and the value.
  """


class TrainingError(RuntimeError):
  """The run cannot go on (e.g. too many consecutive non-finite steps)."""


class HardwareError(RuntimeError):
  """The accelerator the config asks for is not there (and no CPU fallback)."""


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What a run did.

  Attributes:
    status: how it ended (SUCCESS, COMPLETED or INTERRUPTED).
    run_dir: the local run directory.
    start_step: the step the run started from (0, or the restored one).
    final_step: completed optimizer steps at the end.
    last_eval_loss: the newest eval loss, or None if no eval ran.
    last_train_loss: the newest train loss, or None if no step ran.
    stop_reason: for INTERRUPTED, the signal that stopped the run.
    last_eval: the newest eval's metrics (name -> value), or None.
    start_eval: the starting parameters' eval metrics, for a workload that
      evaluates them before its first step (GRPO), else None.
  """

  status: RunOutcome
  run_dir: str
  start_step: int
  final_step: int
  last_eval_loss: Optional[float]
  last_train_loss: Optional[float]
  stop_reason: Optional[str] = None
  last_eval: Optional[dict[str, float]] = None
  start_eval: Optional[dict[str, float]] = None


def _check_hardware(settings: run_settings.RunSettings) -> None:
  """Logs the backend and devices; a missing accelerator is an error unless
  allowed. hardware="auto" runs on whatever JAX found."""
  backend = jax.default_backend()
  devices = jax.devices()
  logging.info(
      "JAX backend %s: %d device(s) (%s), %d process(es)%s.",
      backend,
      len(devices),
      ", ".join(sorted({d.device_kind for d in devices})),
      jax.process_count(),
      " (hardware='auto')" if settings.hardware == "auto" else "",
  )
  if settings.hardware not in ("auto", backend):
    if (
        settings.hardware != "cpu"
        and backend == "cpu"
        and settings.allow_cpu_fallback
    ):
      logging.warning(
          "hardware=%r requested but JAX found only the CPU; "
          "running on the CPU because allow_cpu_fallback=True.",
          settings.hardware,
      )
    else:
      raise HardwareError(
          f"hardware={settings.hardware!r} requested but JAX's backend is "
          f"{backend!r} (devices: {devices}). Install the {settings.hardware} "
          "packages or set --config.allow_cpu_fallback=True to run on the CPU."
      )


def run(
    settings: run_settings.RunSettings,
    *,
    workload: workload_lib.Workload,
    config_filename: str = "unknown",
    stop_request: Optional[preemption.StopRequest] = None,
    extra_listeners: Sequence[interface.RunListener] = (),
) -> RunResult:
  """Trains one run as its settings say.

  Args:
    settings: the run's settings, built from its checked config
      (`maxtext.workloads.check`: every check before any device work).
    workload: the kind of training its config names, with its own
      settings. The loop sits below every workload:
      `maxtext.workloads.run(config)` builds both and calls this.
    config_filename: the config file's name, for the MLPerf log's disclosure.
    stop_request: where stop requests come from; by default SIGTERM/SIGINT
      handlers are installed for the duration of the run.
    extra_listeners: more outputs of the run (see `maxtext/listeners/`),
      called after the built-in ones under the same failure policy; also
      how benchmarks and tests watch a run. They run inside the loop, so
      their time counts toward the steps' times.

  Returns:
    The RunResult.

  Raises:
    ConfigError: a config problem found while building the run (the batch
      against the mesh, its run directory, a resume), named.
    TrainingError: the run could not go on (e.g. non-finite gradients).
    ListenerError: an output failed; a checkpoint of the last completed step
      was written first.
    batch_source.UserCodeError: user code the run called failed (e.g. a
      GRPO reward function's RewardError), after a checkpoint of the last
      completed step.
  """
  start_jax(settings)
  stop = stop_request or preemption.StopRequest()
  try:
    try:
      state = _build(settings, workload, config_filename, extra_listeners)
    except run_state_lib.AlreadyFinished as done:
      logging.warning("%s", done)
      return RunResult(
          status=RunOutcome.COMPLETED,
          run_dir=done.run_dir,
          start_step=done.step,
          final_step=done.step,
          last_eval_loss=None,
          last_train_loss=None,
      )
    return _train(state, workload, stop)
  finally:
    workload.close()
    if stop_request is None:
      stop.close()


def _build(settings, workload, config_filename, extra_listeners):
  """`run_state.build`, a config problem it finds a ConfigError.

  Building checks what needs the devices, the run directory or the
  checkpoints: the batch against the mesh, the run's record, a resume
  without a checkpoint, parameters of another shape.

  Raises:
    ConfigError: as `run_state.build`'s ValueError.
    run_state.AlreadyFinished: the run trained its steps already.
  """
  try:
    return run_state_lib.build(
        settings,
        config_filename=config_filename,
        extra_listeners=extra_listeners,
        workload=workload,
    )
  except ValueError as e:
    raise ConfigError(str(e)) from e


def _train(state, workload, stop) -> RunResult:
  """Starts the workload, warms up, trains and ends the built run."""
  outcome = RunOutcome.FAILED
  try:
    try:
      start_eval = workload.start(state)
    except workload_lib.RefusedStart as e:
      raise ConfigError(str(e)) from e
    source = workload.batch_source(state)
    warmup_time = workload.warm_up(state)
    state.listeners.on_run_start(
        interface.RunStart(state.start_step, state.samples, warmup_time)
    )
    outcome, last_eval, last_train = _train_loop(state, workload, source, stop)
  except (ListenerError, batch_source_lib.UserCodeError):
    # An output or user code failed: keep what was trained. The engine
    # holds the last completed step's state even mid-step (update() not
    # yet called).
    _checkpoint_quietly(state)
    raise
  finally:
    _end(state, outcome)
  return RunResult(
      status=outcome,
      run_dir=state.paths.run_dir,
      start_step=state.start_step,
      final_step=state.engine.step,
      last_eval_loss=_eval_loss(last_eval),
      last_train_loss=last_train,
      stop_reason=stop.reason,
      last_eval=_values(last_eval),
      start_eval=start_eval,
  )


def start_jax(settings: run_settings.RunSettings) -> None:
  """Starts JAX as the run's settings say: `jax.distributed`, the
  persistent compilation cache, and the hardware check.

  Raises:
    HardwareError: the accelerator the run asks for is not there.
  """
  distributed.initialize(settings.distributed)
  if settings.jax_compilation_cache_dir:
    jax.config.update(
        "jax_compilation_cache_dir",
        caller_paths.resolve_local_path(settings.jax_compilation_cache_dir),
    )
  _check_hardware(settings)


def _checkpoint_quietly(state: run_state_lib.RunState) -> None:
  """Checkpoints the completed steps on the way out of a failure.

  A second failure while saving is logged: the first one is what the user
  must see.
  """
  try:
    state.save(force=True)
  # The error already on its way out is the one to report.
  except Exception:  # pylint: disable=broad-except
    logging.exception("Could not checkpoint step %d.", state.engine.step)


def _end(state: run_state_lib.RunState, outcome: RunOutcome) -> None:
  """Ends the run for every output, then closes everything.

  The checkpointer closes (waiting for its saves) before the listeners, so
  the GCS mirror's final pass uploads the last checkpoint.

  Raises:
    ListenerError: an output failed while ending, unless another exception
      is already on its way out (that one wins; this one was logged).
  """
  failure = None
  try:
    state.listeners.on_run_end(
        interface.RunEnd(outcome, state.engine.step, state.samples)
    )
  except ListenerError as e:
    failure = e
  state.close()
  try:
    state.listeners.close()
  except ListenerError as e:
    failure = failure or e
  if failure is not None and outcome != RunOutcome.FAILED:
    raise failure


@dataclasses.dataclass(frozen=True)
class _Finished:
  """A finished step whose records wait to be written."""

  step: int  # 0-based index of the step.
  buffer: metrics_recorder.MetricsBuffer  # Its flushed metrics (host arrays).
  step_time: float  # Seconds, eval time left out.
  samples: int  # Samples trained once it finished.
  data_wait: float  # Seconds of step_time spent waiting for the data set.

  def record(self) -> interface.StepRecord:
    return interface.StepRecord(
        self.step,
        metrics_recorder.reduce_buffer(self.buffer),
        self.step_time,
        self.samples,
        self.data_wait,
    )


class _SkipGuard:
  """Counts consecutive steps with non-finite gradients; too many stop.

  A skipped step leaves the train state as it was, so every checkpoint,
  also one written between skipped steps, holds a good state.
  """

  def __init__(self, limit: int, checkpointer):
    self._limit = limit
    self._count = 0
    self._checkpointer = checkpointer

  def check(self, step: int, buffer: metrics_recorder.MetricsBuffer) -> None:
    """Counts a skipped step or resets; raises TrainingError at the limit."""
    if not buffer.scalar_metrics["step_skipped"][-1] > 0:
      self._count = 0
      return
    self._count += 1
    logging.warning(
        "Step %d skipped: gradients not finite (%d in a row).",
        step,
        self._count,
    )
    if self._count >= self._limit:
      raise TrainingError(
          f"{self._count} consecutive steps had non-finite gradients "
          f"(max_consecutive_skipped_steps={self._limit}); stopping at step "
          f"{step}. {self._where_good_state_is()}"
      )

  def _where_good_state_is(self) -> str:
    """Names the checkpoint a resume starts from, or says there is none."""
    directory = self._checkpointer.directory
    latest = self._checkpointer.latest_step()
    if latest is None:
      # The run's record fixes the config that diverged: a corrected one
      # starts under another run_name.
      return (
          f"No checkpoint was written yet ({directory} holds none): nothing "
          "trained is kept; a new start begins from step 0 under a new "
          "run_name."
      )
    return (
        f"Checkpoint step {latest} in {directory} holds the last good "
        "state; a resume starts from it."
    )


def _train_loop(state: run_state_lib.RunState, workload, source, stop):
  """Runs steps until the target, the budget or a stop request.

  Each step is `_Steps.train` (the step's micro-batches from `source`, its
  update and its record), then `_Steps.after` (what falls between steps:
  evals, checkpoints, the stop).

  Returns:
    (outcome, last eval record or None, last train loss).
  """
  steps = _Steps(state, workload.target(state.settings), source, stop)
  try:
    for step in range(state.start_step, state.settings.steps):
      steps.train(step)
      outcome = steps.after(step, workload)
      if outcome is not None:
        return outcome, steps.last_eval, steps.last_train
  finally:
    steps.write_unwritten()
  return RunOutcome.COMPLETED, steps.last_eval, steps.last_train


class _Steps:
  """The training steps of one attempt, pulled from the batch source.

  The host keeps ahead of the device: it writes the previous step's
  records once all but the step's last micro-batch are dispatched (the last
  one takes the step's update), and draws the next step's batch (when the
  source `draws_ahead`) once the last is dispatched (before it, when the
  source `reads_parameters`: a rollout drawn ahead must see the parameters
  before the update), both while the device computes, and only then waits
  in `update()` for the step's metrics. A step followed by more than the
  next step (an eval, a checkpoint, a stop, the end) writes its records
  first, so every output keeps step order.

  With the source's `updates_per_batch` = n > 1 (GRPO's passes over one
  rollout), a batch feeds steps b * n .. b * n + n - 1, its samples count
  once, and evals, checkpoints and stops fall only after a batch's last
  update.

  Attributes:
    last_eval: the newest eval's record, or None.
    last_train: the newest written train loss, or None.
  """

  def __init__(self, state, target, source, stop):
    self._state = state
    self._target = target
    self._source = source
    self._stop = stop
    self._skips = _SkipGuard(
        state.settings.max_consecutive_skipped_steps, state.checkpointer
    )
    self.last_eval = self.last_train = None
    self._evals = state.settings.eval_schedule
    self._unwritten = None  # A _Finished step, written after the next dispatch.
    self._step_start = time.monotonic()
    # The first step's time holds the draw of its own batch; every later
    # step's holds the draw of the next one, which overlaps it (when the
    # source draws ahead; otherwise each step draws its own).
    self._batch = self._draw(state.start_step) if source.draws_ahead else None
    self._data_wait = 0.0 if self._batch is None else self._batch.data_wait

  def _draw(self, step: int) -> batch_source_lib.Batch:
    """Step `step`'s batch, drawn with the engine's parameters now."""
    engine = self._state.engine
    return self._source.draw(
        step, batch_source_lib.Policy(engine.params, engine.step)
    )

  def _draw_next(self, step: int) -> None:
    """Draws step `step + 1`'s batch ahead, its wait counted into step's."""
    self._batch = self._draw(step + 1)
    self._data_wait += self._batch.data_wait

  def train(self, step: int) -> None:
    """Step `step`: its micro-batches, its update, its record."""
    state, source = self._state, self._source
    engine = state.engine
    state.listeners.on_step_start(step)
    if not source.draws_ahead:
      self._batch = self._draw(step)
      self._data_wait = self._batch.data_wait
    *head, last = self._batch.micro_batches
    for micro in head:
      engine.fwd_bwd(micro)
    # The previous step's records are written before the step's last
    # micro-batch, which takes its update: a failing output then finds
    # the engine between updates, holding the completed steps' state.
    self._write_unwritten()
    # A draw with the parameters (a rollout drawn ahead) comes before the
    # last micro-batch, which updates them; any other draw overlaps it.
    if source.draws_ahead and source.reads_parameters:
      self._draw_next(step)
    engine.fwd_bwd(last)
    if source.draws_ahead and not source.reads_parameters:
      self._draw_next(step)
    # The step's buffer leaves the recorder: it lives on in its record.
    buffer = engine.update(release=True)
    source.complete_record(step, buffer)
    if step % source.updates_per_batch == 0:
      state.samples += state.settings.global_batch_size
    now = time.monotonic()
    self._unwritten = _Finished(
        step, buffer, now - self._step_start, state.samples, self._data_wait
    )
    self._step_start, self._data_wait = now, 0.0
    self._skips.check(step, buffer)

  def after(self, step: int, workload) -> Optional[RunOutcome]:
    """What falls after step `step`: an eval, a checkpoint, a stop.

    Returns:
      How the run ends after this step (SUCCESS, INTERRUPTED), or None if
      it goes on.
    """
    state, settings = self._state, self._state.settings
    completed = step + 1
    passes = self._source.updates_per_batch
    if completed % passes:
      return None  # The batch feeds more updates: nothing falls between.
    eval_due = eval_schedule.eval_due(
        self._evals, completed, updates_per_batch=passes
    )
    stopping = self._stop.should_stop(completed)
    save_due = state.checkpointer.due(completed) or completed == settings.steps
    if not (eval_due or stopping or save_due):
      return None  # Its records are written once the next step is dispatched.
    self._write_unwritten()
    if eval_due and settings.deferred_eval:
      _defer_eval(state, step)
      self._step_start = time.monotonic()  # Saving is not step time.
    elif eval_due:
      self.last_eval = _evaluate(state, workload, step, self._target)
      if self.last_eval.target_reached:
        self._log_success(step)
        _checkpoint(state, force=True)
        return RunOutcome.SUCCESS
      self._step_start = time.monotonic()  # Eval time is not step time.
    _checkpoint(state, force=stopping or completed == settings.steps)
    if not stopping:
      return None
    # "After step N" counts completed steps, as the checkpoint's step, the
    # stop request's log line and RunResult.final_step do.
    logging.warning(
        "Stopped by %s after step %d; checkpoint step %d saved in %s.",
        self._stop.reason,
        completed,
        completed,
        state.paths.checkpoint_dir,
    )
    return RunOutcome.INTERRUPTED

  def _log_success(self, step: int) -> None:
    """Logs the eval after step `step` that reached the target."""
    metric = self.last_eval.metrics[self._target.metric]
    logging.info(
        "Eval %s %.4f %s target %.4f at step %d: success.",
        self._target.metric,
        metric.value,
        metric.direction.symbol,
        self._target.threshold,
        step,
    )

  def _write_unwritten(self) -> None:
    """Writes the finished step's records, if any wait."""
    if self._unwritten is not None:
      finished, self._unwritten = self._unwritten, None
      self.last_train = _write(self._state.listeners, finished)

  def write_unwritten(self) -> None:
    """On the way out: a step that finished before an error still gets its
    records (a failing output is logged: the error already on its way out
    is the one to report)."""
    if self._unwritten is None:
      return
    try:
      self._state.listeners.on_step(self._unwritten.record())
    # The error already on its way out is the one to report.
    except Exception:  # pylint: disable=broad-except
      logging.exception(
          "Could not write the records of step %d.", self._unwritten.step
      )


def _write(listeners, finished: _Finished) -> Optional[float]:
  """Hands a finished step's record to the listeners; returns its loss."""
  record = finished.record()
  listeners.on_step(record)
  return record.metrics.get("loss")


def evaluate(
    state: run_state_lib.RunState,
    workload: workload_lib.Workload,
    step: int,
    target: eval_metrics.Target,
) -> interface.EvalRecord:
  """Evaluates the engine's parameters after step `step`: the run's eval.

  The one evaluation of every run: the loop's (`_evaluate`) and the
  deferred evaluation's of saved weights (`maxtext/run/deferred_eval.py`).

  Args:
    state: the run state; its engine holds the parameters evaluated and
      `samples` the samples trained before them.
    workload: the run's workload (its `evaluate`).
    step: 0-based index of the last training step before the eval.
    target: the run's quality target.

  Returns:
    The eval's record; nothing is reported.
  """
  start = time.monotonic()
  metrics = workload.evaluate(state)
  reached = target.reached(metrics)
  return interface.EvalRecord(
      step=step,
      metrics=metrics,
      target_metric=target.metric,
      eval_time=time.monotonic() - start,
      samples=state.samples,
      target_reached=reached,
      continues=not reached and step + 1 < state.settings.steps,
  )


def _evaluate(
    state: run_state_lib.RunState,
    workload: workload_lib.Workload,
    step: int,
    target: eval_metrics.Target,
) -> interface.EvalRecord:
  """Runs the eval after step `step` and reports it; returns its record."""
  state.listeners.on_eval_start(step, state.samples)
  record = evaluate(state, workload, step, target)
  state.listeners.on_eval(record)
  return record


def _defer_eval(state: run_state_lib.RunState, step: int) -> None:
  """Saves the weights after step `step` for deferred evaluation and
  reports the point.

  The update time is taken once the parameters are ready, so it is never
  before the step's update finished (MLPerf's rule for the time a deferred
  result's clock stops at); the save copies the same parameters.
  """
  jax.block_until_ready(state.engine.params)
  update_time = time.time()
  state.save_weights(update_time)
  state.listeners.on_eval_deferred(
      interface.DeferredEval(
          step=step,
          samples=state.samples,
          directory=state.weights.directory,
          update_time=update_time,
      )
  )


def _eval_loss(record: Optional[interface.EvalRecord]) -> Optional[float]:
  """The record's eval loss, None without a record or a loss in it."""
  loss = None if record is None else record.metrics.get(eval_metrics.LOSS)
  return None if loss is None else loss.value


def _values(
    record: Optional[interface.EvalRecord],
) -> Optional[dict[str, float]]:
  """The record's metrics as name -> value, None without a record."""
  if record is None:
    return None
  return {name: metric.value for name, metric in record.metrics.items()}


def _checkpoint(state: run_state_lib.RunState, force: bool) -> None:
  if state.save(force=force):
    state.listeners.on_checkpoint(state.engine.step, state.paths.checkpoint_dir)
