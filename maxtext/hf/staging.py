"""The staging directory an import or export writes before renaming it.

`make(output_dir, kind)` creates `<output_dir>.<kind>-XXXX` beside the
output (the same file system, so the finished directory is renamed into
place), first removing what a killed run of the same tool to the same
output left there (`<output_dir>.<kind>-*`), with one line naming each.
`output_dir` is resolved with its symbolic links first (`resolve`), so a
link to an empty directory is replaced where it points.
"""

import glob
import os
import shutil
import tempfile
from typing import Callable


def resolve(output_dir: str) -> str:
  """`output_dir` as an absolute path with its symbolic links resolved."""
  return os.path.realpath(output_dir)


def check_output(output_dir: str) -> None:
  """Refuses (ValueError, one line) an output directory (resolved) that
  exists and is not an empty directory, or that cannot be made because a
  path above it is not a directory (a regular file)."""
  if os.path.exists(output_dir) and (
      not os.path.isdir(output_dir) or os.listdir(output_dir)
  ):
    raise ValueError(f"--output_dir {output_dir}: exists and is not empty")
  above = os.path.dirname(output_dir)
  while not os.path.exists(above):
    above = os.path.dirname(above)
  if not os.path.isdir(above):
    raise ValueError(
        f"--output_dir {output_dir}: {above} above it is not a directory"
    )


def make(output_dir: str, kind: str, log: Callable[[str], None]) -> str:
  """A new staging directory for `output_dir` (resolved); see the module.

  Args:
    output_dir: the resolved output directory.
    kind: "importing" or "exporting".
    log: where the removal of a leftover is told.
  """
  parent = os.path.dirname(output_dir)
  os.makedirs(parent, exist_ok=True)
  prefix = f"{os.path.basename(output_dir)}.{kind}-"
  for leftover in sorted(
      glob.glob(os.path.join(glob.escape(parent), prefix + "*"))
  ):
    if os.path.isdir(leftover) and not os.path.islink(leftover):
      shutil.rmtree(leftover, ignore_errors=True)
      log(f"removed {leftover}, left by an interrupted run of this tool")
  return tempfile.mkdtemp(prefix=prefix, dir=parent)
