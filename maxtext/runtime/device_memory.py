"""The memory a JAX device holds, where its backend says, and the host's."""

import os
from typing import Optional


def bytes_limit(device) -> Optional[int]:
  """`device`'s memory limit in bytes (TPUs and GPUs report it), or None
  on a CPU or where the backend does not say."""
  if device.platform == "cpu":
    return None
  try:
    stats = device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except  # Backend-specific.
    return None
  limit = stats.get("bytes_limit")
  return int(limit) if limit else None


def host_bytes() -> Optional[int]:
  """The host's physical memory in bytes, or None where the OS does not
  say."""
  try:
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError):
    return None
  return pages * size if pages > 0 and size > 0 else None
