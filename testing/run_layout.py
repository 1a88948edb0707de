"""The layout of a finished run's directory, shared by end-to-end tests."""

import os

from maxtext.metrics import jsonl

# What every run of the default config (MLPerf log and checkpoints on) leaves
# in its run directory; a run may leave more (config_history.jsonl, a lock).
RUN_DIR_ENTRIES = frozenset(
    ("config.json", "metrics.jsonl", "mllog.log", "tensorboard", "checkpoints")
)


def untimed_records(run_dir: str) -> list[dict]:
  """The run's metrics.jsonl records without their timing fields (those that
  differ between two runs of the same steps)."""
  return jsonl.read_untimed(os.path.join(run_dir, jsonl.METRICS_FILENAME))
