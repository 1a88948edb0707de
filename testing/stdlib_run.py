"""Test helper: a tiny model trained on the stdlib's sources (dataset_type
grain), for tests that need a real run on real text."""

import os

from maxtext import workloads

from maxtext.text import prepare
from testing import stdlib_corpus
from testing import tiny_configs

VOCAB_SIZE = 400


def prepare_data(root: str, files: int = 5) -> str:
  """Prepares `files` stdlib sources (a trained 400-id tokenizer) under
  `root`; returns the data directory."""
  data = os.path.join(root, "stdlib_data")
  prepare.prepare(
      stdlib_corpus.files(files),
      data,
      train_vocab_size=VOCAB_SIZE,
      eval_every=3,
      report=lambda line: None,
  )
  return data


def config(root: str, data: str, run_name: str, steps: int, **overrides):
  """The tiny config training on `data`, writing runs under `root`.

  Args:
    root: the base_output_directory.
    data: a directory from `prepare_data`.
    run_name: the run directory's name.
    steps: the step budget.
    **overrides: further config fields.
  """
  fields = dict(
      dataset_type="grain",
      train_data_path=data,
      vocab_size=VOCAB_SIZE,
      learning_rate=1e-2,
      enable_mllog=False,
      target_eval_loss=0.0,
  )
  fields.update(overrides)
  return tiny_configs.tiny_config(
      root, run_name=run_name, steps=steps, **fields
  )


def train(root: str, data: str, run_name: str, steps: int, **overrides):
  """Trains (or resumes) the run; returns trainer.run's result."""
  return workloads.run(config(root, data, run_name, steps, **overrides))
