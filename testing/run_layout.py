"""The layout of a finished run's directory, shared by end-to-end tests."""

# What every run of the default config (MLPerf log and checkpoints on) leaves
# in its run directory; a run may leave more (config_history.jsonl, a lock).
RUN_DIR_ENTRIES = frozenset(
    ("config.json", "metrics.jsonl", "mllog.log", "tensorboard", "checkpoints")
)
