"""A child process of a test's jax.distributed job: its start and its end.

A test launches `python -m testing.<child> --output=DIR` as every process of
one job (`multiprocess.run_children`, which adds `--config.num_processes`,
`--config.process_id` and `--config.coordinator_address`); the child calls
`join(argv)`, does its work and hands what it holds to `finish`, which
writes it to DIR/process_<index>.json for the test to read.
"""

import json
import os
from typing import Any

import jax


def join(argv: list[str]) -> dict[str, str]:
  """Joins the job the flags in `argv` name; returns the flags, by name
  without leading dashes ("output", "config.process_id", ...)."""
  flags = {}
  for arg in argv[1:]:
    name, _, value = arg.lstrip("-").partition("=")
    flags[name] = value
  jax.distributed.initialize(
      coordinator_address=flags["config.coordinator_address"],
      num_processes=int(flags["config.num_processes"]),
      process_id=int(flags["config.process_id"]),
      initialization_timeout=120,
  )
  return flags


def finish(flags: dict[str, str], result: Any) -> None:
  """Writes `result` (JSON) for the test and leaves the job."""
  path = os.path.join(flags["output"], f"process_{jax.process_index()}.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(result, f)
  jax.distributed.shutdown()
