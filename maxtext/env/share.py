"""Results made on process 0, shared with every process of the job.

Episodes, tools and verifiers run once per job, on process 0: a second
process running them would see other wall times, other tool outcomes and
could diverge. `from_lead(value)` returns process 0's value on every
process (JSON-serialisable values; one broadcast of the length, one of the
bytes). With one process it returns the value as is.
"""

import json
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np


def is_lead() -> bool:
  """Whether this process runs the episodes (process 0)."""
  return jax.process_index() == 0


def from_lead(value: Any) -> Any:
  """Process 0's `value` on every process (others pass None)."""
  if jax.process_count() == 1:
    return value
  data = json.dumps(value).encode() if is_lead() else b""
  size = int(
      multihost_utils.broadcast_one_to_all(np.asarray(len(data), np.int64))
  )
  buffer = np.zeros((size,), np.uint8)
  if is_lead():
    buffer[:] = np.frombuffer(data, np.uint8)
  shared = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
  return json.loads(bytes(shared).decode())
