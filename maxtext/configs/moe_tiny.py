"""A tiny mixture-of-experts model that learns synthetic data on the CPU.

`default.py` with its MLPs made mixture-of-experts layers: the first of the
two layers stays dense, the second routes each token to 2 of 4 experts
(softmax router, Switch load-balancing loss) beside one shared expert. It
trains to the same eval-loss target as `default.py` in a few dozen steps:

  bazel run //maxtext:train_main -- \
      --config=maxtext/configs/moe_tiny.py
"""

import ml_collections

from maxtext.configs import default


def get_config() -> ml_collections.ConfigDict:
  """Returns the tiny MoE configuration: default.py with the overrides below."""
  config = default.get_config()

  # Layer 0 dense, layer 1 MoE: both parameter stacks are exercised.
  config.num_experts = 4
  config.num_experts_per_token = 2
  config.num_shared_experts = 1
  config.num_dense_layers = 1
  # Experts a quarter of mlp_dim wide: 2 routed + 1 shared expert per token
  # cost less than the dense MLP.
  config.moe_mlp_dim = 128
  config.router_score = "softmax"
  config.load_balance_loss = "switch"
  config.load_balance_loss_weight = 0.01
  # No token is dropped (each expert takes what it is sent).
  config.capacity_factor = 0.0
  return config
