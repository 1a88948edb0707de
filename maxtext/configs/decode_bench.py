"""The model `//tools/benchmarks:decode_bench` generates with on the CPU.

`default.py` with a model of about 19M parameters (6 layers of width 384,
6 query heads sharing 2 key/value heads of 64, MLP 1536, a vocabulary of
8192) that sees 512 positions: long enough that a windowed sampler's
full-window pass per token and a cache's one-token step differ as they do
for real models.

  tools/bazel run //tools/benchmarks:decode_bench
"""

import ml_collections

from maxtext.configs import default


def get_config() -> ml_collections.ConfigDict:
  """Returns default.py with the benchmark's model."""
  config = default.get_config()
  config.vocab_size = 8192
  config.emb_dim = 384
  config.num_layers = 6
  config.num_heads = 6
  config.num_kv_heads = 2
  config.head_dim = 64
  config.mlp_dim = 1536
  config.max_sequence_length = 512
  return config
