"""The memory a JAX device holds, where its backend says."""

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
