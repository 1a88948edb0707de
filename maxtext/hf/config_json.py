"""The JSON types of the config.json fields the conversions read.

A Hugging Face config.json is checked here before any field is used, so a
list where a number belongs is one line naming the field, not a traceback
from deep inside a conversion. `null` is accepted everywhere: the
conversions treat it as absent (and say so when the field is needed).
"""

from typing import Any, Mapping

_INTEGER = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "num_experts_per_tok",
    "n_shared_experts",
    "first_k_dense_replace",
    "moe_intermediate_size",
    "n_group",
    "topk_group",
    "num_nextn_predict_layers",
    "moe_layer_freq",
    "num_experts",
    "shared_expert_intermediate_size",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "full_attention_interval",
)
_NUMBER = ("rope_theta", "rms_norm_eps", "routed_scaling_factor")
_BOOLEAN = (
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "norm_topk_prob",
    "rope_interleave",
)
_OBJECT = (
    "rope_scaling",
    "rope_parameters",
    "quantization_config",
    "text_config",
)
_STRING = ("hidden_act", "model_type", "scoring_func", "topk_method")


def _kind_of(value: Any) -> str:
  """The JSON type of a parsed value, as the messages name it."""
  if isinstance(value, bool):
    return "boolean"
  if isinstance(value, int):
    return "integer"
  if isinstance(value, float):
    return "number"
  if isinstance(value, str):
    return "string"
  if isinstance(value, list):
    return "list"
  if isinstance(value, dict):
    return "object"
  return type(value).__name__


def check(hf_config: Mapping[str, Any], source: str) -> None:
  """Raises ValueError naming the first field of `hf_config` of a wrong type.

  Args:
    hf_config: the parsed config.json (an object).
    source: its path, named in the message.
  """
  wanted = {}
  wanted.update({key: ("integer",) for key in _INTEGER})
  wanted.update({key: ("integer", "number") for key in _NUMBER})
  wanted.update({key: ("boolean",) for key in _BOOLEAN})
  wanted.update({key: ("object",) for key in _OBJECT})
  wanted.update({key: ("string",) for key in _STRING})
  for key, kinds in wanted.items():
    value = hf_config.get(key)
    if value is None:
      continue
    kind = _kind_of(value)
    if kind not in kinds:
      wanted = " or ".join(
          f"{'an' if k[0] in 'aeiou' else 'a'} {k}" for k in kinds
      )
      raise ValueError(
          f"{source}: {key} is a {kind} ({value!r:.40}), not {wanted}"
      )
    if kind == "integer" and value < 0:
      raise ValueError(f"{source}: {key}={value} is negative")
  architectures = hf_config.get("architectures")
  if architectures is not None and not (
      isinstance(architectures, list)
      and all(isinstance(a, str) for a in architectures)
  ):
    raise ValueError(
        f"{source}: architectures is not a list of names "
        f"({architectures!r:.40})"
    )
