"""Packs runfiles and the launcher into one executable zip (python_zipapp).

Inputs come from zipapp.bzl: a manifest of `short_path<TAB>exec_path` lines (one
per runfile), the workspace name, the main file and the import paths (both
relative to the runfiles root), and `--file RUNFILES_PATH=EXEC_PATH` for files
added to the runfiles or replacing one there (the stamped build_info.json). The
output is three parts back to back:

  #!/usr/bin/env python3  the line that lets the file run as ./FILE
  payload zip             runfiles/... (ZIP64 past 4 GiB, as with CUDA wheels)
  launcher zip            __main__.py (the launcher) and zipapp_manifest.json

Python runs a file whose end is a zip archive by importing `__main__` from it,
and its zip importer reads the last archive of the file, allowing data before
it, but not ZIP64. So the small launcher archive comes last and the payload,
however large, sits before it; the manifest gives the payload's offset and
length.
"""

import argparse
import hashlib
import io
import json
import os
import stat
import zipfile

_SHEBANG = b"#!/usr/bin/env python3\n"
# Deflate at level 1: most of the bytes are native libraries, which level 9
# hardly shrinks further while taking several times longer.
_COMPRESS_LEVEL = 1


def _runfiles_path(short_path: str, workspace: str) -> str:
  """Where a file sits under the runfiles root (external repos: ../repo/...)."""
  if short_path.startswith("../"):
    return short_path[3:]
  return workspace + "/" + short_path


def _read_manifest(path: str, workspace: str) -> list[tuple[str, str]]:
  """Returns the manifest's (runfiles path, exec path) pairs, sorted."""
  entries = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.rstrip("\n")
      if not line:
        continue
      short_path, exec_path = line.split("\t")
      entries[_runfiles_path(short_path, workspace)] = exec_path
  return sorted(entries.items())


def _write_payload(f, entries: list[tuple[str, str]], digest) -> None:
  """Writes the runfiles archive to `f`; hashes paths and files into digest."""
  with zipfile.ZipFile(
      f,
      "w",
      compression=zipfile.ZIP_DEFLATED,
      compresslevel=_COMPRESS_LEVEL,
      allowZip64=True,
  ) as archive:
    for runfiles_path, source in entries:
      with open(source, "rb") as src:
        data = src.read()
      digest.update(runfiles_path.encode() + b"\0")
      digest.update(hashlib.sha256(data).digest())
      info = zipfile.ZipInfo(
          "runfiles/" + runfiles_path, date_time=(1980, 1, 1, 0, 0, 0)
      )
      mode = 0o755 if os.stat(source).st_mode & stat.S_IXUSR else 0o644
      info.external_attr = (stat.S_IFREG | mode) << 16
      info.compress_type = zipfile.ZIP_DEFLATED
      archive.writestr(info, data, compresslevel=_COMPRESS_LEVEL)


def build(
    output: str,
    launcher: str,
    entries: list[tuple[str, str]],
    main_path: str,
    python_paths: list[str],
) -> str:
  """Writes the zipapp; returns its content id (a hash of paths and bytes)."""
  digest = hashlib.sha256()
  with open(launcher, "rb") as src:
    launcher_data = src.read()
  with open(output, "wb") as f:
    f.write(_SHEBANG)
    payload_offset = f.tell()
    _write_payload(f, entries, digest)
    payload_length = f.tell() - payload_offset
    digest.update(launcher_data)
    content_id = digest.hexdigest()[:24]
    manifest = {
        "id": content_id,
        "main": main_path,
        "python_paths": python_paths,
        "payload_offset": payload_offset,
        "payload_length": payload_length,
    }
    # Built in memory so that its offsets count from its own start: readers find
    # it through its end record, whatever lies before it, and it needs no ZIP64.
    launcher_zip = io.BytesIO()
    with zipfile.ZipFile(
        launcher_zip, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=False
    ) as archive:
      for name, data in (
          ("zipapp_manifest.json", json.dumps(manifest, indent=1).encode()),
          ("__main__.py", launcher_data),
      ):
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        archive.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    f.write(launcher_zip.getvalue())
  os.chmod(output, 0o755)
  return content_id


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--output", required=True)
  parser.add_argument("--launcher", required=True)
  parser.add_argument("--workspace", required=True)
  parser.add_argument("--main", required=True)
  parser.add_argument("--python_path", action="append", default=[])
  parser.add_argument("--manifest", required=True)
  parser.add_argument(
      "--file",
      action="append",
      default=[],
      help="RUNFILES_PATH=EXEC_PATH, added or replacing",
  )
  args = parser.parse_args()
  entries = dict(_read_manifest(args.manifest, args.workspace))
  for extra in args.file:
    runfiles_path, sep, exec_path = extra.partition("=")
    if not sep or not runfiles_path or not exec_path:
      parser.error(f"--file {extra!r}: expected RUNFILES_PATH=EXEC_PATH")
    entries[runfiles_path] = exec_path
  entries = sorted(entries.items())
  if args.main not in dict(entries):
    parser.error(f"--main {args.main} is not among the runfiles")
  build(args.output, args.launcher, entries, args.main, args.python_path)


if __name__ == "__main__":
  main()
