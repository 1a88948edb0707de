"""The data pipeline's position, saved beside each checkpoint.

A dataset with iterator state (the Grain text pipeline) gives one JSON dict
per process for the checkpoint of a step; it is written to
`<checkpoint_dir>/data_iterator/<step>/process_<i>.json` by each process
(atomically: a temporary file renamed into place), read back by the same
process index when that step is restored, and pruned with the checkpoints
(`prune`). Orbax lists only step-numbered directories, so it never sees
`data_iterator/`. Datasets whose batches are a pure function of the step
(synthetic, token files) have no state and write nothing; checkpoints
without a state file resume as before.

Only local checkpoint directories hold states; for a gs:// checkpoint
directory nothing is written and a resume recomputes the position from the
step (the Grain dataset can, more slowly).
"""

import json
import os
import shutil
import tempfile
from typing import Any, Iterable, Optional

from maxtext.storage import gcs_mirror

DIRNAME = "data_iterator"


def _path(checkpoint_dir: str, step: int, process_index: int) -> str:
  return os.path.join(
      checkpoint_dir, DIRNAME, str(step), f"process_{process_index}.json"
  )


def save(
    checkpoint_dir: str, step: int, process_index: int, state: dict[str, Any]
) -> Optional[str]:
  """Writes one process's state for checkpoint `step`; returns the path.

  Returns None (writing nothing) for a gs:// checkpoint directory.

  Raises:
    OSError: the file cannot be written (names the path).
  """
  if gcs_mirror.is_gs_url(checkpoint_dir):
    return None
  path = _path(checkpoint_dir, step, process_index)
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".state.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump(state, f, sort_keys=True)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return path


def load(
    checkpoint_dir: str, step: int, process_index: int
) -> Optional[dict[str, Any]]:
  """This process's state for checkpoint `step`, or None if none was saved.

  Raises:
    ValueError: the file exists but is not a JSON object (names the path).
  """
  if gcs_mirror.is_gs_url(checkpoint_dir):
    return None
  path = _path(checkpoint_dir, step, process_index)
  try:
    with open(path, encoding="utf-8") as f:
      state = json.load(f)
  except FileNotFoundError:
    return None
  except json.JSONDecodeError as e:
    raise ValueError(f"data iterator state {path} is malformed: {e}") from e
  if not isinstance(state, dict):
    raise ValueError(f"data iterator state {path} is not a JSON object")
  return state


def prune(checkpoint_dir: str, keep_steps: Iterable[int]) -> None:
  """Removes the states of steps that have no checkpoint any more."""
  root = os.path.join(checkpoint_dir, DIRNAME)
  if gcs_mirror.is_gs_url(checkpoint_dir) or not os.path.isdir(root):
    return
  keep = {str(step) for step in keep_steps}
  for name in os.listdir(root):
    if name.isdigit() and name not in keep:
      shutil.rmtree(os.path.join(root, name), ignore_errors=True)
