r"""Prints a config's parameter counts from its shapes; allocates nothing.

Runbook:

  tools/bazel run //tools:param_count -- \
      --config=maxtext/configs/deepseekv3_671b.py

Prints the parameters per part of the model, the total, and the parameters
one token uses (routed experts: num_experts_per_token of num_experts), with
and without the input embedding table (see `param_count_lib`).
"""

from absl import app
from ml_collections import config_flags

from maxtext.config import config_lib
from tools import command_line
from tools import param_count_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file (a module with get_config()).",
    lock_config=True,
)


def main(argv):
  command_line.check(argv, _CONFIG)
  config = _CONFIG.value
  with command_line.user_errors("param_count", (TypeError, ValueError)):
    config_lib.validate(config)
  counts = param_count_lib.count(config)
  print(
      f"param_count: {config.num_layers} layers, emb {config.emb_dim}, "
      f"{config.attention_type} attention, {config.num_experts} routed "
      f"experts, vocab {config.vocab_size}"
  )
  print(param_count_lib.report(counts, config))


if __name__ == "__main__":
  app.run(main)
