"""Everything one run holds, built from its settings by one function.

`build(settings, ...)` turns the run's checked settings
(`run_settings.RunSettings`) into a `RunState`: the mesh,
the run directory (fetched from its GCS mirror on a new machine), the
outputs as listeners (MLPerf log, console/JSONL/TensorBoard, profiler, GCS
mirror), the model and its engine, the data, the checkpointer, and the
restored checkpoint if there is one. The training loop
(`maxtext/run/trainer.py`) only reads it and calls its methods.

The data and the checkpoint directory are opened first, then the MLPerf log
(its `init_start` must precede the model's initialisation); every other
output is added once the restore has said where the run starts. If building
fails, what was opened is closed again, and an MLPerf log already opened
ends as a complete sequence with an aborted `run_stop`.
"""

import contextlib
import dataclasses
import datetime
import fnmatch
import os
import time
from typing import Optional, Sequence

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from maxtext.data import builtin_datasets
from maxtext.data import dataset as dataset_lib
from maxtext.engine import engine as engine_lib
from maxtext.core import eval_metrics
from maxtext.core import progress
from maxtext.runtime import mesh as mesh_lib
from maxtext.engine import model_setup
from maxtext.run import run_settings
from maxtext.run import workload as workload_lib
from maxtext.listeners import interface
from maxtext.listeners import multi_listener
from maxtext.listeners import profiler
from maxtext.metrics import jsonl
from maxtext.metrics import metrics_listener
from maxtext.metrics import throughput
from maxtext.metrics import writers
from maxtext.mllog import mllog_listener
from maxtext.storage import checkpointing
from maxtext.storage import data_state
from maxtext.storage import gcs_mirror
from maxtext.storage import lock_listener
from maxtext.storage import mirror_listener
from maxtext.storage import run_dir as run_dir_lib
from maxtext.storage import run_lock
from maxtext.storage import run_record
from maxtext.storage import weights_checkpoints

# Not mirrored: orbax's unfinished checkpoints, checkpoints set aside as
# damaged or partial, and the local lock file (the bucket holds the run's own
# lock object under that name, see run_lock).
_MIRROR_EXCLUDE = (
    *gcs_mirror.DEFAULT_EXCLUDE,
    *checkpointing.SET_ASIDE_PATTERNS,
    run_lock.LOCK_FILE_NAME,
)


@dataclasses.dataclass
class RunState:
  """One run's state; see the module docstring.

  Attributes:
    settings: the attempt's settings (its seed resolved).
    paths: the run's directories.
    is_primary: whether this is process 0 (the one that writes outputs).
    setup: the model's mesh and shardings.
    engine: the training engine (parameters, optimizer state, step).
    dataset: this process's share of the data.
    checkpointer: the run's checkpoint directory.
    listeners: every output of the run.
    start_step: completed steps at the start of this attempt.
    samples: samples trained so far, resumed ones included.
    weights: the weights-only checkpoints of a `deferred_eval` run
      (`storage/weights_checkpoints.py`), else None.
  """

  settings: run_settings.RunSettings
  paths: run_dir_lib.RunPaths
  is_primary: bool
  setup: model_setup.ModelSetup
  engine: engine_lib.Engine
  dataset: dataset_lib.Dataset
  checkpointer: checkpointing.Checkpointer
  listeners: multi_listener.MultiListener
  start_step: int
  samples: int
  weights: Optional[checkpointing.Checkpointer] = None

  def device_batches(self, step: int) -> tuple[list, float]:
    """Step `step`'s micro-batches as global arrays on the devices.

    Returns:
      (micro-batches, seconds spent waiting for the data set to give the
      batch, its transfer to the devices left out); ([], 0.0) past the last
      step.
    """
    if step >= self.settings.steps:
      return [], 0.0
    start = time.monotonic()
    batch = self.dataset.get_batch(step)
    wait = time.monotonic() - start
    micro_batches = [
        mesh_lib.global_batch(micro, self.setup.batch_sharding)
        for micro in builtin_datasets.split_micro_batches(
            batch, self.settings.gradient_accumulation_steps
        )
    ]
    return micro_batches, wait

  def evaluate(self) -> dict[str, eval_metrics.EvalMetric]:
    """Each eval metric's mean over `eval_steps` batches, with its direction.

    The language model's is "loss", the mean eval loss in nats per token.
    """
    per_batch = jax.device_get(
        [
            self.engine.eval_step(
                mesh_lib.global_batch(
                    self.dataset.get_eval_batch(i), self.setup.batch_sharding
                )
            )
            for i in range(self.settings.eval_steps)
        ]
    )
    return {
        name: eval_metrics.EvalMetric(
            float(np.mean([values[name] for values in per_batch])), direction
        )
        for name, direction in self.engine.eval_directions.items()
    }

  def save(self, force: bool = False) -> bool:
    """Checkpoints the completed steps if due (or `force`d) and not saved yet.

    Returns:
      True if a checkpoint was started.
    """
    step = self.engine.step
    saved = self.checkpointer.save(
        step,
        self.engine.state,
        {"samples_count": self.samples, "step": step},
        force=force,
    )
    if saved:
      logging.info("Checkpoint of step %d: %s", step, self.paths.checkpoint_dir)
      # The base class's default is None; data sets with a position (Grain's
      # iterator) override it.
      # pylint: disable-next=assignment-from-no-return
      position = self.dataset.checkpoint_state(step)
      if position is not None:
        # The data pipeline's position for this checkpoint, one file per
        # process; states of rotated-out checkpoints go.
        data_state.save(
            self.paths.checkpoint_dir, step, jax.process_index(), position
        )
        data_state.prune(
            self.paths.checkpoint_dir, self.checkpointer.all_steps()
        )
    return saved

  def save_weights(self, update_time: float) -> bool:
    """Saves the parameters as the weights-only checkpoint of the completed
    steps, for deferred evaluation (`deferred_eval` runs only).

    Args:
      update_time: seconds since the epoch at which the step's update had
        finished.

    Returns:
      True if a save was started (False: that step exists already).
    """
    step = self.engine.step
    saved = weights_checkpoints.save(
        self.weights,
        step,
        self.engine.params,
        samples=self.samples,
        update_time=update_time,
    )
    if saved:
      logging.info(
          "Weights of step %d saved for deferred evaluation: %s",
          step,
          self.weights.directory,
      )
    return saved

  def close(self) -> None:
    """Releases checkpointers, engine and data (listeners close separately)."""
    closers = [self.checkpointer.close]
    if self.weights is not None:
      closers.append(self.weights.close)
    for closer in (
        *closers,
        self.engine.close,
        self.dataset.close,
    ):
      try:
        closer()
      # Closing must reach every part; the checkpointer's own errors were
      # raised by the saves that caused them.
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("Closing the run: %s", e)


def _run_name(settings: run_settings.RunSettings) -> str:
  """The run's run_name, or a timestamp that every process agrees on."""
  if settings.run_name:
    return settings.run_name
  if jax.process_count() == 1:
    return run_dir_lib.default_run_name()
  stamp = multihost_utils.broadcast_one_to_all(
      np.asarray(int(time.time()), np.int64)
  )
  return run_dir_lib.default_run_name(
      datetime.datetime.fromtimestamp(int(stamp), datetime.timezone.utc)
  )


class AlreadyFinished(Exception):
  """The run already trained its `steps`: nothing to do, no output written.

  Attributes:
    step: the newest checkpoint's step.
    run_dir: the run directory.
  """

  def __init__(self, message: str, step: int, run_dir: str):
    super().__init__(message)
    self.step = step
    self.run_dir = run_dir


def _run_id(paths: run_dir_lib.RunPaths) -> Optional[str]:
  """The run's id: recorded, or, for a new run, drawn (process 0's,
  broadcast); None for a run recorded before runs had ids."""
  if run_record.load_recorded_config(paths.run_dir) is not None:
    return run_record.recorded_run_id(paths.run_dir)
  run_id = run_record.new_run_id()
  if jax.process_count() > 1:
    digits = np.frombuffer(bytes.fromhex(run_id), np.uint32)
    run_id = (
        np.asarray(multihost_utils.broadcast_one_to_all(digits), np.uint32)
        .tobytes()
        .hex()
    )
  return run_id


def _draw_seed() -> int:
  """A fresh seed; with several processes, process 0's, broadcast."""
  seed = run_record.new_seed()
  if jax.process_count() > 1:
    seed = int(multihost_utils.broadcast_one_to_all(np.asarray(seed, np.int32)))
  return seed


def _lock_run(
    settings: run_settings.RunSettings,
    paths: run_dir_lib.RunPaths,
    is_primary: bool,
) -> Optional[run_lock.RunLocks]:
  """Process 0 locks the run's directories; every process learns the outcome.

  Raises:
    RunLockError: another run holds one of them (on every process, so none
      starts training).
  """
  locations = [paths.run_dir]
  if paths.remote_url:
    locations.append(paths.remote_url)
  if settings.run_dir.checkpoint_directory:
    locations.append(paths.checkpoint_dir)
  locks, error = None, None
  if is_primary:
    try:
      locks = run_lock.acquire_run_locks(
          locations,
          refresh_interval_s=settings.run_lock_refresh_interval_seconds,
          request_timeout_s=settings.gcs_request_timeout_seconds,
      )
    except run_lock.RunLockError as e:
      error = e
  if jax.process_count() > 1:
    locked = multihost_utils.broadcast_one_to_all(
        np.asarray(error is None and is_primary, np.int32)
    )
    if not int(locked) and error is None:
      error = run_lock.RunLockError(
          paths.run_dir, None, "process 0 could not lock the run directory"
      )
  if error is not None:
    raise error
  return locks


def _fetch_remote_run(
    settings: run_settings.RunSettings, paths: run_dir_lib.RunPaths
) -> None:
  """On a new machine, a gs:// run's files come from its mirror."""
  if not paths.remote_url:
    return
  local = set(os.listdir(paths.run_dir)) if os.path.isdir(paths.run_dir) else ()
  if set(local) - {run_lock.LOCK_FILE_NAME}:
    return  # The local staging holds the run: it is the newest copy.
  try:
    files = gcs_mirror.download_prefix(
        paths.remote_url,
        paths.run_dir,
        request_timeout_s=settings.gcs_request_timeout_seconds,
        list_timeout_s=settings.gcs_startup_timeout_seconds,
        exclude=_MIRROR_EXCLUDE,
        progress=progress.logged(settings.progress_interval_s),
    )
  except gcs_mirror.GcsError as e:
    # GCS trouble never stops a run: it starts from what is local (nothing),
    # and resume=True still fails when no checkpoint is found.
    logging.warning(
        "Could not read the GCS mirror %s (%s); starting without its files.",
        paths.remote_url,
        e,
    )
    return
  if files:
    logging.info(
        "Restored %d files of %s from %s.",
        len(files),
        paths.run_dir,
        paths.remote_url,
    )


def _check_start_over(
    settings: run_settings.RunSettings, paths, checkpointer
) -> None:
  """A start from step 0 over an earlier attempt's records needs start_over.

  Raises:
    ValueError: the run directory has metrics records or set-aside
      checkpoints and no checkpoint, without start_over=True; or
      start_over=True while a checkpoint exists.
  """
  latest = checkpointer.latest_step()
  if latest is not None:
    if settings.start_over:
      raise ValueError(
          f"start_over=True but {paths.checkpoint_dir} holds the checkpoint of"
          f" step {latest}, which this run would resume from; drop start_over"
          " or choose another run_name"
      )
    return
  found = []
  metrics = os.path.join(paths.run_dir, jsonl.METRICS_FILENAME)
  if os.path.isfile(metrics) and os.path.getsize(metrics):
    found.append(metrics)
  if os.path.isdir(paths.checkpoint_dir):
    found += sorted(
        os.path.join(paths.checkpoint_dir, name)
        for name in os.listdir(paths.checkpoint_dir)
        if any(
            fnmatch.fnmatch(name, p) for p in checkpointing.SET_ASIDE_PATTERNS
        )
    )
  if found and not settings.start_over:
    raise ValueError(
        f"run directory {paths.run_dir} holds records of an earlier attempt"
        f" ({', '.join(found)}) but no checkpoint to resume from; set"
        " start_over=True to train it again from step 0 (its metrics records"
        " are then replaced)"
    )


def _abstract(tree, host_sharding):
  """ShapeDtypeStructs (with shardings) of a pytree of arrays.

  Host (NumPy) leaves such as the step counter have no sharding of their
  own; they are restored onto `host_sharding`.
  """
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(
          np.shape(x),
          x.dtype,
          sharding=getattr(x, "sharding", None) or host_sharding,
      ),
      tree,
  )


def _restore(engine, checkpointer, paths, mesh) -> dict:
  """Restores the newest checkpoint that restores, if any; returns its
  metadata. Damaged newer ones are set aside (see
  `Checkpointer.restore_newest`)."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  restored = checkpointer.restore_newest(_abstract(engine.state, replicated))
  if restored is None:
    return {}  # A new run (build checked `resume` already).
  engine.set_state(restored.state)
  for aside in restored.set_aside:
    logging.warning(
        "Checkpoint of step %d could not be restored (%s); %s. "
        "Resuming from the older step %d instead.",
        aside.step,
        aside.reason,
        f"moved to {aside.moved_to}" if aside.moved_to else "left in place",
        restored.step,
    )
  logging.info(
      "Resumed from the checkpoint of step %d in %s.",
      restored.step,
      paths.checkpoint_dir,
  )
  return restored.metadata


def _output_listeners(
    settings: run_settings.RunSettings,
    paths,
    is_primary: bool,
    start_step: int,
    step_throughput: throughput.StepThroughput,
) -> list[interface.RunListener]:
  """The outputs besides the MLPerf log, in the order they are called."""
  listeners = [
      metrics_listener.MetricsListener(
          writers.MetricLogger(
              paths.run_dir,
              is_primary=is_primary,
              log_period=settings.log_period,
              total_steps=settings.steps,
              tokens_per_step=step_throughput.tokens_per_step,
              first_step=start_step,
              throughput=step_throughput,
          )
      )
  ]
  if settings.profiler_steps and is_primary:
    listeners.append(
        profiler.ProfilerListener(
            paths.tensorboard_dir,
            settings.profiler_start_step,
            settings.profiler_steps,
        )
    )
  return listeners


def build(
    settings: run_settings.RunSettings,
    *,
    workload: workload_lib.Workload,
    config_filename: str = "unknown",
    extra_listeners: Sequence[interface.RunListener] = (),
) -> RunState:
  """Builds the run's state from its (checked) settings.

  Args:
    settings: the run's settings, built from its checked config.
    workload: the run's kind of training (`maxtext/run/workload.py`): its
      engine, its data set and its rows' length for the throughput
      figures.
    config_filename: the config file's name, for the MLPerf log.
    extra_listeners: more outputs, called after the built-in ones (and
      before the GCS mirror), under the same failure policy.

  Returns:
    The RunState, with every listener added; the caller calls
    `listeners.on_run_start` when it starts training.

  Raises:
    ValueError/TypeError: a config problem found while building (e.g. the
      batch does not fit the mesh, resume=True without a checkpoint, a
      resume that changes a field the run's record fixes).
    RunLockError: another run holds the run directory.
    AlreadyFinished: the run's newest checkpoint is at or past `steps`.
  """
  mesh, step_throughput = _mesh_and_throughput(settings, workload)
  paths = run_dir_lib.make_run_paths(settings.run_dir, _run_name(settings))
  # What is opened is closed again, in reverse order, if building fails.
  with contextlib.ExitStack() as opened:
    state = _open_run(
        settings,
        paths,
        _Devices(mesh, step_throughput),
        workload,
        opened,
        config_filename=config_filename,
        extra_listeners=extra_listeners,
    )
    opened.pop_all()  # The run state owns everything from here on.
  return state


@dataclasses.dataclass(frozen=True)
class _Devices:
  """The training mesh and the throughput figures of a step on it."""

  mesh: jax.sharding.Mesh
  throughput: throughput.StepThroughput


def _open_run(
    settings: run_settings.RunSettings,
    paths: run_dir_lib.RunPaths,
    devices: _Devices,
    workload: workload_lib.Workload,
    opened: contextlib.ExitStack,
    *,
    config_filename: str,
    extra_listeners: Sequence[interface.RunListener],
) -> RunState:
  """`build`'s steps once the mesh and the paths are known: the lock, the
  inputs, the MLPerf log, the engine, the restore, the record, the other
  outputs; what is opened is closed by `opened`."""
  is_primary = jax.process_index() == 0
  locks = _lock_run(settings, paths, is_primary)
  if locks is not None:
    opened.callback(locks.release)  # Last: after the outputs closed.
  outputs = _Outputs()
  opened.callback(outputs.abandon)
  # The data and the checkpoint directory are opened (and checked) before
  # the MLPerf log exists: a mistake there leaves no log behind.
  settings, checkpointer, dataset = _open_inputs(
      settings, paths, is_primary, locks, outputs, opened, workload
  )
  weights = _open_weights(settings, paths, locks, opened)
  outputs.listeners.add(
      mllog_listener.start(
          settings.mlperf,
          paths.run_dir,
          process_index=jax.process_index(),
          data_parallelism=devices.mesh.shape[mesh_lib.DATA_AXIS],
          config_filename=config_filename,
          throughput=devices.throughput,
          header=workload.mlperf_header(),
      )
  )
  engine, setup = workload.engine_factory(settings, devices.mesh)
  opened.callback(engine.close)
  _resume(settings, engine, dataset, checkpointer, paths, devices.mesh, outputs)
  if is_primary:
    _record_attempt(
        settings, paths, dataset, outputs.start_step, checkpointer.run_id
    )
  outputs_of_run = _output_listeners(
      settings, paths, is_primary, outputs.start_step, devices.throughput
  )
  return RunState(
      settings=settings,
      paths=paths,
      is_primary=is_primary,
      setup=setup,
      engine=engine,
      dataset=dataset,
      checkpointer=checkpointer,
      listeners=outputs.complete([*outputs_of_run, *extra_listeners], locks),
      start_step=outputs.start_step,
      samples=outputs.samples,
      weights=weights,
  )


def _mesh_and_throughput(
    settings: run_settings.RunSettings, workload: workload_lib.Workload
) -> tuple[jax.sharding.Mesh, throughput.StepThroughput]:
  """The training mesh (the batch's layout and the workload's device checks
  passed) and the throughput figures of a step on its devices.

  Raises:
    ValueError/TypeError: the batch does not fit the mesh, or the workload
      refuses the devices.
  """
  mesh = mesh_lib.make_mesh(workload.mesh_config(settings))
  mesh_lib.check_batch_layout(settings.batch, mesh)
  workload.check_devices(settings, mesh)
  step_throughput = throughput.StepThroughput.for_run(
      settings.throughput,
      [d.device_kind for d in mesh.devices.flat],
      row_length=workload.row_length(),
  )
  return mesh, step_throughput


def _open_weights(
    settings: run_settings.RunSettings,
    paths: run_dir_lib.RunPaths,
    locks: Optional[run_lock.RunLocks],
    opened: contextlib.ExitStack,
) -> Optional[checkpointing.Checkpointer]:
  """The weights-only checkpoints of a `deferred_eval` run, else None;
  closed by `opened`."""
  if not settings.deferred_eval:
    return None
  weights = weights_checkpoints.open_checkpointer(
      paths.run_dir,
      fence=locks.check if locks is not None else None,
      progress=progress.logged(settings.progress_interval_s),
  )
  opened.callback(weights.close)
  return weights


class _Outputs:
  """The run's listeners while `build` assembles them.

  The MLPerf log comes first; the GCS mirror, made early, joins after every
  other output (it uploads what they wrote), the run's locks last. `abandon`
  ends and closes a failed build's outputs.

  Attributes:
    listeners: the outputs added so far.
    mirror: the GCS mirror's listener, or None.
    start_step: the restored step (0 until the restore).
    samples: samples trained before this attempt (0 until the restore).
  """

  def __init__(self):
    self.listeners = multi_listener.MultiListener()
    self.mirror: Optional[mirror_listener.MirrorListener] = None
    self.start_step = 0
    self.samples = 0

  def complete(
      self,
      others: Sequence[interface.RunListener],
      locks: Optional[run_lock.RunLocks],
  ) -> multi_listener.MultiListener:
    """Adds `others`, then the mirror and the locks' listener."""
    for listener in others:
      self.listeners.add(listener)
    if self.mirror is not None:
      self.listeners.add(self.mirror)
    if locks is not None:
      self.listeners.add(lock_listener.RunLockListener(locks))
    return self.listeners

  def abandon(self) -> None:
    """Ends a failed build's outputs: the MLPerf log ends aborted."""
    if self.mirror is not None:
      self.listeners.add(self.mirror)  # Its final pass uploads the rest.
    end = interface.RunEnd(
        interface.RunOutcome.FAILED, self.start_step, self.samples
    )
    # A failing output was logged by MultiListener; the build's own error is
    # the one raised.
    with contextlib.suppress(multi_listener.ListenerError):
      self.listeners.on_run_end(end)
    with contextlib.suppress(multi_listener.ListenerError):
      self.listeners.close()


def _open_inputs(
    settings: run_settings.RunSettings,
    paths: run_dir_lib.RunPaths,
    is_primary: bool,
    locks: Optional[run_lock.RunLocks],
    outputs: _Outputs,
    opened: contextlib.ExitStack,
    workload: workload_lib.Workload,
) -> tuple[
    run_settings.RunSettings, checkpointing.Checkpointer, dataset_lib.Dataset
]:
  """Opens the run directory, its checkpoints and the data.

  What it opens is closed by `opened`; the GCS mirror, if the run has one,
  goes to `outputs`.

  Returns:
    (the attempt's settings with its resolved seed, checkpointer, data set).

  Raises:
    AlreadyFinished: the newest checkpoint is at or past `steps`.
    ValueError: the resume changes a field the run's record fixes, or
      resume=True finds no checkpoint; and as the data set.
  """
  _fetch_remote_run(settings, paths)
  os.makedirs(paths.run_dir, exist_ok=True)
  checkpointer = checkpointing.Checkpointer(
      paths.checkpoint_dir,
      save_period=settings.checkpoint.save_period,
      max_to_keep=settings.checkpoint.max_checkpoints_to_keep,
      # No checkpoint once another run took the run's lock over.
      fence=locks.check if locks is not None else None,
      progress=progress.logged(settings.progress_interval_s),
      # Only this run's own checkpoints are restored.
      run_id=_run_id(paths),
  )
  opened.callback(checkpointer.close)
  settings = _check_resume(settings, paths, checkpointer.latest_own_step())
  if paths.remote_url and is_primary:
    outputs.mirror = _mirror(settings, paths, locks)
  dataset = workload.make_dataset(
      settings, jax.process_index(), jax.process_count()
  )
  opened.callback(dataset.close)
  if settings.resume and checkpointer.latest_step() is None:
    raise ValueError(
        f"config.resume=True but {paths.checkpoint_dir} holds no checkpoint "
        "(set run_name to the run to resume)"
    )
  _check_start_over(settings, paths, checkpointer)
  if checkpointer.latest_step() is not None:
    _check_data(settings, paths, dataset)
  return settings, checkpointer, dataset


def _check_data(
    settings: run_settings.RunSettings, paths, dataset: dataset_lib.Dataset
) -> None:
  """A resume reads the data files the run recorded, or says it may not.

  Raises:
    ValueError: a data file differs from the run's record (named) and
      allow_data_change is off.
  """
  changes = builtin_datasets.changed_files(
      run_record.recorded_data(paths.run_dir), dataset.provenance()
  )
  if not changes:
    return
  if not settings.allow_data_change:
    raise ValueError(
        f"{changes[0]}; the run {paths.run_name!r} trained on other data."
        " Resume with the recorded file, or set allow_data_change=True if"
        " the change is intended"
    )
  for change in changes:
    logging.warning("Data changed, allowed by allow_data_change: %s", change)


def _check_resume(
    settings: run_settings.RunSettings,
    paths: run_dir_lib.RunPaths,
    latest_step: Optional[int],
) -> run_settings.RunSettings:
  """Checks a resume against the run's record; resolves the seed.

  Returns:
    The attempt's settings, with its resolved seed.

  Raises:
    AlreadyFinished: the newest checkpoint is at or past `steps`.
    ValueError: the resume changes a field the run's record fixes.
  """
  recorded = run_record.load_recorded_config(paths.run_dir)
  finished = run_record.finished_message(
      paths.run_name, latest_step, settings.steps
  )
  if finished:
    raise AlreadyFinished(finished, latest_step, paths.run_dir)
  if recorded is not None:
    changes = run_record.check_resume(
        recorded, dict(settings.record), run_name=paths.run_name
    )
    if changes:
      logging.info("%s", run_record.describe_changes(changes))
  return settings.with_seed(
      run_record.resolve_seed(settings.seed, recorded, draw=_draw_seed)
  )


def _mirror(
    settings: run_settings.RunSettings,
    paths: run_dir_lib.RunPaths,
    locks: Optional[run_lock.RunLocks],
) -> mirror_listener.MirrorListener:
  """The listener of the run directory's background mirror to gs://."""
  return mirror_listener.MirrorListener(
      gcs_mirror.GcsMirror(
          paths.run_dir,
          paths.remote_url,
          min_interval_s=settings.gcs_sync_interval_seconds,
          request_timeout_s=settings.gcs_request_timeout_seconds,
          final_timeout_s=settings.gcs_final_timeout_seconds,
          exclude=_MIRROR_EXCLUDE,
          fence=locks.fence if locks is not None else None,
          progress=progress.logged(settings.progress_interval_s),
      )
  )


def _resume(
    settings: run_settings.RunSettings,
    engine: engine_lib.Engine,
    dataset: dataset_lib.Dataset,
    checkpointer: checkpointing.Checkpointer,
    paths: run_dir_lib.RunPaths,
    mesh: jax.sharding.Mesh,
    outputs: _Outputs,
) -> None:
  """Restores the newest checkpoint and the data's position, if any.

  Sets `outputs.start_step` and `outputs.samples` to where the run starts.
  """
  metadata = _restore(engine, checkpointer, paths, mesh)
  outputs.start_step = engine.step
  # Checkpoints written before the data state existed have none: the data
  # set then finds its position from the step.
  state = data_state.load(
      paths.checkpoint_dir, outputs.start_step, jax.process_index()
  )
  if state is not None:
    dataset.restore_checkpoint_state(state)
  outputs.samples = int(
      metadata.get(
          "samples_count", outputs.start_step * settings.global_batch_size
      )
  )


def _record_attempt(
    settings: run_settings.RunSettings,
    paths: run_dir_lib.RunPaths,
    dataset: dataset_lib.Dataset,
    start_step: int,
    run_id: Optional[str],
) -> None:
  """Process 0 adds this attempt to the run's record (config.json)."""
  provenance = dict(
      run_dir_lib.provenance(),
      run_name=paths.run_name,
      remote_url=paths.remote_url,
  )
  if run_id is not None:
    provenance["run_id"] = run_id
  data_provenance = dataset.provenance()
  if data_provenance is not None:
    provenance["data"] = data_provenance
  run_record.record_attempt(
      paths.run_dir, dict(settings.record), provenance, start_step
  )
