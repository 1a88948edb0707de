"""The model's own config: `ModelConfig`, the fields the network reads, frozen.

The compiled programs that run the model outside the training step (the
cached decoder, the teacher-forced scorer, the windowed sampler, GRPO's
reference pass) take the config as a static argument: JAX keys their compile
cache on its hash and equality. A run's config holds every field of
`maxtext/configs/base.py` (its name, learning rate, paths ...); a model
config holds only the network's, so changing any other field compiles
nothing anew (`model_config_test`).

`ModelConfig` is the model's settings class
(`maxtext/core/component_config.py`): a frozen dataclass of the fields
`maxtext/model/` and `maxtext/generation/` read, named and defaulting as in
base.py, read as attributes (`config.num_layers`) like the run's config.
Its `validate` is the model's own check of the combinations it implements
(`check`; `of`, and so `transformer.init_params`, runs it); the fields'
types and ranges are `config_lib.validate`'s (it sits below).
"""

import dataclasses
from typing import Any

from maxtext.core import choices
from maxtext.core import component_config


@dataclasses.dataclass(frozen=True)
class ModelConfig(component_config.ComponentConfig):
  """The network's fields (`maxtext/configs/base.py` documents each)."""

  attention: str = "auto"
  attention_output_gate: bool = False
  attention_type: str = "gqa"
  capacity_factor: float = 0.0
  compute_dtype: str = "float32"
  emb_dim: int = 128
  expert_groups_per_token: int = 1
  full_attention_interval: int = 0
  head_dim: int = 32
  kv_lora_rank: int = 0
  linear_chunk_size: int = 64
  linear_conv_kernel_dim: int = 4
  linear_key_head_dim: int = 128
  linear_num_key_heads: int = 16
  linear_num_value_heads: int = 32
  linear_value_head_dim: int = 128
  load_balance_loss: str = "switch"
  load_balance_loss_weight: float = 0.01
  logits_dtype: str = "float32"
  loss_chunk_size: int = 0
  max_sequence_length: int = 64
  mlp_chunks: int = 1
  mlp_dim: int = 512
  moe_mlp_dim: int = 0
  norm_epsilon: float = 1e-05
  norm_zero_centered: bool = False
  num_dense_layers: int = 0
  num_expert_groups: int = 1
  num_experts: int = 0
  num_experts_per_token: int = 1
  num_heads: int = 4
  num_kv_heads: int = 4
  num_layers: int = 2
  num_shared_experts: int = 0
  packing: bool = False
  partial_rotary_factor: float = 1.0
  q_lora_rank: int = 0
  qk_nope_head_dim: int = 0
  qk_norm: bool = False
  qk_rope_head_dim: int = 0
  remat_policy: str = "none"
  rope_high_freq_factor: float = 4.0
  rope_low_freq_factor: float = 1.0
  rope_original_max_position: int = 8192
  rope_scaling: str = "none"
  rope_scaling_factor: float = 8.0
  rope_theta: float = 10000.0
  rope_yarn_beta_fast: float = 32.0
  rope_yarn_beta_slow: float = 1.0
  rope_yarn_mscale: float = 0.0
  rope_yarn_mscale_all_dim: float = 0.0
  routed_scaling_factor: float = 1.0
  router_bias: bool = False
  router_bias_update_rate: float = 0.0
  router_norm_topk: bool = False
  router_score: str = "softmax"
  shared_expert_gate: bool = False
  shared_expert_mlp_dim: int = 0
  tie_word_embeddings: bool = False
  v_head_dim: int = 0
  vocab_size: int = 256
  weight_dtype: str = "float32"

  def validate(self) -> None:
    """The model's check of its fields' combinations (`check`)."""
    check(self)


# Every field that maxtext/model/ and maxtext/generation/ read from a config
# (`model_config_test` checks this against their sources).
FIELDS = tuple(field.name for field in dataclasses.fields(ModelConfig))


def check(config: ModelConfig) -> None:
  """Refuses, in one line naming the field, an attention type or a
  combination of the Qwen3.5 fields (`transformer`'s docstring) the model
  does not implement.

  Args:
    config: the model's settings.

  Raises:
    ValueError: the first unsupported combination.
  """
  if config.attention_type not in choices.ATTENTION_TYPES:
    raise ValueError(
        f"config.attention_type={config.attention_type!r}: must be one of "
        f"{list(choices.ATTENTION_TYPES)}"
    )
  _check_layer_pattern(config)


def _check_layer_pattern(config: ModelConfig) -> None:
  """The Qwen3.5 fields' combinations (`check`)."""
  n = config.full_attention_interval
  if not isinstance(n, int) or n < 0:
    raise ValueError(
        f"config.full_attention_interval={n!r}: must be an int >= 0"
    )
  factor = config.partial_rotary_factor
  if config.attention_type != "gqa":
    for field, value in (
        ("attention_output_gate", config.attention_output_gate),
        ("full_attention_interval", config.full_attention_interval),
    ):
      if value:
        raise ValueError(
            f"config.{field}={value!r}: needs attention_type 'gqa', "
            f"got {config.attention_type!r}"
        )
    if factor != 1.0:
      raise ValueError(
          f"config.partial_rotary_factor={factor!r}: needs attention_type "
          f"'gqa', got {config.attention_type!r}"
      )
  elif not 0.0 < factor <= 1.0 or int(config.head_dim * factor) % 2:
    raise ValueError(
        f"config.partial_rotary_factor={factor!r}: must be in (0, 1] and "
        f"turn an even number of head_dim={config.head_dim} dimensions"
    )
  if config.shared_expert_gate and not config.num_shared_experts:
    raise ValueError(
        "config.shared_expert_gate=True: needs num_shared_experts > 0"
    )
  if not n:
    return
  if not config.num_experts:
    raise ValueError(
        f"config.full_attention_interval={n}: needs experts in every layer "
        "(num_experts > 0)"
    )
  if config.num_dense_layers:
    raise ValueError(
        f"config.num_dense_layers={config.num_dense_layers}: must be 0 with "
        f"full_attention_interval={n} (every layer has experts)"
    )
  if config.num_layers % n:
    raise ValueError(
        f"config.num_layers={config.num_layers}: must be a multiple of "
        f"full_attention_interval={n}"
    )
  if config.router_bias:
    raise ValueError(
        "config.router_bias=True: not supported with full_attention_interval"
        f"={n} (its statistics are kept for moe_layers alone)"
    )


def of(source: Any) -> ModelConfig:
  """The model config of `source`: its model fields (base.py's defaults for
  those it lacks), checked and frozen; `ModelConfig.from_config` reads
  them.

  Args:
    source: a run's config (ConfigDict, FrozenConfigDict or mapping), or a
      model config already (returned as it is).

  Returns:
    A ModelConfig: hashable, equal for any two configs whose model fields
    are equal.

  Raises:
    ValueError: as `check`.
  """
  if isinstance(source, ModelConfig):
    return source
  return ModelConfig.from_config(source)
