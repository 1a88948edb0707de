"""Supervised fine-tuning (SFT) on chat examples: the tiny demonstration.

A tiny Llama-shaped model fine-tuned on the chat examples shipped in
`configs/data/sft_tiny/` (additions, words spelt backwards, two-turn sums),
rendered with the chat template of the tokenizer beside them, the loss on the
assistant's tokens only, the held-out examples' mean loss as the eval
(docs/sft.md). From random parameters:

  tools/bazel run //maxtext:train_main -- --config=maxtext/configs/sft_tiny.py

From an imported Hugging Face checkpoint of this shape (its own tokenizer
files, which the import copies beside it, render the examples):

  tools/bazel run //maxtext:train_main -- \\
      --config=maxtext/configs/sft_tiny.py \\
      --config.load_parameters_path=/ckpt/tiny --config.tokenizer_path=""
"""

import os
import tempfile

import ml_collections

from maxtext.configs import base

# The shipped examples and tokenizer (tokenizer.json, chat_template.jinja,
# tokenizer_config.json; train.jsonl, eval.jsonl).
DATA_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "sft_tiny"
)


def get_config() -> ml_collections.ConfigDict:
  """Returns the tiny SFT configuration: base.py with the overrides below."""
  config = base.get_config()
  config.workload = "sft"
  config.base_output_directory = os.path.join(
      tempfile.gettempdir(), "maxtext_runs"
  )
  config.run_name = "sft_tiny"

  # Chat examples, one padded row each; the longest renders to 67 tokens.
  config.dataset_type = "chat"
  config.train_data_path = os.path.join(DATA_DIR, "train.jsonl")
  config.eval_data_path = os.path.join(DATA_DIR, "eval.jsonl")
  config.tokenizer_path = DATA_DIR
  config.max_sequence_length = 96

  # A Llama-shaped model (what tools/import_checkpoint reads): the shipped
  # tokenizer's 384 ids, 2 layers of width 64, 4 query heads sharing 2
  # key/value heads.
  config.vocab_size = 384
  config.emb_dim = 64
  config.num_layers = 2
  config.num_heads = 4
  config.num_kv_heads = 2
  config.head_dim = 16
  config.mlp_dim = 192

  # 480 training examples: 8 per step, one epoch in 60 steps. The held-out
  # loss falls to about 2.4 by then and rises slowly after (overfitting).
  config.global_batch_size = 8
  config.steps = 60
  config.learning_rate = 3e-3
  config.warmup_steps = 5
  config.weight_decay = 0.0

  # The 48 held-out examples, each once per evaluation.
  config.eval_interval = 20
  config.eval_steps = 6
  config.eval_batch_size = 8
  config.checkpoint_period = 20
  config.log_period = 10
  return config
