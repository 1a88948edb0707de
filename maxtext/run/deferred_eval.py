"""Deferred evaluation: a finished `deferred_eval` run, evaluated afterwards.

A run trained with `deferred_eval=True` saved the weights at every point
its eval schedule names (`maxtext/storage/weights_checkpoints.py`) and left
its MLPerf log open (`maxtext/mllog/deferred_log.py`). `evaluate_run`
evaluates those weights in step order with the run's own evaluation
(`trainer.evaluate`: the workload's `evaluate` and its target, as in the
loop), stops at the first that reaches the target, and closes the log:
eval_start/eval_accuracy/eval_stop at each point's samples count, then
run_stop `success` dated at the passing step's update time, or `aborted`
if none passed (`//tools/mlperf:deferred_eval` is the command).

It is given the run's settings and workload, built from its training config
(the same command line) as for training (`maxtext/workloads.py`'s `check`,
whose refusals come first), and refuses, in one line and before anything is
appended: a run that is not there, a config that differs from the run's
record (as a resume would refuse it, and
in the fields that decide what an evaluation measures), a log already
closed or whose training did not finish, and weights-only checkpoints that
are missing, carry no checksums, fail them or are not the log's (their
samples count or update time differ from the point's). What it evaluates
is appended in one write at the end, so a failure part-way appends nothing
and the next attempt starts over.
"""

import dataclasses
import os
import time
from typing import Callable, Optional

from absl import logging
import jax
import numpy as np

from maxtext.core import eval_metrics
from maxtext.core import progress as progress_lib
from maxtext.listeners import multi_listener
from maxtext.mllog import deferred_log
from maxtext.mllog import logger as mllog_logger
from maxtext.mllog import mllog_listener
from maxtext.run import run_settings
from maxtext.run import run_state as run_state_lib
from maxtext.run import trainer
from maxtext.run import workload as workload_lib
from maxtext.runtime import mesh as mesh_lib
from maxtext.storage import checksums
from maxtext.storage import run_dir as run_dir_lib
from maxtext.storage import run_record
from maxtext.storage import weights_checkpoints

# Fields a resume may change (`run_record.RESUMABLE_FIELDS`) that still
# decide what an evaluation measures: the deferred one uses the run's.
EVAL_FIELDS = ("eval_steps",)


class Refused(ValueError):
  """The run cannot be evaluated as asked; one line naming why."""


@dataclasses.dataclass(frozen=True)
class Result:
  """What a deferred evaluation did.

  Attributes:
    status: the run_stop it logged, "success" or "aborted".
    log_path: the MLPerf log it closed.
    evaluations: the points evaluated, in step order (the passing one last).
    target: the run's quality target.
  """

  status: str
  log_path: str
  evaluations: tuple[deferred_log.Evaluation, ...]
  target: eval_metrics.Target


def evaluate_run(
    settings: run_settings.RunSettings,
    workload: workload_lib.Workload,
    *,
    time_fn: Callable[[], float] = time.time,
    progress: Optional[progress_lib.Reporter] = None,
) -> Result:
  """Evaluates a finished deferred_eval run's weights and closes its log.

  Args:
    settings: the run's settings, from its checked training config (its
      run_name names the run).
    workload: the workload its config names.
    time_fn: seconds since the epoch, for the eval lines' times.
    progress: where the checkpoints evaluated (of the log's points) and
      each checkpoint's verification and restore report their progress;
      default: the log, every `progress_interval_s`.

  Returns:
    The Result.

  Raises:
    Refused: see the module docstring; nothing was appended.
    OSError: the log could not be written.
  """
  try:
    settings, paths = _the_run(settings)
    pending = _pending_log(settings, paths.run_dir)
    weights_dir = weights_checkpoints.directory(paths.run_dir)
    _check_weights_present(weights_dir, pending.points)
    trainer.start_jax(settings)
    progress = progress or progress_lib.logged(settings.progress_interval_s)
    state = _eval_state(settings, paths, workload, progress)
    try:
      evaluations = _evaluate_points(
          state, workload, pending, time_fn, progress
      )
    finally:
      state.close()
  finally:
    workload.close()
  status = mllog_logger.ABORTED
  if jax.process_index() == 0:
    status = deferred_log.append(pending, evaluations)
  return Result(
      status=status,
      log_path=pending.path,
      evaluations=tuple(evaluations),
      target=workload.target(settings),
  )


def _the_run(settings: run_settings.RunSettings):
  """The run's paths, once its config is checked against its record.

  Returns:
    (the settings with the run's recorded seed, the run's paths).
  """
  run_name = settings.run_name
  if not run_name:
    raise Refused(
        "config.run_name is empty: give the run_name of the run to evaluate"
    )
  paths = run_dir_lib.make_run_paths(settings.run_dir, run_name)
  recorded = run_record.load_recorded_config(paths.run_dir)
  if recorded is None:
    raise Refused(
        f"no run {run_name!r} in {paths.run_dir}: it holds no"
        f" {run_record.CONFIG_JSON}"
    )
  if not recorded.get("deferred_eval"):
    raise Refused(
        f"run {run_name!r} was not trained with deferred_eval=True:"
        " its log holds its evaluations already"
    )
  try:
    run_record.check_resume(recorded, dict(settings.record), run_name=run_name)
  except run_record.ResumeRefusedError as e:
    fields = "; ".join(line.strip() for line in str(e).splitlines()[1:])
    raise Refused(
        f"the config differs from run {run_name!r}'s recorded config"
        f" in {fields}: evaluate with the config the run trained with"
    ) from e
  for key in EVAL_FIELDS:
    value = settings.record[key]
    if recorded.get(key) != value:
      raise Refused(
          f"config.{key}={value!r} but run {run_name!r} trained"
          f" with {recorded.get(key)!r}: the evaluation must measure what the"
          " run's would have"
      )
  settings = settings.with_seed(
      run_record.resolve_seed(settings.seed, recorded)
  )
  return settings, paths


def _pending_log(
    settings: run_settings.RunSettings, run_dir: str
) -> deferred_log.Pending:
  """The run's newest attempt's log, awaiting its evaluation."""
  first = mllog_listener.first_log_path(settings.mlperf, run_dir)
  attempts = mllog_logger.attempt_paths(first)
  if not attempts:
    raise Refused(f"{first} does not exist: the run wrote no MLPerf log")
  try:
    return deferred_log.read(attempts[-1])
  except deferred_log.LogError as e:
    raise Refused(str(e)) from e


def _check_weights_present(
    weights_dir: str, points: tuple[deferred_log.Point, ...]
) -> None:
  """Every point's weights-only checkpoint is there, with its checksums."""
  missing = [
      p.checkpoint_step
      for p in points
      if not os.path.isdir(os.path.join(weights_dir, str(p.checkpoint_step)))
  ]
  if missing:
    raise Refused(
        f"weights-only checkpoint(s) of step(s)"
        f" {', '.join(map(str, missing))} missing in {weights_dir}: the log"
        f" names {len(points)} point(s), from step"
        f" {points[0].checkpoint_step} to {points[-1].checkpoint_step}"
    )
  unverifiable = [
      p.checkpoint_step
      for p in points
      if not os.path.isfile(
          os.path.join(weights_dir, str(p.checkpoint_step), checksums.MANIFEST)
      )
  ]
  if unverifiable:
    raise Refused(
        f"weights-only checkpoint(s) of step(s)"
        f" {', '.join(map(str, unverifiable))} in {weights_dir} have no"
        f" {checksums.MANIFEST}: they cannot be verified"
    )


def _eval_state(
    settings: run_settings.RunSettings,
    paths,
    workload,
    progress: progress_lib.Reporter,
) -> run_state_lib.RunState:
  """A run state to evaluate in: the run's model, engine and data, no
  outputs; its checkpointer is the run's weights-only one."""
  mesh = mesh_lib.make_mesh(workload.mesh_config(settings))
  mesh_lib.check_batch_layout(settings.batch, mesh)
  weights = weights_checkpoints.open_checkpointer(
      paths.run_dir, progress=progress
  )
  try:
    engine, setup = workload.engine_factory(settings, mesh)
    dataset = workload.make_dataset(
        settings, jax.process_index(), jax.process_count()
    )
  except BaseException:
    weights.close()
    raise
  return run_state_lib.RunState(
      settings=settings,
      paths=paths,
      is_primary=jax.process_index() == 0,
      setup=setup,
      engine=engine,
      dataset=dataset,
      checkpointer=weights,
      listeners=multi_listener.MultiListener(),
      start_step=0,
      samples=0,
      weights=weights,
  )


def _evaluate_points(
    state: run_state_lib.RunState,
    workload: workload_lib.Workload,
    pending: deferred_log.Pending,
    time_fn: Callable[[], float],
    progress: progress_lib.Reporter,
) -> list[deferred_log.Evaluation]:
  """Evaluates the points in order up to the first that reaches the target,
  reporting the checkpoints evaluated of the log's points."""
  target = workload.target(state.settings)
  abstract = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      state.engine.params,
  )
  evaluations = []
  with progress.start(
      "deferred_eval", len(pending.points), "checkpoints"
  ) as job:
    for point in pending.points:
      evaluation = _evaluate_point(state, workload, point, abstract, time_fn)
      evaluations.append(evaluation)
      job.advance(
          1,
          f"step {point.checkpoint_step}: {target.metric}"
          f" {evaluation.value:.6g}"
          + (" reaches the target" if evaluation.reached else ""),
      )
      if evaluation.reached:
        break
  return evaluations


def _evaluate_point(
    state: run_state_lib.RunState,
    workload: workload_lib.Workload,
    point: deferred_log.Point,
    abstract,
    time_fn: Callable[[], float],
) -> deferred_log.Evaluation:
  """Restores one point's weights and evaluates them."""
  target = workload.target(state.settings)
  params = _restore(state.weights, point, abstract)
  state.engine.set_state(
      dict(
          state.engine.state,
          params=params,
          step=np.asarray(point.checkpoint_step, np.int64),
      )
  )
  state.samples = point.samples
  start = time_fn()
  record = trainer.evaluate(state, workload, point.checkpoint_step - 1, target)
  evaluation = deferred_log.Evaluation(
      point=point,
      value=record.target_value,
      reached=record.target_reached,
      start_time=start,
      stop_time=time_fn(),
  )
  logging.info(
      "Deferred eval of step %d (samples %d): %s %.6g%s",
      point.checkpoint_step,
      point.samples,
      target.metric,
      evaluation.value,
      " reaches the target" if evaluation.reached else "",
  )
  return evaluation


def _restore(weights, point: deferred_log.Point, abstract):
  """The point's parameters, verified, and checked to be the log's."""
  where = f"weights-only checkpoint step {point.checkpoint_step}"
  try:
    params, saved = weights_checkpoints.restore(
        weights, point.checkpoint_step, abstract
    )
  # A damaged checkpoint shows as many error types (checksums, orbax,
  # TensorStore); each is a refusal naming the step.
  except Exception as e:
    first = (str(e).strip().splitlines() or [""])[0]
    raise Refused(
        f"{where} in {weights.directory} cannot be read:"
        f" {type(e).__name__}: {first}"
    ) from e
  if (saved.samples, saved.update_time_ms) != (
      point.samples,
      point.update_time_ms,
  ):
    raise Refused(
        f"{where} holds samples_count {saved.samples}, update_time_ms"
        f" {saved.update_time_ms} but the log's point says {point.samples},"
        f" {point.update_time_ms}: it is not the checkpoint the log names"
    )
  return params
