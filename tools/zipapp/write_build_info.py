"""Writes build_info.json from Bazel's workspace status files (stamped builds).

Bazel runs tools/workspace_status.sh at the start of a build and writes its
`STABLE_*` lines to the stable status file (`ctx.info_file`) and its own
volatile keys (BUILD_TIMESTAMP) to the volatile one (`ctx.version_file`).
Only stamped actions read them (tools/zipapp/build_info.bzl). The output is the
file `maxtext.storage.build_info` reads at run time:

  {"git_revision": "<40 hex>[+dirty]" | "unknown",
   "git_commit": "<40 hex>" | "unknown",
   "git_dirty": true | false | null,
   "build_time_utc": "YYYY-MM-DDTHH:MM:SS+00:00" | null}

`git_revision` has the form run directories record when they ask git
themselves, so a stamped and an unstamped run of one tree name it alike.
"""

import argparse
import datetime
import json
import re
from typing import Any, Optional

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_DIRTY = {"true": True, "false": False}


def read_status(path: str) -> dict[str, str]:
  """The `KEY value` lines of a workspace status file, as a dict."""
  status = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      key, _, value = line.rstrip("\n").partition(" ")
      if key:
        status[key] = value
  return status


def _build_time(timestamp: Optional[str]) -> Optional[str]:
  """BUILD_TIMESTAMP (seconds since the epoch; Bazel 4 writes seconds) as
  ISO 8601 UTC, or None when absent or not a number."""
  try:
    seconds = int(timestamp)
  except (TypeError, ValueError):
    return None
  return datetime.datetime.fromtimestamp(
      seconds, datetime.timezone.utc
  ).isoformat()


def build_info(
    stable: dict[str, str], volatile: dict[str, str]
) -> dict[str, Any]:
  """The build_info.json document of one build's status files.

  Args:
    stable: the stable status (STABLE_GIT_COMMIT, STABLE_GIT_DIRTY).
    volatile: the volatile status (BUILD_TIMESTAMP).

  Returns:
    The document; a commit that is not 40 hex digits becomes "unknown", and
    then so does the dirty flag (it describes a tree relative to a commit).
  """
  commit = stable.get("STABLE_GIT_COMMIT", "")
  if not _COMMIT.match(commit):
    commit, dirty = "unknown", None
  else:
    dirty = _DIRTY.get(stable.get("STABLE_GIT_DIRTY", ""))
  revision = commit + ("+dirty" if dirty else "")
  return {
      "git_revision": revision,
      "git_commit": commit,
      "git_dirty": dirty,
      "build_time_utc": _build_time(volatile.get("BUILD_TIMESTAMP")),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--stable_status", required=True)
  parser.add_argument("--volatile_status", required=True)
  parser.add_argument("--output", required=True)
  args = parser.parse_args()
  document = build_info(
      read_status(args.stable_status), read_status(args.volatile_status)
  )
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(document, f, indent=2, sort_keys=True)
    f.write("\n")


if __name__ == "__main__":
  main()
