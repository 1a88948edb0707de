"""Training checkpoints: a thin wrapper over orbax's CheckpointManager.

Each checkpoint step directory holds two orbax items:

* "state": the train state pytree, saved with `StandardSave` (every array is
  written by the processes that own its shards) and restored with
  `StandardRestore` onto the shardings the caller asks for. The trainer's
  state is `{"params": ..., "opt_state": ..., "step": ...}`;
  `restore_params_only` relies on the "params" key.
* "metadata": a small JSON object (`JsonSave`), e.g. samples trained so far
  and skipped-step counters.

Step numbering: a checkpoint's step is the number of training steps
completed when it was taken, which is also the index of the next step to
run, so a resumed run starts its loop at `latest_step()`.

Saving is asynchronous: `save` returns once the arrays are copied off the
device and orbax writes the files in a background thread; `wait()` blocks
until the last save is committed, and `close()` waits too. A step directory
appears only once complete, so an interrupted save never looks like a
checkpoint.

Long work logs its progress (`maxtext.core.progress`, a line every
interval, nothing when it is short): a save's copy off the devices, the
wait for its files, the checksums written at save and verified at read
(files and bytes), a restore (its elapsed time).

Directories may be local paths or any URL orbax handles (`gs://...`); only
local directories are tested here. In a multi-process run every process
calls the same methods in the same order: orbax coordinates which process
writes what and synchronises them.

Failures:

* A save that cannot be written (disk full, permission denied, ...) raises
  `CheckpointError` with one line naming the directory, the step and the
  OS error, wherever orbax reports it: in `wait`, in the next `save` or in
  `close` (the files are written in the background), or in `save` itself.
  orbax's temporary directory of that step (`<step>.orbax-checkpoint-tmp*`)
  is removed first, so a failed save leaves nothing behind.
* `restore_newest` restores the newest checkpoint that restores. A damaged
  one (a data file truncated or overwritten, `_METADATA`, a manifest or the
  metadata item missing) is logged, moved aside to
  `<step>.corrupt-<UTC time>` (never deleted) and the next older one is
  tried; when none restores, `CheckpointError` names each step and why,
  in one line.
  A checkpoint whose tree or shapes differ from the abstract state is not
  damaged: the config changed, and `ValueError` names the leaf.
* A checkpoint that is not this run's own is set aside as damage too, in
  one line naming it: given the run's id (`run_id`), every save records it
  and the step in the step's checksums.json, and a step whose manifest
  names another run (or none: copied in from elsewhere), records another
  step (a step directory copied over another), or is missing while the
  run's checkpoints carry one (any other step has one, or the run has an
  id) is refused before anything of it is read.
* A step directory without orbax's commit marker (`commit_success.txt`,
  written before the step directory is renamed into place) is partial: a
  checkpoint whose upload to a bucket did not finish, downloaded on resume
  (the GCS mirror uploads the marker last). Opening a local directory moves
  it aside to `<step>.partial-<UTC time>` with a warning; it is never
  restored nor taken for damage. `SET_ASIDE_PATTERNS` names what was set
  aside, for the GCS mirror to leave out.
"""

from collections.abc import Mapping
import contextlib
import dataclasses
import datetime
import errno
import glob
import json
import logging as std_logging
import math
import os
import re
import shutil
import time
from typing import Any, Callable, NoReturn, Optional

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

from maxtext.core import checks
from maxtext.core import progress as progress_lib
from maxtext.storage import checksums
from maxtext.storage import late_io_reports

STATE_ITEM = "state"
# orbax's marker of a finished step directory (and of each item in it).
COMMIT_MARKER = "commit_success.txt"
# Where damaged and partial checkpoints go (`fnmatch` patterns of their
# paths): never restored, and never uploaded.
SET_ASIDE_PATTERNS = ("*.corrupt-*", "*.partial-*")
METADATA_ITEM = "metadata"
PARAMS_KEY = "params"


def _is_url(path: str) -> bool:
  return "://" in path


def _normalize_directory(directory: str | os.PathLike[str]) -> str:
  if not isinstance(directory, (str, os.PathLike)):
    raise TypeError(
        f"checkpoint directory must be a str or path, got {directory!r}"
    )
  directory = os.fspath(directory)
  if not directory:
    raise ValueError("checkpoint directory must be non-empty")
  return directory if _is_url(directory) else os.path.abspath(directory)


def _check_metadata(metadata: Any) -> dict[str, Any]:
  """A copy of `metadata`, checked to be a dict of finite JSON values."""
  if not isinstance(metadata, Mapping):
    raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
  for key in metadata:
    if not isinstance(key, str):
      raise TypeError(f"metadata keys must be str, got {key!r}")
  try:
    json.dumps(dict(metadata), allow_nan=False)
  except (TypeError, ValueError) as e:
    raise type(e)(f"metadata must be finite JSON values: {e}") from e
  return dict(metadata)


def _check_abstract_tree(name: str, tree: Any) -> None:
  """Requires every ShapeDtypeStruct leaf to carry a sharding."""
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  if not leaves:
    raise ValueError(f"{name} is an empty pytree")
  for path, leaf in leaves:
    if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
      raise ValueError(
          f"{name}{jax.tree_util.keystr(path)} has no sharding; give every "
          "jax.ShapeDtypeStruct the sharding to restore onto"
      )


def _read_only_manager(directory: str) -> ocp.CheckpointManager:
  """A manager that reads the state item of `directory`'s checkpoints.

  The item's handler is named, so its tree metadata (shapes) can be read
  before any array is.
  """
  return ocp.CheckpointManager(
      directory,
      item_handlers={STATE_ITEM: ocp.PyTreeCheckpointHandler()},
      options=ocp.CheckpointManagerOptions(
          read_only=True, create=False, save_interval_steps=0
      ),
  )


class CheckpointError(RuntimeError):
  """A checkpoint could not be written, or no checkpoint could be restored.

  The message is one line (or, for a failed restore, one line per step)
  meant for the user as it stands; the orbax error is its `__cause__`.
  """


@dataclasses.dataclass(frozen=True)
class SetAside:
  """A checkpoint step that `restore_newest` could not restore.

  Attributes:
    step: the checkpoint's step.
    moved_to: where its directory now is (`<dir>/<step>.corrupt-<time>`, or
      `.partial-<time>` for a partial one), or None where it was left in
      place (a remote directory).
    reason: the first line of the error that restoring it raised, or why it
      is partial.
  """

  step: int
  moved_to: Optional[str]
  reason: str


@dataclasses.dataclass(frozen=True)
class Restored:
  """What `restore_newest` restored.

  Attributes:
    step: the restored checkpoint's step.
    state: the state pytree of jax.Arrays.
    metadata: the metadata dict given to `save`.
    set_aside: newer checkpoints that did not restore, newest first.
  """

  step: int
  state: Any
  metadata: dict[str, Any]
  set_aside: tuple[SetAside, ...] = ()


# TensorStore reports I/O and format errors as ValueError whose message
# starts with an absl status code ("RESOURCE_EXHAUSTED: ...", "NOT_FOUND:
# ...", "OUT_OF_RANGE: ..."), not as OSError.
_STATUS_PREFIX = re.compile(r"^[A-Z][A-Z_]+: ")
_OS_ERROR_CODE = re.compile(r"\[os_error_code='(\d+)'\]")
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


def _error_chain(error: BaseException) -> list[BaseException]:
  chain = []
  while error is not None and error not in chain:
    chain.append(error)
    error = error.__cause__ or error.__context__
  return chain


def _is_storage_error(error: BaseException) -> bool:
  """Whether `error` (or what caused it) is a failed read or write of files."""
  for e in _error_chain(error):
    if isinstance(e, OSError):
      return True
    if isinstance(e, ValueError) and _STATUS_PREFIX.match(str(e)):
      return True
  return False


class _ReportedWriteErrors(std_logging.Filter):
  """Drops asyncio's "exception was never retrieved" reports of storage
  errors, once a failed save has been reported as a CheckpointError.

  Orbax writes a checkpoint's arrays in concurrent asyncio tasks; when the
  disk fills, several fail with the same error, the first is raised (and
  becomes the run's one-line CheckpointError) and the others (tasks, and
  the futures gathering them) are never retrieved, so asyncio logs each with
  a traceback when it is collected, often after the run's error line, at
  exit. Those are the same failure already reported; any other unretrieved
  task error still logs.
  """

  def filter(self, record: std_logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return not (
        # "Task ...", "Future ..." or "_GatheringFuture exception was
        # never retrieved", as asyncio names the awaitable.
        "exception was never retrieved" in record.getMessage()
        and exc is not None
        and _is_storage_error(exc)
    )


_REPORTED_WRITE_ERRORS = _ReportedWriteErrors()


class _OneLineStorageErrors(std_logging.Filter):
  """Logs orbax's reports of a failed write as one warning line each.

  When a background save fails (e.g. a full disk), each of orbax's worker
  threads logs the same storage error as an ERROR with its traceback before
  the save's own error reaches `wait`, which raises it as the run's one-line
  CheckpointError. The library's tracebacks say nothing more: its records
  of storage errors keep their first line, at WARNING. Any other error
  record, and every record of other libraries, passes unchanged.
  """

  def filter(self, record: std_logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if (
        exc is not None
        and "/orbax/" in record.pathname
        and _is_storage_error(exc)
    ):
      record.msg = f"{record.getMessage().splitlines()[0]}: {_reason(exc)}"
      record.args = None
      record.exc_info = record.exc_text = None
      record.levelno, record.levelname = std_logging.WARNING, "WARNING"
    return True


_ONE_LINE_STORAGE_ERRORS = _OneLineStorageErrors()


def _array_bytes(state: Any) -> int:
  """The bytes of the state's arrays (global sizes), uncompressed; of an
  abstract state's `jax.ShapeDtypeStruct`s too."""
  return sum(
      math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
      for leaf in jax.tree_util.tree_leaves(state)
      if hasattr(leaf, "shape") and hasattr(leaf, "dtype")
  )


def _size_text(size: int) -> str:
  """`size` bytes in the largest binary unit that keeps it >= 1."""
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if size >= scale:
      return f"{size / scale:.1f} {unit}"
  return f"{size} B"


def _is_bare_exception(error: BaseException) -> bool:
  # Exactly Exception, not a subclass: how orbax wraps a failed array read.
  return type(error) is Exception  # pylint: disable=unidiomatic-typecheck


def _is_damage(error: Exception) -> bool:
  """Whether an error restoring a checkpoint means the checkpoint is damaged.

  Called only after the checkpoint's tree metadata matched the abstract
  state (or could not be read, which is damage itself), so a config change
  never lands here. Damage, as orbax 0.12 reports it:
  * missing files: FileNotFoundError (an OSError), e.g. `metadata/metadata`;
  * truncated or overwritten data files and missing manifests: TensorStore's
    ValueError ("OUT_OF_RANGE: ...", "NOT_FOUND: ..."), which orbax wraps
    in a plain `Exception` ("Encountered error while reading array ...");
  * unparsable JSON (`_METADATA`, the metadata item): JSONDecodeError, and
    a tree that no longer matches its metadata: ValueError.
  Anything else (TypeError, AttributeError, KeyError, MemoryError, an XLA
  runtime error such as a device out of memory) is a bug or a problem of
  this process, not of the files, and is raised unchanged.

  Args:
    error: the exception raised while reading the checkpoint.
  """
  if isinstance(error, (OSError, ValueError)):
    return True
  # orbax's wrapper of a failed array read is a bare Exception.
  return _is_bare_exception(error) and _is_storage_error(error)


def _first_line(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  text = lines[0] if lines else ""
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _reason(error: BaseException) -> str:
  """One line saying why a checkpoint did not restore."""
  # orbax's bare Exception around a failed array read says little; the
  # TensorStore error it wraps names the file and the problem.
  if _is_bare_exception(error) and error.__cause__ is not None:
    error = error.__cause__
  if isinstance(error, checksums.ChecksumError):
    # Names the file, whatever the length of its path.
    return _first_line(error)
  line = _first_line(error).split(" [tensorstore_spec=")[0]
  return line if len(line) <= 400 else line[:397] + "..."


def _os_error_text(error: BaseException) -> str:
  """The OS error behind a failed write, e.g. "[Errno 28] No space left ..."."""
  for e in _error_chain(error):
    if isinstance(e, OSError) and e.errno is not None:
      return f"[Errno {e.errno}] {e.strerror or os.strerror(e.errno)}"
    match = _OS_ERROR_CODE.search(str(e))
    if match:
      code = int(match.group(1))
      return f"[Errno {code}] {os.strerror(code)}"
  return _first_line(error)


def _key_name(key: Any) -> str:
  """A tree path entry as orbax names it on disk (namedtuple fields as keys)."""
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _leaves_by_path(tree: Any) -> dict[tuple[str, ...], tuple[str, Any]]:
  leaves = jax.tree_util.tree_leaves_with_path(
      tree, is_leaf=lambda x: x is None
  )
  return {
      tuple(_key_name(k) for k in path): (jax.tree_util.keystr(path), leaf)
      for path, leaf in leaves
      if leaf is not None
  }


def _check_matches(abstract_state: Any, stored: Any, step: int) -> None:
  """Raises ValueError where the abstract state differs from checkpoint `step`.

  Leaves present in one tree and not the other, and array shapes, must
  match. Dtypes may differ: `restore` casts to the abstract dtype.

  Args:
    abstract_state: the abstract state pytree asked for.
    stored: the checkpoint's tree metadata (orbax `ArrayMetadata` leaves).
    step: the checkpoint's step, for the message.
  """
  wanted = _leaves_by_path(abstract_state)
  have = _leaves_by_path(stored)
  hint = (
      "the checkpoint was written with another config (model or "
      "optimizer shape); restore it with that config or start a new run"
  )
  for path, (name, leaf) in wanted.items():
    if path not in have:
      raise ValueError(
          f"abstract_state{name} is not in checkpoint step {step}: {hint}"
      )
    stored_shape = getattr(have[path][1], "shape", None)
    shape = getattr(leaf, "shape", None)
    if (
        stored_shape is not None
        and shape is not None
        and tuple(stored_shape) != tuple(shape)
    ):
      raise ValueError(
          f"abstract_state{name} has shape {tuple(shape)} but checkpoint step "
          f"{step} holds shape {tuple(stored_shape)}: {hint}"
      )
  for path, (name, _) in have.items():
    if path not in wanted:
      raise ValueError(
          f"checkpoint step {step} holds {name}, which "
          f"abstract_state lacks: {hint}"
      )


def _utc_stamp() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _unused_name(path: str) -> str:
  """`path`, or `path-1`, `path-2`... : the first that does not exist."""
  target, suffix = path, 1
  while os.path.exists(target):
    target = f"{path}-{suffix}"
    suffix += 1
  return target


class Checkpointer:
  """Saves and restores train states in one checkpoint directory."""

  def __init__(
      self,
      directory: str | os.PathLike[str],
      *,
      save_period: int,
      max_to_keep: int,
      fence: Optional[Callable[[], None]] = None,
      progress: Optional[progress_lib.Reporter] = None,
      run_id: Optional[str] = None,
  ):
    """Opens (and, for a local path, creates) the checkpoint directory.

    Args:
      directory: the checkpoint directory: local path or orbax-supported URL.
      save_period: `save` writes steps that are multiples of this (>= 1);
        `force=True` writes any step.
      max_to_keep: how many of the newest checkpoints to keep (>= 1), or 0
        to keep all.
      fence: called just before each save; it raises when the run may write
        nothing more (its lock was taken over), and then nothing is saved.
      progress: where long saves, restores and checksums report their
        progress; default: the log, every `progress.LOG_INTERVAL_S`.
      run_id: the run's id: recorded in every save's checksums.json, and a
        checkpoint that does not name it is not restored (module
        docstring); None for checkpoints of no run's own (imports).

    Raises:
      TypeError, ValueError: an argument has the wrong type or range.
    """
    self._directory = _normalize_directory(directory)
    # Adding a filter twice keeps one; installing twice installs once.
    std_logging.getLogger("absl").addFilter(_ONE_LINE_STORAGE_ERRORS)
    late_io_reports.install()
    self._save_period = checks.check_int("save_period", save_period, 1)
    self._max_to_keep = checks.check_int("max_to_keep", max_to_keep, 0)
    self._fence = fence
    self._progress = progress or progress_lib.logged()
    self._run_id = run_id
    self._closed = False
    # The step of the save orbax may still be writing in the background:
    # its errors surface later, in wait(), the next save() or close().
    self._pending_step = None
    # The step orbax is writing: its temporary directory gets checksums.json
    # before orbax commits it (`_write_checksums`).
    self._saving_step: Optional[int] = None
    self._partial: tuple[SetAside, ...] = ()
    if not _is_url(self._directory):
      self._remove_tmp_directories(None)
      self._partial = self._set_aside_partial()
    self._manager = self._open_manager()

  def _open_manager(self) -> ocp.CheckpointManager:
    """The orbax manager of the directory: the state and metadata items,
    saves on the save period, asynchronous, checksums.json written before
    each commit."""
    return ocp.CheckpointManager(
        self._directory,
        # Handlers rather than names, so that item_metadata() reads the
        # state's tree metadata before any restore.
        item_handlers={
            STATE_ITEM: ocp.StandardCheckpointHandler(),
            METADATA_ITEM: ocp.JsonCheckpointHandler(),
        },
        options=ocp.CheckpointManagerOptions(
            # Only multiples of save_period (and forced saves). orbax's
            # default policy also saves the first step it sees in a
            # directory, which would make the schedule depend on history.
            save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(
                self._save_period
            ),
            # orbax deletes every checkpoint when max_to_keep is 0; None
            # keeps all.
            max_to_keep=self._max_to_keep or None,
            create=True,
            # What a killed run's unfinished save left behind goes at
            # open: for a local directory removed here, synchronously
            # (orbax's own cleanup runs in a thread that close() does not
            # wait for, and a run refused right after the open would exit
            # under it); for a remote one by orbax.
            cleanup_tmp_directories=_is_url(self._directory),
            enable_async_checkpointing=True,
            # Runs in orbax's background thread on process 0 once every
            # process has written its files, before the step directory is
            # renamed into place and marked committed.
            async_options=ocp.AsyncOptions(
                post_finalization_callback=self._write_checksums
            ),
        ),
    )

  @property
  def directory(self) -> str:
    return self._directory

  @property
  def run_id(self) -> Optional[str]:
    """The id of the run whose checkpoints these are (None: unnamed)."""
    return self._run_id

  @property
  def partial(self) -> tuple[SetAside, ...]:
    """Partial step directories the open moved aside, newest first."""
    return self._partial

  def _set_aside_partial(self) -> tuple[SetAside, ...]:
    """Moves step directories without a commit marker aside (process 0)."""
    if jax.process_index() != 0 or not os.path.isdir(self._directory):
      return ()
    partial = []
    for name in os.listdir(self._directory):
      source = os.path.join(self._directory, name)
      if not name.isdigit() or not os.path.isdir(source):
        continue
      if os.path.exists(os.path.join(source, COMMIT_MARKER)):
        continue
      target = _unused_name(f"{source}.partial-{_utc_stamp()}")
      os.rename(source, target)
      reason = (
          f"partial: no {COMMIT_MARKER} (its upload to the bucket did not"
          " finish)"
      )
      logging.warning(
          "Checkpoint step %s in %s is %s; moved it aside to %s, it is not"
          " restored.",
          name,
          self._directory,
          reason,
          target,
      )
      partial.append(SetAside(int(name), target, reason))
    return tuple(sorted(partial, key=lambda e: -e.step))

  def _check_open(self) -> None:
    if self._closed:
      raise RuntimeError(f"Checkpointer for {self._directory} is closed")

  def save(
      self,
      step: int,
      state: Any,
      metadata: Mapping[str, Any],
      *,
      force: bool = False,
  ) -> bool:
    """Starts saving `state` and `metadata` as checkpoint `step`.

    Call between training steps, never inside one. Returns without waiting
    for the files; see `wait`.

    Args:
      step: steps completed so far (>= 0).
      state: the train state pytree of jax.Arrays (and Python/NumPy
        scalars).
      metadata: JSON-serialisable dict with str keys and finite numbers.
      force: save even if `step` is not a multiple of `save_period`.

    Returns:
      True if a save was started; False if this step is not due (and
      `force` is False) or a checkpoint of this step already exists.

    Raises:
      TypeError, ValueError: bad step or metadata (nothing is saved).
      RuntimeError: the checkpointer is closed.
      CheckpointError: this save or the previous one (still being written)
        could not be written; names the step and the OS error.
      Exception: what the fence raised (nothing is saved).
    """
    self._check_open()
    step = checks.check_int("step", step, 0)
    metadata = _check_metadata(metadata)
    if not self._wanted(step, force):
      return False
    if self._fence is not None:
      self._fence()
    # orbax would wait for the previous save inside save(); waiting here
    # attributes its failure to its own step.
    self.wait()
    self._check_room(step, state)
    self._saving_step = step
    saved = self._start_save(step, state, metadata, force)
    if saved:
      self._pending_step = step
      logging.info("Saving checkpoint step %d to %s", step, self._directory)
    return saved

  def _wanted(self, step: int, force: bool) -> bool:
    """Whether `save` writes `step`: due (or forced), and not saved yet."""
    if not force and not self.due(step):
      # Decided here, without asking orbax: its manager's bookkeeping costs
      # about a millisecond per call, and the loop asks after every step.
      return False
    if step in self._manager.all_steps():
      logging.info(
          "Checkpoint step %d already exists in %s; not saving again.",
          step,
          self._directory,
      )
      return False
    return True

  def _start_save(
      self, step: int, state: Any, metadata: dict[str, Any], force: bool
  ) -> bool:
    """Has orbax start writing `step`; returns whether it started a save.

    Raises:
      CheckpointError: the write failed on storage (see `_save_failed`).
      Exception: any other failure, unchanged.
    """
    try:
      with self._progress.waiting(
          f"checkpoint step {step}: saving ({_size_text(_array_bytes(state))})",
          quiet_if_short=True,
      ):
        return self._manager.save(
            step,
            args=ocp.args.Composite(
                **{
                    STATE_ITEM: ocp.args.StandardSave(state),
                    METADATA_ITEM: ocp.args.JsonSave(metadata),
                }
            ),
            force=force,
        )
    # Orbax raises many types; any failure becomes a CheckpointError that
    # names the step.
    except Exception as e:  # pylint: disable=broad-exception-caught
      self._save_failed(step, e)

  def _check_room(self, step: int, state: Any) -> None:
    """Refuses a save that the local disk has no room for, before writing.

    orbax writes in the background: a full disk would otherwise surface at
    the next `wait`, after more training steps. The bound is the arrays'
    uncompressed size; orbax compresses them (zstd), which rarely saves
    much on trained floating-point weights, so a disk with less free space
    than that is taken as full. With several processes the check is left
    out: their disks' free space may differ, and they must all save or all
    not; a write that fails then surfaces at the next `wait`.

    Raises:
      CheckpointError: the free space is less than the arrays' size; names
        the step, the directory and both sizes.
    """
    if _is_url(self._directory) or jax.process_count() > 1:
      return
    needed = _array_bytes(state)
    free = shutil.disk_usage(self._directory).free
    if free < needed:
      raise CheckpointError(
          f"could not write checkpoint step {step} to {self._directory}: "
          f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)} (its arrays "
          f"need {_size_text(needed)} before compression, "
          f"{_size_text(free)} free)"
      )

  def _write_checksums(self) -> None:
    """Writes checksums.json into the temporary directory of the save
    being committed (orbax's post-finalization callback, process 0).

    A failure here fails the save (orbax does not commit it), so every
    committed local checkpoint of this project carries its checksums.
    """
    if _is_url(self._directory) or jax.process_index() != 0:
      return
    step = self._saving_step
    pattern = f"{step}{_TMP_SUFFIX}*"
    found = glob.glob(os.path.join(glob.escape(self._directory), pattern))
    if len(found) != 1:
      raise OSError(
          errno.ENOENT,
          f"expected one temporary directory {pattern} of step {step}, "
          f"found {len(found)}",
          self._directory,
      )
    began = time.perf_counter()
    size = checksums.write(
        found[0],
        (STATE_ITEM, METADATA_ITEM),
        self._progress,
        f"checkpoint step {step}: checksums",
        step=step,
        run_id=self._run_id,
    )
    logging.info(
        "Checksummed checkpoint step %s: %s in %.3f s",
        step,
        _size_text(size),
        time.perf_counter() - began,
    )

  def _verify(self, step: int, items: tuple[str, ...]) -> None:
    """Checks `step`'s files under `items` against its checksums.json.

    Raises:
      checksums.ChecksumError: a file differs, or the step is not this
        run's own (module docstring) (a ValueError: damage).
    """
    verify_step(
        self._directory,
        step,
        items,
        self._progress,
        run_id=self._run_id,
        required=self._manifest_required(step),
    )

  def _manifest_required(self, step: int) -> bool:
    """Whether `step` must carry a checksums.json: the run has an id, or
    another of its steps carries one (a local directory)."""
    if _is_url(self._directory):
      return False
    if self._run_id is not None:
      return True
    return any(
        checksums.has_manifest(os.path.join(self._directory, str(other)))
        for other in self._manager.all_steps()
        if other != step
    )

  def due(self, step: int) -> bool:
    """Whether `save(step, ...)` without `force` writes a checkpoint."""
    return step % self._save_period == 0

  def wait(self) -> None:
    """Blocks until every started save is committed to storage.

    Raises:
      CheckpointError: the save in progress could not be written; names the
        step and the OS error. Its temporary directory is removed.
    """
    step, self._pending_step = self._pending_step, None
    waiting = (
        self._progress.waiting(
            f"checkpoint step {step}: writing", quiet_if_short=True
        )
        if step is not None
        else contextlib.nullcontext()
    )
    try:
      with waiting:
        self._manager.wait_until_finished()
    # Orbax raises many types; any failure becomes a CheckpointError that
    # names the step.
    except Exception as e:  # pylint: disable=broad-exception-caught
      self._save_failed(step, e)

  def _save_failed(self, step: Optional[int], error: Exception) -> NoReturn:
    """Removes the failed save's temporary files and raises.

    Args:
      step: the step being saved, or None if unknown.
      error: what orbax raised.

    Raises:
      CheckpointError: for a storage error (OSError, or TensorStore's
        status errors such as RESOURCE_EXHAUSTED), one line naming the
        directory, the step and the OS error.
      Exception: `error` itself for anything else (a bug, not storage).
    """
    self._remove_tmp_directories(step)
    if not _is_storage_error(error):
      raise error
    # Adding a filter twice keeps one.
    std_logging.getLogger("asyncio").addFilter(_REPORTED_WRITE_ERRORS)
    raise CheckpointError(
        f"could not write checkpoint step {step} to {self._directory}: "
        f"{_os_error_text(error)}"
    ) from error

  def _remove_tmp_directories(self, step: Optional[int]) -> None:
    """Removes orbax's temporary directory of a failed save of `step` (of
    every step when None)."""
    # Process 0 owns the directory layout (it is the one that renames a
    # finished save into place); a remote directory is left to orbax's
    # cleanup_tmp_directories at the next open.
    if jax.process_index() != 0 or _is_url(self._directory):
      return
    prefix = str(step) if step is not None else "*"
    pattern = f"{prefix}{_TMP_SUFFIX}*"
    for path in glob.glob(os.path.join(glob.escape(self._directory), pattern)):
      try:
        shutil.rmtree(path)
      except OSError as e:
        logging.warning(
            "Could not remove the unfinished checkpoint %s: %s", path, e
        )

  def all_steps(self) -> list[int]:
    """Returns the committed (and in-progress) checkpoint steps, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """Returns the newest checkpoint step, or None if there is none."""
    return self._manager.latest_step()

  def latest_own_step(self) -> int | None:
    """The newest step whose checksums.json says it is this run's own
    (its step and run; only that file is read), or None: what a finished
    run's check reads, so that a step copied in from another run does not
    pass for the run's end. A remote directory's newest step."""
    if _is_url(self._directory):
      return self.latest_step()
    for step in sorted(self._manager.all_steps(), reverse=True):
      try:
        checksums.check_identity(
            os.path.join(self._directory, str(step)),
            f"checkpoint step {step}",
            step=step,
            run_id=self._run_id,
            required=self._manifest_required(step),
        )
      except checksums.ChecksumError:
        continue  # restore_newest sets it aside, saying why.
      return step
    return None

  def restore(
      self, step: int, abstract_state: Any
  ) -> tuple[Any, dict[str, Any]]:
    """Restores checkpoint `step` onto the shardings of `abstract_state`.

    Args:
      step: a step in `all_steps()`.
      abstract_state: pytree with the saved state's structure whose array
        leaves are `jax.ShapeDtypeStruct`s with shape, dtype and sharding;
        arrays are restored with that dtype and sharding.

    Returns:
      `(state, metadata)`: the state pytree of jax.Arrays and the metadata
      dict given to `save`.

    Raises:
      FileNotFoundError: no checkpoint of that step; names the directory.
      ValueError: an abstract leaf has no sharding, or the checkpoint's tree
        or an array shape differs from `abstract_state` (names the leaf).
      Exception: whatever orbax raises for a damaged checkpoint; see
        `restore_newest`, which handles damage.
    """
    self._check_open()
    step = checks.check_int("step", step, 0)
    _check_abstract_tree("abstract_state", abstract_state)
    self.wait()
    if step not in self._manager.all_steps():
      raise FileNotFoundError(
          f"no checkpoint of step {step} in {self._directory}; available "
          f"steps: {self.all_steps()}"
      )
    self._verify(step, (STATE_ITEM, METADATA_ITEM))
    try:
      stored = self._tree_metadata(step)
    # Unreadable tree metadata, whatever the error: orbax's restore reports
    # the damage.
    except Exception as e:  # pylint: disable=broad-exception-caught
      logging.warning(
          "Cannot check checkpoint step %d against the abstract state: %s",
          step,
          _reason(e),
      )
    else:
      _check_matches(abstract_state, stored, step)
    return self._restore_unchecked(step, abstract_state)

  def _tree_metadata(self, step: int) -> Any:
    """The state item's tree of ArrayMetadata (shape, dtype) of `step`.

    Raises:
      FileNotFoundError: orbax found no tree metadata (`_METADATA`).
      Exception: as orbax raises for an unreadable one.
    """
    stored = self._manager.item_metadata(step)[STATE_ITEM]
    if stored is None:
      raise FileNotFoundError(
          f"the tree metadata of item {STATE_ITEM!r} (_METADATA) is missing"
      )
    return stored

  def _restore_unchecked(
      self, step: int, abstract_state: Any
  ) -> tuple[Any, dict[str, Any]]:
    """Restores `step` into `abstract_state` without checking it first."""
    with self._progress.waiting(
        f"checkpoint step {step}: restoring "
        f"({_size_text(_array_bytes(abstract_state))})",
        quiet_if_short=True,
    ):
      restored = self._manager.restore(
          step,
          args=ocp.args.Composite(
              **{
                  STATE_ITEM: ocp.args.StandardRestore(abstract_state),
                  METADATA_ITEM: ocp.args.JsonRestore(),
              }
          ),
      )
    return restored[STATE_ITEM], dict(restored[METADATA_ITEM] or {})

  def restore_newest(self, abstract_state: Any) -> Optional[Restored]:
    """Restores the newest checkpoint that restores, setting damaged ones aside.

    Tries the steps newest first. A step that cannot be read (see
    `_is_damage`: missing or truncated files, unparsable metadata) is
    logged as a warning naming the step and the reason, moved aside to
    `<directory>/<step>.corrupt-<UTC time>` (never deleted; orbax no longer
    lists it) and the next older step is tried. In a remote (`gs://`)
    directory a rename is a copy of every object, so a damaged step is
    left in place, with the warning, and the next one is tried. Errors that
    are not damage (a bug, a device out of memory) are raised unchanged
    and nothing is moved.

    Only single-process runs move checkpoints aside: in a multi-process run
    the processes would first have to agree that a step is damaged (each
    reads its own shards), so there the first damaged step raises
    `CheckpointError` telling the user to move it aside.

    Args:
      abstract_state: as for `restore`.

    Returns:
      The restored step, state and metadata with the steps set aside, or
      None if the directory holds no checkpoint.

    Raises:
      ValueError: an abstract leaf has no sharding, or a checkpoint's tree
        or an array shape differs from `abstract_state` (a config change,
        not damage: nothing is moved); names the leaf.
      CheckpointError: no checkpoint restores; one line naming each step
        and why.
    """
    self._check_open()
    _check_abstract_tree("abstract_state", abstract_state)
    self.wait()
    set_aside = []
    for step in sorted(self._manager.all_steps(), reverse=True):
      restored = self._restore_undamaged(step, abstract_state)
      if isinstance(restored, SetAside):
        set_aside.append(restored)
        continue
      state, metadata = restored
      return Restored(step, state, metadata, tuple(set_aside))
    if not set_aside:
      return None
    steps = "; ".join(
        f"step {entry.step} ("
        + (f"moved to {entry.moved_to}" if entry.moved_to else "left in place")
        + f"): {entry.reason}"
        for entry in set_aside
    )
    raise CheckpointError(
        f"no checkpoint in {self._directory} could be restored: {steps}"
    )

  def _restore_undamaged(
      self, step: int, abstract_state: Any
  ) -> tuple[Any, dict[str, Any]] | SetAside:
    """Restores `step` as `restore_newest` does, or sets it aside.

    Returns:
      `(state, metadata)`, or how the step was set aside when it is damaged
      (`_is_damage`).

    Raises:
      ValueError: the step's tree or an array shape differs from
        `abstract_state`.
      CheckpointError: a damaged step in a multi-process run.
      Exception: an error that is not damage, unchanged.
    """
    try:
      # Before anything of the step is read: a damaged _METADATA must
      # not pass for a config change.
      self._verify(step, (STATE_ITEM, METADATA_ITEM))
      stored = self._tree_metadata(step)
    # Damage shows as many error types; all others are re-raised.
    except Exception as e:  # pylint: disable=broad-exception-caught
      if not _is_damage(e):
        raise
      return self._set_aside(step, _reason(e))
    _check_matches(abstract_state, stored, step)
    try:
      return self._restore_unchecked(step, abstract_state)
    # Damage shows as many error types; all others are re-raised.
    except Exception as e:  # pylint: disable=broad-exception-caught
      if not _is_damage(e):
        raise
      return self._set_aside(step, _reason(e))

  def _set_aside(self, step: int, reason: str) -> SetAside:
    """Logs that `step` is damaged and moves it out of orbax's sight."""
    source = os.path.join(self._directory, str(step))
    if jax.process_count() > 1:
      raise CheckpointError(
          f"checkpoint step {step} in {self._directory} cannot be restored: "
          f"{reason}; multi-process runs do not move it aside, so move "
          f"{source} aside (e.g. to {source}.corrupt) and rerun"
      )
    if _is_url(self._directory):
      logging.warning(
          "Checkpoint step %d in %s cannot be restored: %s. Left in place (a "
          "remote directory is not renamed); trying an older one.",
          step,
          self._directory,
          reason,
      )
      return SetAside(step, None, reason)
    target = _unused_name(f"{source}.corrupt-{_utc_stamp()}")
    os.rename(source, target)
    # orbax's reads of the damaged files may leave asyncio tasks whose
    # errors are never retrieved; this damage is reported here.
    std_logging.getLogger("asyncio").addFilter(_REPORTED_WRITE_ERRORS)
    # The manager caches its step list; re-read it so that the moved step
    # is neither listed nor the latest.
    self._manager.reload()
    logging.warning(
        "Checkpoint step %d in %s cannot be restored: %s. Moved it aside to "
        "%s; trying an older one.",
        step,
        self._directory,
        reason,
        target,
    )
    return SetAside(step, target, reason)

  def close(self) -> None:
    """Waits for pending saves and releases orbax's resources. Idempotent.

    Raises:
      CheckpointError: the last save could not be written (see `wait`);
        the resources are released all the same.
    """
    if self._closed:
      return
    self._closed = True
    try:
      self.wait()
    finally:
      self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _find_params_checkpoint(path: str) -> tuple[ocp.CheckpointManager, int]:
  """The checkpoint `path` names: a checkpoint directory or a step in one."""
  if not _is_url(path) and not os.path.isdir(path):
    raise FileNotFoundError(
        f"load_parameters_path {path} does not exist or is not a directory"
    )
  manager = _read_only_manager(path)
  step = manager.latest_step()
  if step is not None:
    return manager, step
  manager.close()
  parent, name = os.path.split(path.rstrip("/"))
  if name.isdigit() and parent:
    parent_manager = _read_only_manager(parent)
    if int(name) in parent_manager.all_steps():
      return parent_manager, int(name)
    parent_manager.close()
  raise FileNotFoundError(
      f"load_parameters_path {path} holds no checkpoint: expected a "
      "checkpoint directory with step subdirectories, or one step directory"
  )


def params_checkpoint_step(path: str | os.PathLike[str]) -> int:
  """The step `restore_params_only(path)` reads: the newest step of a
  checkpoint directory, or the step directory `path` names.

  Raises:
    FileNotFoundError: as `restore_params_only`.
  """
  manager, step = _find_params_checkpoint(_normalize_directory(path))
  manager.close()
  return step


def _stored_params(manager: ocp.CheckpointManager, step: int) -> Any:
  """The params subtree of `step`'s tree metadata, or None if unreadable."""
  try:
    return manager.item_metadata(step)[STATE_ITEM][PARAMS_KEY]
  # Unreadable tree metadata, whatever the error: orbax's restore reports
  # the damage.
  except Exception as e:  # pylint: disable=broad-exception-caught
    logging.warning(
        "Cannot check the parameters of checkpoint step %d: %s",
        step,
        _reason(e),
    )
    return None


def restore_params_only(
    path: str | os.PathLike[str],
    abstract_params: Any,
    progress: Optional[progress_lib.Reporter] = None,
) -> Any:
  """Restores only the "params" subtree of a previous run's checkpoint.

  For `load_parameters_path`: the optimizer state and step in the checkpoint
  are not read, so a run starts from these parameters with a fresh
  optimizer.

  Args:
    path: a checkpoint directory (its latest step is used) or one step
      directory inside it (e.g. `.../checkpoints/500`).
    abstract_params: pytree with the saved params' structure whose leaves
      are `jax.ShapeDtypeStruct`s with shape, dtype and sharding.
    progress: where the verification and the restore report their progress;
      default: the log, every `progress.LOG_INTERVAL_S`.

  Returns:
    The params pytree of jax.Arrays on the requested shardings.

  Raises:
    FileNotFoundError: `path` is missing or holds no checkpoint; names it.
    ValueError: an abstract leaf has no sharding, or the checkpoint's
      parameters differ from `abstract_params` in a leaf or a shape (names
      the leaf and both shapes), before orbax reads any array.
  """
  path = _normalize_directory(path)
  _check_abstract_tree("abstract_params", abstract_params)
  progress = progress or progress_lib.logged()
  manager, step = _find_params_checkpoint(path)
  try:
    verify_step(str(manager.directory), step, (STATE_ITEM,), progress)
    item = {PARAMS_KEY: abstract_params}
    stored = _stored_params(manager, step)
    if stored is not None:
      _check_matches(item, {PARAMS_KEY: stored}, step)
    params = _restore_params(manager, step, item, progress)
  finally:
    manager.close()
  logging.info("Loaded parameters from step %d of %s", step, path)
  return params


def _restore_params(
    manager: ocp.CheckpointManager,
    step: int,
    item: dict[str, Any],
    progress: progress_lib.Reporter,
) -> Any:
  """Reads the params of `step` into `item` ({"params": abstract params}),
  nothing else of the state."""
  with progress.waiting(
      f"checkpoint step {step}: restoring the parameters "
      f"({_size_text(_array_bytes(item[PARAMS_KEY]))})",
      quiet_if_short=True,
  ):
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            **{
                STATE_ITEM: ocp.args.PyTreeRestore(
                    item=item,
                    restore_args=ocp.checkpoint_utils.construct_restore_args(
                        item
                    ),
                    partial_restore=True,
                ),
            }
        ),
    )
  return restored[STATE_ITEM][PARAMS_KEY]


def verify_step(
    directory: str,
    step: int,
    items: tuple[str, ...],
    progress: Optional[progress_lib.Reporter] = None,
    *,
    run_id: Optional[str] = None,
    required: bool = False,
) -> None:
  """Checks checkpoint `step` of `directory` against its checksums.json.

  Logs one line when the step has no checksums (written before checkpoints
  carried them, or straight to a bucket by orbax) and is read unverified,
  unless `required`. The manifest's recorded step must be `step`, and,
  given `run_id`, it must name that run.
  A long verification reports its progress to `progress` (default: the
  log, every `progress.LOG_INTERVAL_S`).

  Raises:
    checksums.ChecksumError: one line naming the step and the file that
      is missing or differs, or the manifest that is missing (required),
      of another step or of another run.
  """
  where = f"checkpoint step {step}"
  if _is_url(directory):
    logging.warning(
        "%s in %s is read unverified (a remote directory)", where, directory
    )
    return
  began = time.perf_counter()
  result = checksums.verify(
      os.path.join(directory, str(step)),
      items,
      where,
      progress or progress_lib.logged(),
      step=step,
      run_id=run_id,
      required=required,
  )
  if result == checksums.UNVERIFIED:
    logging.warning(
        "%s in %s has no %s (written before checkpoints carried checksums): "
        "read unverified",
        where,
        directory,
        checksums.MANIFEST,
    )
  else:
    logging.info(
        "Verified %s in %s (%s) in %.3f s",
        where,
        directory,
        "+".join(items),
        time.perf_counter() - began,
    )
