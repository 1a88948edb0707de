"""Checksums of a checkpoint's files: written at save, verified at read.

A checkpoint step directory holds orbax items (`state/`, `metadata/`), each
a tree of files. `write(step_dir)` records every file under the items in
`checksums.json` beside them: its path relative to the step directory, its
size and its CRC32C (Castagnoli, through `google-crc32c`, the package the
GCS client checks its transfers with; hardware-accelerated on x86 and ARM).
The granularity is the file: orbax's OCDBT data files (`d/<hash>`, each
holding the chunks of many arrays), its manifests, `_METADATA`, the
metadata item's JSON. Every file a reader of an item opens is covered,
whatever the number of processes that wrote it or the shardings it is read
onto: the files do not depend on the reader.

Both read every byte of a checkpoint, which takes minutes for a large state:
each reports its progress (files and bytes, GB/s, ETA) to a
`progress.Reporter`, saying nothing when it is short.

The manifest also names the checkpoint: its `step` and the `run_id` of
the run that wrote it (the run record's id), when the writer gives them.

`verify(step_dir, items)` recomputes the checksums of the files under
`items` before orbax reads any of them, and raises `ChecksumError` naming
the checkpoint and the first file that is missing, of another size or of
other content; given the step and the run's id, a manifest that records
another step (a step directory copied over another) or another run (a
checkpoint copied in from elsewhere, or one written before runs had ids)
is refused the same way. A step directory without `checksums.json`
(written before checksums existed, or by orbax straight to a bucket) is
`UNVERIFIED`: readers load it and say so in one line, unless the caller
requires a manifest (a run whose checkpoints carry them), where it is
refused.

Orbax's step-level `_CHECKPOINT_METADATA` (timestamps, item names, rewritten
when orbax commits the step) and its commit marker are not covered.
"""

import json
import os
from typing import Iterable, Optional

import google_crc32c

from maxtext.core import progress as progress_lib

MANIFEST = "checksums.json"
FORMAT = 1
ALGORITHM = "crc32c"
_BLOCK = 8 * 1024 * 1024
VERIFIED = "verified"
UNVERIFIED = "unverified"


class ChecksumError(ValueError):
  """A checkpoint file differs from its recorded checksum (one line)."""


def file_crc32c(path: str) -> str:
  """The CRC32C of the file at `path`, as 8 hex digits."""
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(_BLOCK):
      crc = google_crc32c.extend(crc, chunk)
  return f"{crc:08x}"


def _item_files(step_dir: str, items: Iterable[str]) -> list[str]:
  """The files under `items` of `step_dir`, relative to it, sorted."""
  out = []
  for item in items:
    root = os.path.join(step_dir, item)
    for parent, dirs, files in os.walk(root):
      dirs.sort()
      for name in files:
        path = os.path.join(parent, name)
        out.append(os.path.relpath(path, step_dir))
  return sorted(out)


def _checking(
    progress: progress_lib.Reporter, label: str, sizes: list[int]
) -> progress_lib.Progress:
  """The progress of checksumming files of `sizes` (quiet when short)."""
  return progress.start(
      label, sum(sizes), progress_lib.BYTES, quiet_if_short=True
  )


def write(
    step_dir: str,
    items: Iterable[str],
    progress: progress_lib.Reporter = progress_lib.SILENT,
    label: str = "checksums",
    *,
    step: Optional[int] = None,
    run_id: Optional[str] = None,
) -> int:
  """Records the checksums of the files under `items` in `step_dir`.

  Args:
    step_dir: a checkpoint step directory (or orbax's temporary one).
    items: the item subdirectories to cover, e.g. ("state", "metadata").
    progress: where the progress goes (files and bytes checksummed).
    label: names the job in the progress lines.
    step: the checkpoint's step, recorded when given.
    run_id: the id of the run writing it, recorded when given.

  Returns:
    The bytes checksummed.
  """
  files = {}
  names = _item_files(step_dir, items)
  sizes = [os.path.getsize(os.path.join(step_dir, n)) for n in names]
  with _checking(progress, label, sizes) as job:
    for i, (relative, size) in enumerate(zip(names, sizes), 1):
      path = os.path.join(step_dir, relative)
      files[relative] = {"size": size, ALGORITHM: file_crc32c(path)}
      job.advance(size, f"files {i}/{len(names)}")
  total = sum(sizes)
  manifest = {"format": FORMAT, "algorithm": ALGORITHM, "files": files}
  if step is not None:
    manifest["step"] = step
  if run_id is not None:
    manifest["run_id"] = run_id
  partial = os.path.join(step_dir, MANIFEST + ".partial")
  with open(partial, "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(partial, os.path.join(step_dir, MANIFEST))
  return total


def _read_manifest(step_dir: str, where: str) -> dict | None:
  """The manifest, its files entry checked; None when there is none."""
  path = os.path.join(step_dir, MANIFEST)
  try:
    with open(path, encoding="utf-8") as f:
      manifest = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise ChecksumError(f"{where}: {path} is unreadable: {e}") from None
  files = manifest.get("files") if isinstance(manifest, dict) else None
  if (
      not isinstance(files, dict)
      or manifest.get("algorithm") != ALGORITHM
      or not all(
          isinstance(entry, dict)
          and isinstance(entry.get("size"), int)
          and isinstance(entry.get(ALGORITHM), str)
          for entry in files.values()
      )
  ):
    raise ChecksumError(
        f"{where}: {path} is not a {ALGORITHM} manifest of format {FORMAT}"
    )
  return manifest


def has_manifest(step_dir: str) -> bool:
  """Whether `step_dir` holds a manifest (of any content)."""
  return os.path.lexists(os.path.join(step_dir, MANIFEST))


def _check_identity(
    manifest: dict, path: str, where: str, step, run_id
) -> None:
  """Refuses a manifest of another step or another run (one line)."""
  recorded = manifest.get("step")
  if step is not None and recorded is not None and recorded != step:
    raise ChecksumError(
        f"{where}: {path} records step {recorded!r}: a step directory "
        "copied over another"
    )
  if run_id is not None and manifest.get("run_id") != run_id:
    theirs = manifest.get("run_id")
    raise ChecksumError(
        f"{where}: {path} names "
        + (f"run {theirs!r}" if theirs is not None else "no run")
        + f", not this run ({run_id}): a checkpoint of another run"
    )


def check_identity(
    step_dir: str,
    where: str,
    *,
    step: Optional[int] = None,
    run_id: Optional[str] = None,
    required: bool = False,
) -> Optional[dict]:
  """`verify`'s checks of the manifest alone (no file is read): its
  manifest, or None when there is none and none is `required`.

  Raises:
    ChecksumError: as `verify`, for the manifest.
  """
  manifest = _read_manifest(step_dir, where)
  path = os.path.join(step_dir, MANIFEST)
  if manifest is None:
    if required:
      raise ChecksumError(
          f"{where}: {path} is missing, and every checkpoint of this run "
          "carries one"
      )
    return None
  _check_identity(manifest, path, where, step, run_id)
  return manifest


def verify(
    step_dir: str,
    items: Iterable[str],
    where: str,
    progress: progress_lib.Reporter = progress_lib.SILENT,
    *,
    step: Optional[int] = None,
    run_id: Optional[str] = None,
    required: bool = False,
) -> str:
  """Checks the files under `items` of `step_dir` against its manifest.

  Args:
    step_dir: a checkpoint step directory.
    items: the item subdirectories the reader reads.
    where: names the checkpoint in messages, e.g. "checkpoint step 8".
    progress: where the progress goes (files and bytes verified).
    step: the step the directory stands for: a manifest recording another
      is refused.
    run_id: the reading run's id: a manifest naming another run, or none,
      is refused.
    required: a directory without a manifest is refused.

  Returns:
    VERIFIED, or UNVERIFIED when the directory holds no manifest.

  Raises:
    ChecksumError: one line naming `where` and the first file (its path)
      that is missing, unrecorded, of another size or of another CRC32C,
      or the manifest that is missing, of another step or another run.
  """
  manifest = check_identity(
      step_dir, where, step=step, run_id=run_id, required=required
  )
  if manifest is None:
    return UNVERIFIED
  files = manifest["files"]
  items = tuple(items)
  recorded = {
      name: entry
      for name, entry in files.items()
      if name.split(os.sep, 1)[0] in items
  }
  present = set(_item_files(step_dir, items))
  for name in sorted(present - set(recorded)):
    raise ChecksumError(
        f"{where}: {os.path.join(step_dir, name)} is not in its {MANIFEST}"
    )
  sizes = [entry["size"] for entry in recorded.values()]
  with _checking(progress, f"{where}: verifying", sizes) as job:
    for i, (name, entry) in enumerate(sorted(recorded.items()), 1):
      _verify_file(step_dir, name, entry, present, where)
      job.advance(entry["size"], f"files {i}/{len(recorded)}")
  return VERIFIED


def _verify_file(
    step_dir: str, name: str, entry: dict, present: set[str], where: str
) -> None:
  """Checks one recorded file; raises ChecksumError as `verify` says."""
  path = os.path.join(step_dir, name)
  if name not in present:
    raise ChecksumError(f"{where}: {path} is missing (listed in {MANIFEST})")
  size = os.path.getsize(path)
  if size != entry["size"]:
    raise ChecksumError(
        f"{where}: {path} has {size} bytes, {entry['size']} recorded at save"
    )
  crc = file_crc32c(path)
  if crc != entry[ALGORITHM]:
    raise ChecksumError(
        f"{where}: {path} is damaged ({ALGORITHM} {crc}, "
        f"{entry[ALGORITHM]} recorded at save)"
    )
