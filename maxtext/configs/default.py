"""The embedded default: a tiny model that learns synthetic data on the CPU.

`train_main` runs this config when no --config is given. It trains a ~0.6M
parameter model on synthetic arithmetic progressions, evaluates every 10 steps
and stops with success once the mean eval loss is below `target_eval_loss`,
which takes a few dozen steps (well under a minute on 2 CPU cores, compile
included). It writes an MLPerf log (open division) under the system temp dir.
"""

import os
import tempfile

import ml_collections

from maxtext.configs import base


def get_config() -> ml_collections.ConfigDict:
  """Returns the default configuration: base.py with the overrides below."""
  config = base.get_config()

  # Output under the system temp dir, so a first run needs no setup.
  config.base_output_directory = os.path.join(
      tempfile.gettempdir(), "maxtext_runs"
  )
  config.checkpoint_period = 100

  # Tiny model: 2 layers, width 128, grouped-query attention (4 query heads
  # sharing 2 key/value heads).
  config.vocab_size = 256
  config.emb_dim = 128
  config.num_layers = 2
  config.num_heads = 4
  config.num_kv_heads = 2
  config.head_dim = 32
  config.mlp_dim = 512
  config.max_sequence_length = 64

  # Synthetic progressions: the loss floor is log(4)/64 ~ 0.02 nats per token.
  config.dataset_type = "synthetic"

  # 16 sequences per step in 2 micro-batches of 8 (exercises accumulation).
  config.global_batch_size = 16
  config.gradient_accumulation_steps = 2
  config.steps = 200

  config.learning_rate = 3e-3
  config.warmup_steps = 20

  # Eval 4 x 16 sequences every 10 steps; success below 0.5 nats per token
  # (the open llama31_8b MLPerf rule wants an eval value < 1.0).
  config.eval_interval = 10
  config.eval_steps = 4
  config.eval_batch_size = 16
  config.target_eval_loss = 0.5

  config.log_period = 10

  config.enable_mllog = True
  config.submission_division = "open"

  return config
