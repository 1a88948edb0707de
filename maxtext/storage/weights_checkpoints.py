"""Weights-only checkpoints for deferred evaluation, beside the run's own.

With `deferred_eval` a run saves, at every point its eval schedule names,
the parameters alone (no optimizer state) in `<run dir>/eval_checkpoints/`,
a directory of its own: the run's resumable checkpoints stay in
`checkpoint_dir`, so neither a resume nor `load_parameters_path` can take
one kind for the other (a weights-only checkpoint does not restore as a
train state either: its tree lacks the optimizer state).

Each step directory is an ordinary `checkpointing.Checkpointer` checkpoint:
item "state" is `{"params": ...}`, item "metadata" holds the step, the
samples trained and `update_time_ms`, the time (milliseconds since the
epoch) at which the step's parameter update had finished, the time MLPerf
lets a deferred result's clock stop at. Every one carries the CRC32C
manifest every checkpoint of this project carries, verified when it is read.
All of them are kept (`max_to_keep` 0), and a step already saved is never
written again (`Checkpointer.save` leaves an existing step alone).
"""

import dataclasses
import math
import os
from typing import Any, Callable, Optional

from maxtext.core import progress as progress_lib
from maxtext.storage import checkpointing

DIRNAME = "eval_checkpoints"


def directory(run_dir: str) -> str:
  """Where a run's weights-only checkpoints are: <run_dir>/eval_checkpoints."""
  return os.path.join(run_dir, DIRNAME)


def open_checkpointer(
    run_dir: str,
    fence: Optional[Callable[[], None]] = None,
    progress: Optional[progress_lib.Reporter] = None,
) -> checkpointing.Checkpointer:
  """The run's weights-only checkpoint directory (created if missing).

  Args:
    run_dir: the local run directory.
    fence: as `Checkpointer`'s: raises once the run may write nothing more.
    progress: as `Checkpointer`'s: where long work reports its progress.
  """
  return checkpointing.Checkpointer(
      directory(run_dir),
      save_period=1,
      max_to_keep=0,
      fence=fence,
      progress=progress,
  )


@dataclasses.dataclass(frozen=True)
class Saved:
  """What a weights-only checkpoint's metadata says about it.

  Attributes:
    step: completed optimizer steps (the checkpoint's step).
    samples: samples trained once that step finished.
    update_time_ms: when that step's update had finished, in milliseconds
      since the epoch (rounded up, so never before it).
  """

  step: int
  samples: int
  update_time_ms: int


def update_time_ms(update_time: float) -> int:
  """Seconds since the epoch as whole milliseconds, rounded up."""
  return math.ceil(update_time * 1e3)


def save(
    checkpointer: checkpointing.Checkpointer,
    step: int,
    params: Any,
    *,
    samples: int,
    update_time: float,
) -> bool:
  """Starts saving `params` as weights-only checkpoint `step`.

  Args:
    checkpointer: from `open_checkpointer`.
    step: completed optimizer steps.
    params: the parameters after that step's update (device arrays).
    samples: samples trained once that step finished.
    update_time: seconds since the epoch at which the update had finished.

  Returns:
    True if a save was started; False where the step already exists (it is
    left as it is).

  Raises:
    checkpointing.CheckpointError: the save cannot be written.
  """
  return checkpointer.save(
      step,
      {checkpointing.PARAMS_KEY: params},
      {
          "step": step,
          "samples_count": samples,
          "update_time_ms": update_time_ms(update_time),
      },
      force=True,
  )


def restore(
    checkpointer: checkpointing.Checkpointer, step: int, abstract_params: Any
) -> tuple[Any, Saved]:
  """Reads weights-only checkpoint `step`, verified against its checksums.

  Args:
    checkpointer: from `open_checkpointer`.
    step: the checkpoint's step.
    abstract_params: the parameters' `jax.ShapeDtypeStruct`s with shardings.

  Returns:
    (the parameters, what its metadata says).

  Raises:
    FileNotFoundError: no checkpoint of that step.
    checksums.ChecksumError: a file is missing or differs from its checksum.
    ValueError: the parameters' tree or shapes differ from
      `abstract_params` (names the leaf).
    Exception: what orbax raises for other damage.
  """
  state, metadata = checkpointer.restore(
      step, {checkpointing.PARAMS_KEY: abstract_params}
  )
  return state[checkpointing.PARAMS_KEY], Saved(
      step=int(metadata["step"]),
      samples=int(metadata["samples_count"]),
      update_time_ms=int(metadata["update_time_ms"]),
  )
