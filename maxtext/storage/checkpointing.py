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

Directories may be local paths or any URL orbax handles (`gs://...`); only
local directories are tested here. In a multi-process run every process
calls the same methods in the same order: orbax coordinates which process
writes what and synchronises them.
"""

from collections.abc import Mapping
import json
import numbers
import os
from typing import Any

from absl import logging
import jax
import orbax.checkpoint as ocp

STATE_ITEM = "state"
METADATA_ITEM = "metadata"
PARAMS_KEY = "params"


def _is_url(path: str) -> bool:
  return "://" in path


def _normalize_directory(directory: str | os.PathLike[str]) -> str:
  if not isinstance(directory, (str, os.PathLike)):
    raise TypeError(
        f"checkpoint directory must be a str or path, got {directory!r}")
  directory = os.fspath(directory)
  if not directory:
    raise ValueError("checkpoint directory must be non-empty")
  return directory if _is_url(directory) else os.path.abspath(directory)


def _check_int(name: str, value: Any, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name} must be an int, got {value!r}")
  if value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
  return int(value)


def _check_metadata(metadata: Any) -> dict[str, Any]:
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
          "jax.ShapeDtypeStruct the sharding to restore onto")


def _read_only_manager(directory: str, item_names: tuple[str, ...]
                      ) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      directory,
      item_names=item_names,
      options=ocp.CheckpointManagerOptions(
          read_only=True, create=False, save_interval_steps=0))


class Checkpointer:
  """Saves and restores train states in one checkpoint directory."""

  def __init__(self, directory: str | os.PathLike[str], *, save_period: int,
               max_to_keep: int):
    """Opens (and, for a local path, creates) the checkpoint directory.

    Args:
      directory: the checkpoint directory: local path or orbax-supported URL.
      save_period: `save` writes steps that are multiples of this (>= 1);
        `force=True` writes any step.
      max_to_keep: how many of the newest checkpoints to keep (>= 1), or 0
        to keep all.

    Raises:
      TypeError, ValueError: an argument has the wrong type or range.
    """
    self._directory = _normalize_directory(directory)
    self._save_period = _check_int("save_period", save_period, 1)
    self._max_to_keep = _check_int("max_to_keep", max_to_keep, 0)
    self._closed = False
    self._manager = ocp.CheckpointManager(
        self._directory,
        item_names=(STATE_ITEM, METADATA_ITEM),
        options=ocp.CheckpointManagerOptions(
            # Only multiples of save_period (and forced saves). orbax's
            # default policy also saves the first step it sees in a
            # directory, which would make the schedule depend on history.
            save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(
                self._save_period),
            # orbax deletes every checkpoint when max_to_keep is 0; None
            # keeps all.
            max_to_keep=self._max_to_keep or None,
            create=True,
            enable_async_checkpointing=True))

  @property
  def directory(self) -> str:
    return self._directory

  def _check_open(self) -> None:
    if self._closed:
      raise RuntimeError(f"Checkpointer for {self._directory} is closed")

  def save(self, step: int, state: Any, metadata: Mapping[str, Any], *,
           force: bool = False) -> bool:
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
    """
    self._check_open()
    step = _check_int("step", step, 0)
    metadata = _check_metadata(metadata)
    if not force and not self.due(step):
      # Decided here, without asking orbax: its manager's bookkeeping costs
      # about a millisecond per call, and the loop asks after every step.
      return False
    if step in self._manager.all_steps():
      logging.info("Checkpoint step %d already exists in %s; not saving again.",
                   step, self._directory)
      return False
    saved = self._manager.save(
        step,
        args=ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(state),
            METADATA_ITEM: ocp.args.JsonSave(metadata),
        }),
        force=force)
    if saved:
      logging.info("Saving checkpoint step %d to %s", step, self._directory)
    return saved

  def due(self, step: int) -> bool:
    """Whether `save(step, ...)` without `force` writes a checkpoint."""
    return step % self._save_period == 0

  def wait(self) -> None:
    """Blocks until every started save is committed to storage."""
    self._manager.wait_until_finished()

  def all_steps(self) -> list[int]:
    """Returns the committed (and in-progress) checkpoint steps, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """Returns the newest checkpoint step, or None if there is none."""
    return self._manager.latest_step()

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
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
      ValueError: an abstract leaf has no sharding.
    """
    self._check_open()
    step = _check_int("step", step, 0)
    _check_abstract_tree("abstract_state", abstract_state)
    self.wait()
    if step not in self._manager.all_steps():
      raise FileNotFoundError(
          f"no checkpoint of step {step} in {self._directory}; available "
          f"steps: {self.all_steps()}")
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardRestore(abstract_state),
            METADATA_ITEM: ocp.args.JsonRestore(),
        }))
    return restored[STATE_ITEM], dict(restored[METADATA_ITEM] or {})

  def close(self) -> None:
    """Waits for pending saves and releases orbax's resources. Idempotent."""
    if self._closed:
      return
    self._closed = True
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _find_params_checkpoint(path: str) -> tuple[ocp.CheckpointManager, int]:
  """Finds the checkpoint `path` names: a checkpoint directory or a step in one."""
  if not _is_url(path) and not os.path.isdir(path):
    raise FileNotFoundError(f"load_parameters_path {path} does not exist or "
                            "is not a directory")
  manager = _read_only_manager(path, (STATE_ITEM,))
  step = manager.latest_step()
  if step is not None:
    return manager, step
  manager.close()
  parent, name = os.path.split(path.rstrip("/"))
  if name.isdigit() and parent:
    parent_manager = _read_only_manager(parent, (STATE_ITEM,))
    if int(name) in parent_manager.all_steps():
      return parent_manager, int(name)
    parent_manager.close()
  raise FileNotFoundError(
      f"load_parameters_path {path} holds no checkpoint: expected a "
      "checkpoint directory with step subdirectories, or one step directory")


def restore_params_only(path: str | os.PathLike[str], abstract_params: Any) -> Any:
  """Restores only the "params" subtree of a previous run's checkpoint.

  For `load_parameters_path`: the optimizer state and step in the checkpoint
  are not read, so a run starts from these parameters with a fresh
  optimizer.

  Args:
    path: a checkpoint directory (its latest step is used) or one step
      directory inside it (e.g. `.../checkpoints/500`).
    abstract_params: pytree with the saved params' structure whose leaves
      are `jax.ShapeDtypeStruct`s with shape, dtype and sharding.

  Returns:
    The params pytree of jax.Arrays on the requested shardings.

  Raises:
    FileNotFoundError: `path` is missing or holds no checkpoint; names it.
    ValueError: an abstract leaf has no sharding.
  """
  path = _normalize_directory(path)
  _check_abstract_tree("abstract_params", abstract_params)
  manager, step = _find_params_checkpoint(path)
  try:
    item = {PARAMS_KEY: abstract_params}
    restored = manager.restore(
        step,
        args=ocp.args.Composite(**{
            STATE_ITEM: ocp.args.PyTreeRestore(
                item=item,
                restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                partial_restore=True),
        }))
  finally:
    manager.close()
  logging.info("Loaded parameters from step %d of %s", step, path)
  return restored[STATE_ITEM][PARAMS_KEY]
