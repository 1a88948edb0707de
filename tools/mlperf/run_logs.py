"""What a packager needs from one run directory: its MLPerf log and config.

A run directory written by `maxtext.run.trainer` holds `config.json` (the
resolved config and its provenance: JAX version, devices, git revision) and
the MLPerf log, `mllog.log` unless the config's `mllog_file` names another
path. A resumed run writes one log per attempt (`mllog.2.log`, ...); a
submission's time to train must come from one uninterrupted attempt, so such a
run is refused here, as is a log that disagrees with the run's
`metrics.jsonl` (see `cross_check`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

from maxtext.mllog import logger as mllog_logger
from maxtext.storage import run_record
from tools.mlperf import cross_check

LINE_PREFIX = ":::MLLOG "

# The log keys a submission is described by, and the RunLog fields they fill.
_SUBMISSION_KEYS = {
    "submission_org": "org",
    "submission_platform": "system",
    "submission_division": "division",
    "submission_status": "status",
    "submission_benchmark": "benchmark",
}


class RunDirError(ValueError):
  """A run directory that cannot be packaged; the message says why."""


@dataclasses.dataclass(frozen=True)
class RunLog:
  """One run's MLPerf log and the facts a package is built from.

  Attributes:
    run_dir: the run directory.
    log_path: its MLPerf log.
    org: `submission_org` as logged.
    system: `submission_platform` as logged (the system's name).
    division: `submission_division` as logged ("open" or "closed").
    status: `submission_status` as logged ("onprem", "cloud", "research").
    benchmark: `submission_benchmark` as logged.
    ruleset: the config's `mllog_ruleset`.
    seed: the logged `seed`, or None when the log has none.
    config: the resolved config (config.json's "config").
    provenance: config.json's "provenance" (versions, devices, revision).
    log_revision: the git revision the MLPerf log names (the metadata of
      its `submission_platform` event), or None for a log that names none.
  """

  run_dir: str
  log_path: str
  org: str
  system: str
  division: str
  status: str
  benchmark: str
  ruleset: str
  seed: Optional[int]
  config: dict[str, Any]
  provenance: dict[str, Any]
  log_revision: Optional[str] = None

  @property
  def git_revision(self) -> str:
    """The revision config.json records; "unknown" where it records none."""
    revision = self.provenance.get("git_revision")
    return revision if isinstance(revision, str) and revision else "unknown"


def read_numbered_events(log_path: str) -> list[tuple[int, dict[str, Any]]]:
  """The `:::MLLOG` events of a log with their line numbers, in file order.

  Raises:
    RunDirError: a line after the prefix is not a JSON object.
  """
  events = []
  with open(log_path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.startswith(LINE_PREFIX):
        continue
      try:
        event = json.loads(line[len(LINE_PREFIX) :])
      except json.JSONDecodeError as e:
        raise RunDirError(f"{log_path}:{lineno}: not an MLLOG line: {e}") from e
      if not isinstance(event, dict):
        raise RunDirError(f"{log_path}:{lineno}: not an MLLOG event object")
      events.append((lineno, event))
  return events


def read_events(log_path: str) -> list[dict[str, Any]]:
  """The `:::MLLOG` events of a log, in file order.

  Raises:
    RunDirError: a line after the prefix is not a JSON object.
  """
  return [event for _, event in read_numbered_events(log_path)]


def _second_attempt(log_path: str) -> str:
  stem, ext = os.path.splitext(log_path)
  return f"{stem}.2{ext}"


def _read_config_json(run_dir: str) -> dict[str, Any]:
  """Returns the run's config.json document; RunDirError if it is not one."""
  try:
    document = run_record.read_config_json(run_dir)
  except ValueError as e:
    raise RunDirError(str(e)) from e
  if document is None:
    raise RunDirError(
        f"run directory {run_dir!r} has no {run_record.CONFIG_JSON}: not a "
        f"run directory written by maxtext"
    )
  return document


def read_run(run_dir: str) -> RunLog:
  """Reads a run directory's config.json and the submission facts of its log.

  Args:
    run_dir: a run directory written by `maxtext.run.trainer.run` with
      `enable_mllog` on.

  Returns:
    The run's RunLog.

  Raises:
    RunDirError: not a directory, no config.json, no MLPerf log, a resumed
      run (several attempt logs), or a log missing a submission key.
  """
  if not os.path.isdir(run_dir):
    raise RunDirError(f"run directory {run_dir!r} does not exist")
  run_dir = os.path.abspath(run_dir)
  document = _read_config_json(run_dir)
  config = document["config"]
  log_path = _log_path(run_dir, config)
  events = read_numbered_events(log_path)
  try:
    cross_check.check_run(
        log_path, events, run_dir, int(config.get("global_batch_size") or 0)
    )
  except cross_check.MismatchError as e:
    raise RunDirError(str(e)) from e
  found, seed, log_revision = _submission_facts(events)
  missing = [k for k, field in _SUBMISSION_KEYS.items() if field not in found]
  if missing:
    raise RunDirError(f"{log_path}: the log has no {', '.join(missing)}")
  return RunLog(
      run_dir=run_dir,
      log_path=log_path,
      ruleset=str(config.get("mllog_ruleset", "")),
      seed=seed,
      config=config,
      provenance=dict(document.get("provenance") or {}),
      log_revision=log_revision,
      **{k: str(v) for k, v in found.items()},
  )


def _log_path(run_dir: str, config: dict[str, Any]) -> str:
  """The path of the run's one MLPerf log.

  Raises:
    RunDirError: there is none, or the run was resumed (a second attempt's
      log exists).
  """
  log_path = config.get("mllog_file") or os.path.join(run_dir, "mllog.log")
  if not os.path.isfile(log_path):
    raise RunDirError(
        f"run directory {run_dir!r} has no MLPerf log "
        f"{log_path!r} (was enable_mllog on?)"
    )
  if os.path.exists(_second_attempt(log_path)):
    raise RunDirError(
        f"run directory {run_dir!r} was resumed ({_second_attempt(log_path)} "
        f"exists): a result must be one uninterrupted run"
    )
  return log_path


def _submission_facts(
    events: list[tuple[int, dict[str, Any]]],
) -> tuple[dict[str, Any], Optional[int], Optional[str]]:
  """What a log's (line number, event) pairs say: (the first value of each
  submission key by RunLog field, the first integer seed, the first
  revision event's revision), None where the log does not say."""
  found: dict[str, Any] = {}
  seed = log_revision = None
  for _, event in events:
    key = event.get("key")
    if key == mllog_logger.REVISION_EVENT and log_revision is None:
      metadata = event.get("metadata")
      if isinstance(metadata, dict):
        revision = metadata.get(mllog_logger.REVISION_METADATA)
        log_revision = str(revision) if revision is not None else None
    if key in _SUBMISSION_KEYS and _SUBMISSION_KEYS[key] not in found:
      found[_SUBMISSION_KEYS[key]] = event.get("value")
    elif key == "seed" and seed is None and isinstance(event.get("value"), int):
      seed = event["value"]
  return found, seed, log_revision
