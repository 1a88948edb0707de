#!/usr/bin/env bash
# Bazel's workspace status command (.bazelrc: build --workspace_status_command).
#
# Bazel runs it from the workspace root at the start of every build and gives
# its `KEY value` lines to the rules that stamp (the release .pyz files, and
# train_main under --stamp; see tools/zipapp/stamp.bzl). Keys starting with
# STABLE_ rebuild those rules when they change; no other action reads them, so
# unstamped tests stay cached across commits.
#
#   STABLE_GIT_COMMIT  the 40-hex commit checked out, or "unknown"
#   STABLE_GIT_DIRTY   "true" when tracked files differ from it, "false", or
#                      "unknown"
#
# It never fails the build: without git, outside a checkout, or where the
# workspace is only a folder inside some other repository (a copy of these
# sources), the revision is "unknown" rather than that repository's.

commit=unknown
dirty=unknown
if command -v git >/dev/null 2>&1; then
  toplevel="$(git rev-parse --show-toplevel 2>/dev/null || true)"
  if [[ -n "${toplevel}" && "$(cd "${toplevel}" && pwd -P)" == "$(pwd -P)" ]]; then
    head="$(git rev-parse --verify --quiet HEAD 2>/dev/null || true)"
    if [[ "${head}" =~ ^[0-9a-f]{40}$ ]]; then
      commit="${head}"
      # Tracked files only, as run_dir's provenance counts them: build outputs
      # and scratch files do not make a tree modified.
      if changes="$(git status --porcelain --untracked-files=no 2>/dev/null)"; then
        if [[ -n "${changes}" ]]; then dirty=true; else dirty=false; fi
      fi
    fi
  fi
fi
echo "STABLE_GIT_COMMIT ${commit}"
echo "STABLE_GIT_DIRTY ${dirty}"
