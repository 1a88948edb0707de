"""The cache flush MLPerf demands before a run, done for real on every host.

The MLPerf Training rules ask that the system's caches be flushed before each
run, and the log's `cache_clear` event claims it. `flush_cache` runs this
host's flush: a shell command from the config, or by default (an empty
command) `sync` then writing 3 to `/proc/sys/vm/drop_caches`, which Linux only
lets root do. `flush_all_hosts` runs it on every process of the job and
agrees on the outcome, so that `cache_clear` says `True` only when every host
flushed. A flush that did not happen is reported with its reason, never
claimed.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Callable, Optional

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from maxtext.core import checks

# The default flush: write back dirty pages, then drop the page cache, dentries
# and inodes (3). Only root may write drop_caches.
DEFAULT_COMMAND = "sync && echo 3 > /proc/sys/vm/drop_caches"

# `sync` on a host with much dirty data can take minutes; a hung command must
# still not hold the run forever.
DEFAULT_TIMEOUT_S = 300.0

# How much of a failed command's output a reason quotes.
_OUTPUT_LIMIT = 500


@dataclasses.dataclass(frozen=True)
class FlushResult:
  """The outcome of a cache flush.

  Attributes:
    flushed: True only if the flush command ran and exited 0.
    reason: why the cache was not flushed ("" when it was).
    command: the shell command run, or "" when none was.
  """

  flushed: bool
  reason: str = ""
  command: str = ""


def _default_command(platform: str, euid: Optional[int]) -> tuple[str, str]:
  """Returns (command, "") for the default flush, or ("", why it cannot run)."""
  if not platform.startswith("linux"):
    return "", (
        f"the default cache flush needs Linux (this is {platform}); "
        "set cache_clear_command to this system's flush command"
    )
  if euid != 0:
    return "", (
        f"the default cache flush writes /proc/sys/vm/drop_caches, "
        f"which needs root (effective uid {euid}); run as root or set "
        "cache_clear_command"
    )
  return DEFAULT_COMMAND, ""


def _tail(text: str) -> str:
  text = (text or "").strip()
  if len(text) > _OUTPUT_LIMIT:
    text = "..." + text[-_OUTPUT_LIMIT:]
  return text


def flush_cache(
    command: str = "",
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    platform: str = sys.platform,
    euid: Optional[int] = None,
) -> FlushResult:
  """Flushes this host's caches; never raises for a flush that fails.

  Args:
    command: a shell command that flushes the caches, run with `/bin/sh -c`;
      "" = the default (`DEFAULT_COMMAND`, as root on Linux only).
    timeout_s: the most seconds the command may run; past it, it is killed
      and the cache counts as not flushed.
    platform: `sys.platform`; injectable for tests.
    euid: the effective user id; None = `os.geteuid()` where it exists.

  Returns:
    `FlushResult(flushed=True)` if the command exited 0; otherwise
    `flushed=False` with the reason (not Linux, not root, the command's exit
    status and output, a timeout, or a command that could not start).

  Raises:
    TypeError: `command` is not a str, or `timeout_s` not a number.
    ValueError: `timeout_s` is not finite and > 0.
  """
  if not isinstance(command, str):
    raise TypeError(
        f"cache_clear_command must be a str, got {type(command).__name__}"
    )
  timeout_s = checks.check_number("timeout_s", timeout_s, positive=True)
  if not command.strip():
    if euid is None:
      euid = os.geteuid() if hasattr(os, "geteuid") else None
    command, why_not = _default_command(platform, euid)
    if not command:
      return FlushResult(False, why_not)
  return _run(command, timeout_s)


def _run(command: str, timeout_s: float) -> FlushResult:
  """Runs the flush `command` with `/bin/sh -c`; its outcome, never an
  error."""
  try:
    proc = subprocess.run(
        command,
        shell=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout_s,
        check=False,
    )
  except subprocess.TimeoutExpired:
    return FlushResult(
        False,
        f"{command!r} did not finish within {timeout_s:g} s and was killed",
        command,
    )
  except OSError as e:  # No shell to run it with.
    return FlushResult(False, f"{command!r} could not start: {e}", command)
  if proc.returncode != 0:
    output = _tail(proc.stderr) or _tail(proc.stdout)
    status = (
        f"was killed by signal {-proc.returncode}"
        if proc.returncode < 0
        else f"exited with status {proc.returncode}"
    )
    return FlushResult(
        False,
        f"{command!r} {status}" + (f": {output}" if output else ""),
        command,
    )
  return FlushResult(True, "", command)


def agree(
    result: FlushResult,
    *,
    allgather: Optional[Callable[[np.ndarray], np.ndarray]] = None,
) -> FlushResult:
  """The job's outcome: flushed only if every process flushed.

  A collective: with more than one JAX process, every process must call it.

  Args:
    result: this process's `flush_cache` result.
    allgather: gathers one value per process, in process order; None = JAX's
      `multihost_utils.process_allgather` when `jax.process_count() > 1`,
      else this process alone.

  Returns:
    `result` itself when every process flushed, or this process failed;
    otherwise a not-flushed result naming the processes that failed (their
    own logs say why).
  """
  if allgather is None:
    if jax.process_count() == 1:
      return result
    allgather = multihost_utils.process_allgather
  flags = np.asarray(allgather(np.asarray(result.flushed, np.int32)))
  failed = [i for i, ok in enumerate(flags.reshape(-1)) if not ok]
  if not failed or not result.flushed:
    return result
  return FlushResult(
      False,
      f"the cache flush failed on process(es) {failed} (their logs say why)",
      result.command,
  )


def flush_all_hosts(
    command: str = "", *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> FlushResult:
  """Flushes every host's caches and agrees on the outcome (a collective).

  Each process runs `flush_cache(command)` on its own host and warns with the
  reason if it failed; then the processes agree (`agree`).

  Args:
    command: see `flush_cache`.
    timeout_s: see `flush_cache`.

  Returns:
    The job's `FlushResult`: flushed only if every host flushed.
  """
  local = flush_cache(command, timeout_s=timeout_s)
  if local.flushed:
    logging.info("Cache flush: %r succeeded on this host.", local.command)
  else:
    logging.warning("Cache flush: not flushed on this host: %s", local.reason)
  return agree(local)
