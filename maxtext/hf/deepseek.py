"""Hugging Face DeepSeek-V3 (DeepseekV3ForCausalLM) <-> this project's model.

Config: `config_fields(hf_config)` gives the project's model fields from a
DeepSeek-V3 config.json: multi-head latent attention (`attention_type`
"mla"), the first `first_k_dense_replace` layers dense
(`num_dense_layers`), the rest mixture-of-experts layers with shared
experts, the sigmoid router with its `e_score_correction_bias`
(`router_bias`), group-limited routing (`n_group`, `topk_group`),
`routed_scaling_factor`, and YaRN rotary scaling. Options the model lacks
are refused with one line naming the field. `hf_config(config)` is the
reverse, from the same tables (`_FIELDS`, `_YARN`, `_REQUIRED`, `_FIXED`);
a config DeepseekV3ForCausalLM cannot hold (another attention or router, a
token-dropping capacity factor, another rotary scaling) is refused with one
line naming the field (`check_exportable`).

Tensors (`tensors`, one table for both directions: each `Layout` converts to
the project's layout on import and back on export), Hugging Face's
`nn.Linear` [out, in] to the project's [in, out] (E hidden, H heads, N/R/D
the nope/rope/value head widths, Q q_lora_rank, C kv_lora_rank, F the expert
width, X experts). Layers below `num_dense_layers` go to the stack `layers`,
the rest to `moe_layers`:

  model.layers.N.input_layernorm / post_attention_layernorm
                                                attn_norm / mlp_norm [E]
  self_attn.q_a_proj            [Q, E]          wq_a     [E, Q]
  self_attn.q_a_layernorm       [Q]             q_norm   [Q]
  self_attn.q_b_proj            [H*(N+R), Q]    wq_b     [Q, H, N+R]  (*)
  self_attn.q_proj (Q = 0)      [H*(N+R), E]    wq       [E, H, N+R]  (*)
  self_attn.kv_a_proj_with_mqa  [C+R, E]        wkv_a    [E, C+R]     (*)
  self_attn.kv_a_layernorm      [C]             kv_norm  [C]
  self_attn.kv_b_proj           [H*(N+D), C]    wkv_b    [C, H, N+D]
  self_attn.o_proj              [E, H*D]        wo       [H, D, E]
  mlp.gate_proj/up_proj/down_proj (dense layers) w_gate / w_up / w_down
  mlp.gate.weight               [X, E]          router   [E, X]
  mlp.gate.e_score_correction_bias [X]          router_bias [X]
  mlp.experts.J.gate_proj/up_proj [F, E]        w_gate / w_up [X, E, F]
  mlp.experts.J.down_proj       [E, F]          w_down   [X, F, E]
  mlp.shared_experts.*          as a dense MLP  shared_w_gate/_up/_down
  model.embed_tokens, model.norm, lm_head       as Llama's (llama.py)

(*) The rotary columns. DeepSeek-V3 lays each rotary vector out in
interleaved pairs (x0, x1), (x2, x3), ... (config.json's `rope_interleave`,
true unless stated), this project in halves (x_i with x_{i + R/2},
`maxtext.model.layers.rope`). Reordering the rotary output features of
the query and key projections to [x0, x2, x4, ..., x1, x3, ...] turns one
layout into the other; the same reordering of queries and keys leaves
every attention score unchanged, so the model runs the imported weights
as they are.

The multi-token-prediction layers of the published checkpoint
(`num_nextn_predict_layers`, stored as `model.layers.{num_hidden_layers+}`)
have no counterpart in the model: they are not read (`notes` says so).
FP8 weights are dequantised when read (`maxtext.hf.fp8`).
"""

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from maxtext.hf import llama
from maxtext.model import model_config

ARCHITECTURE = "DeepseekV3ForCausalLM"
UnsupportedError = llama.UnsupportedError
Layout = llama.Layout
Tensor = llama.Tensor


# config.json keys that must hold one value (the model implements only it):
# (key, the value, its default when absent). Export writes these values.
_REQUIRED = (
    ("attention_bias", False, False),
    ("hidden_act", "silu", "silu"),
    ("scoring_func", "sigmoid", "sigmoid"),
    ("topk_method", "noaux_tc", "noaux_tc"),
    ("norm_topk_prob", True, True),
    ("moe_layer_freq", 1, 1),
)
# Project fields every DeepSeek-V3 model has: import sets them, export
# refuses a config with another value (naming the field).
_FIXED = {
    "attention_type": "mla",
    "router_score": "sigmoid",
    "router_bias": True,
    "capacity_factor": 0.0,
}
_NEEDED = llama.NEEDED  # A key without a default: import needs it.
# config.json key <-> project field, one for one: (key, field, type, the
# default when the key is absent or null). Import reads them, export writes
# them.
_FIELDS = (
    ("vocab_size", "vocab_size", int, _NEEDED),
    ("hidden_size", "emb_dim", int, _NEEDED),
    ("num_hidden_layers", "num_layers", int, _NEEDED),
    ("num_attention_heads", "num_heads", int, _NEEDED),
    ("q_lora_rank", "q_lora_rank", int, 0),
    ("kv_lora_rank", "kv_lora_rank", int, _NEEDED),
    ("qk_nope_head_dim", "qk_nope_head_dim", int, _NEEDED),
    ("qk_rope_head_dim", "qk_rope_head_dim", int, _NEEDED),
    ("v_head_dim", "v_head_dim", int, _NEEDED),
    ("intermediate_size", "mlp_dim", int, _NEEDED),
    ("n_routed_experts", "num_experts", int, _NEEDED),
    ("num_experts_per_tok", "num_experts_per_token", int, _NEEDED),
    ("n_shared_experts", "num_shared_experts", int, 0),
    ("first_k_dense_replace", "num_dense_layers", int, 0),
    ("moe_intermediate_size", "moe_mlp_dim", int, _NEEDED),
    ("n_group", "num_expert_groups", int, 1),
    ("topk_group", "expert_groups_per_token", int, 1),
    ("routed_scaling_factor", "routed_scaling_factor", float, 1.0),
    ("rms_norm_eps", "norm_epsilon", float, 1e-6),
    ("tie_word_embeddings", "tie_word_embeddings", bool, False),
)
# YaRN's keys in rope_scaling / rope_parameters <-> project fields, as
# _FIELDS.
_YARN = (
    ("factor", "rope_scaling_factor", float, _NEEDED),
    (
        "original_max_position_embeddings",
        "rope_original_max_position",
        int,
        _NEEDED,
    ),
    ("beta_fast", "rope_yarn_beta_fast", float, 32.0),
    ("beta_slow", "rope_yarn_beta_slow", float, 1.0),
    ("mscale", "rope_yarn_mscale", float, 0.0),
    ("mscale_all_dim", "rope_yarn_mscale_all_dim", float, 0.0),
)
# Written as null when 0, as DeepSeek's configs state "no query bottleneck".
_NULL_WHEN_ZERO = ("q_lora_rank",)
# Training sequences up to the model's context, at most this many tokens.
_MAX_SEQUENCE = 8192


def _written(config: model_config.ModelConfig, table) -> dict[str, Any]:
  """The config.json keys of `table` from the project's `config`."""
  document = llama.written_fields(config, table)
  for key in _NULL_WHEN_ZERO:
    if key in document and not document[key]:
      document[key] = None
  return document


def config_fields(hf: Mapping[str, Any], source: str) -> dict[str, Any]:
  """The project's model fields of a DeepSeek-V3 config.json.

  Args:
    hf: the parsed config.json.
    source: its path, named in errors.

  Raises:
    UnsupportedError: an option the model lacks; one line naming it.
    KeyError: a field the conversion needs is missing.
  """
  for key, wanted, default in _REQUIRED:
    llama.require(hf, source, key, wanted, default)
  if not hf.get("n_routed_experts"):
    raise UnsupportedError(
        f"{source}: n_routed_experts={hf.get('n_routed_experts')!r}: only "
        "mixture-of-experts DeepSeek-V3 models are supported"
    )
  quantization = hf.get("quantization_config") or {}
  if quantization:
    llama.require(
        quantization,
        source + " quantization_config",
        "quant_method",
        "fp8",
        "fp8",
    )
    llama.require(
        quantization, source + " quantization_config", "fmt", "e4m3", "e4m3"
    )
  theta, scaling = llama.rope_config(hf)
  fields = llama.read_fields(hf, _FIELDS)
  fields.update(_FIXED)
  fields.update(
      # Unused by MLA; set so the grouped-query fields stay consistent.
      num_kv_heads=fields["num_heads"],
      head_dim=fields["qk_nope_head_dim"] + fields["qk_rope_head_dim"],
      rope_theta=theta,
      max_sequence_length=min(
          int(hf.get("max_position_embeddings", 4096)), _MAX_SEQUENCE
      ),
      rope_scaling="none",
  )
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind == "yarn":
    for key in ("attention_factor",):
      if scaling.get(key) is not None:
        raise UnsupportedError(
            f"{source}: rope {key}={scaling[key]!r} is not supported"
        )
    if scaling.get("truncate", True) is not True:
      raise UnsupportedError(
          f"{source}: rope truncate={scaling['truncate']!r} is not supported"
      )
    fields.update(rope_scaling="yarn", **llama.read_fields(scaling, _YARN))
  elif kind != "default":
    raise UnsupportedError(
        f"{source}: rope_type {kind!r} is not supported (default or yarn)"
    )
  return fields


def check_exportable(config: model_config.ModelConfig) -> None:
  """Raises UnsupportedError (one line naming the field) unless
  DeepseekV3ForCausalLM can hold the model `config`."""
  llama.check_fixed(config, _FIXED, ARCHITECTURE)
  if not config.num_experts:
    raise UnsupportedError(
        "config.num_experts=0: a DeepseekV3ForCausalLM has routed experts"
    )
  if config.num_dense_layers > config.num_layers:
    raise UnsupportedError(
        f"config.num_dense_layers={config.num_dense_layers}: more than "
        f"num_layers={config.num_layers}"
    )
  if config.rope_scaling not in ("none", "yarn"):
    raise UnsupportedError(
        f"config.rope_scaling={config.rope_scaling!r}: a "
        "DeepseekV3ForCausalLM has no such rotary scaling (none or yarn)"
    )


def hf_config(config: model_config.ModelConfig, dtype: str) -> dict[str, Any]:
  """A DeepSeek-V3 config.json for the project's `config` with weights in
  `dtype`: what `config_fields` reads back as the same fields.

  Raises:
    UnsupportedError: `check_exportable`'s refusal.
  """
  check_exportable(config)
  rope = {"rope_type": "default", "rope_theta": float(config.rope_theta)}
  if config.rope_scaling == "yarn":
    rope.update(rope_type="yarn", **_written(config, _YARN))
  document = {
      "architectures": [ARCHITECTURE],
      "model_type": "deepseek_v3",
      **_written(config, _FIELDS),
      **{key: wanted for key, wanted, _ in _REQUIRED},
      "num_key_value_heads": config.num_heads,
      "max_position_embeddings": config.max_sequence_length,
      # Both layouts: older transformers read rope_theta and rope_scaling.
      "rope_theta": float(config.rope_theta),
      "rope_scaling": rope if config.rope_scaling == "yarn" else None,
      "rope_parameters": rope,
      # The tensors are written in DeepSeek's interleaved rotary layout.
      "rope_interleave": True,
      # The model has no multi-token-prediction layers to write.
      "num_nextn_predict_layers": 0,
      "torch_dtype": dtype,
      "dtype": dtype,
  }
  return document


def notes(hf: Mapping[str, Any]) -> list[str]:
  """Warnings about what the import leaves out, one line each."""
  extra = int(hf.get("num_nextn_predict_layers") or 0)
  if not extra:
    return []
  first = int(hf["num_hidden_layers"])
  return [
      f"warning: the {extra} multi-token-prediction layer(s) "
      f"(model.layers.{first}..{first + extra - 1}) are not imported: the "
      "model has no multi-token-prediction head"
  ]


def interleave_permutation(rope_dim: int) -> np.ndarray:
  """Indices taking an interleaved rotary vector (pairs (2i, 2i+1)) to
  halves (pairs (i, i + R/2)): [0, 2, 4, ..., 1, 3, 5, ...]."""
  return np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])


def _rope_columns(
    array: np.ndarray, nope: int, order: np.ndarray
) -> np.ndarray:
  """`array` [..., nope + R] with its last R features in `order`."""
  out = np.array(array)
  out[..., nope:] = out[..., nope:][..., order]
  return out


def _permuted(base: Layout, nope: int, rope: int, interleaved: bool) -> Layout:
  """`base` with the rotary features (the last `rope` of each head's
  `nope + rope`, the project side's last axis) reordered from
  interleaved pairs to halves on import, back on export."""
  if not interleaved:
    return base
  order = interleave_permutation(rope)
  inverse = np.argsort(order)
  return Layout(
      base.hf_shape,
      lambda a, s: _rope_columns(base.to_project(a, s), nope, order),
      lambda a: base.to_hf(_rope_columns(a, nope, inverse)),
  )


_SAME, _LINEAR = llama.SAME, llama.LINEAR
_HEADS_OUT, _HEADS_IN = llama.HEADS_OUT, llama.HEADS_IN


def _attention_tensors(
    config: model_config.ModelConfig, interleaved: bool
) -> dict[str, tuple]:
  """Attention and norm parameters: name -> (tensor name suffix, layout)."""
  nope, rope = config.qk_nope_head_dim, config.qk_rope_head_dim
  names = {
      "attn_norm": ("input_layernorm.weight", _SAME),
      "mlp_norm": ("post_attention_layernorm.weight", _SAME),
      "wkv_a": (
          "self_attn.kv_a_proj_with_mqa.weight",
          # The k_rope columns follow the C latent columns: the last R.
          _permuted(_LINEAR, config.kv_lora_rank, rope, interleaved),
      ),
      "kv_norm": ("self_attn.kv_a_layernorm.weight", _SAME),
      "wkv_b": ("self_attn.kv_b_proj.weight", _HEADS_OUT),
      "wo": ("self_attn.o_proj.weight", _HEADS_IN),
  }
  if config.q_lora_rank:
    names["wq_a"] = ("self_attn.q_a_proj.weight", _LINEAR)
    names["q_norm"] = ("self_attn.q_a_layernorm.weight", _SAME)
    names["wq_b"] = (
        "self_attn.q_b_proj.weight",
        _permuted(_HEADS_OUT, nope, rope, interleaved),
    )
  else:
    names["wq"] = (
        "self_attn.q_proj.weight",
        _permuted(_HEADS_OUT, nope, rope, interleaved),
    )
  return names


_DENSE_MLP = {
    "w_gate": ("mlp.gate_proj.weight", _LINEAR),
    "w_up": ("mlp.up_proj.weight", _LINEAR),
    "w_down": ("mlp.down_proj.weight", _LINEAR),
}
_MOE = {
    "router": ("mlp.gate.weight", _LINEAR),
    "router_bias": ("mlp.gate.e_score_correction_bias", _SAME),
    "shared_w_gate": ("mlp.shared_experts.gate_proj.weight", _LINEAR),
    "shared_w_up": ("mlp.shared_experts.up_proj.weight", _LINEAR),
    "shared_w_down": ("mlp.shared_experts.down_proj.weight", _LINEAR),
}
_EXPERTS = {
    "w_gate": "gate_proj.weight",
    "w_up": "up_proj.weight",
    "w_down": "down_proj.weight",
}


def tensors(
    params: Mapping[str, Any],
    config: model_config.ModelConfig,
    hf: Mapping[str, Any],
) -> Iterator[Tensor]:
  """Every Hugging Face tensor of the model `params` (a pytree of arrays or
  shapes from `transformer.init_params`) for `config`, read from a
  checkpoint whose config.json is `hf` (`rope_interleave`)."""
  interleaved = bool(hf.get("rope_interleave", True))
  attention = _attention_tensors(config, interleaved)
  outer = llama.OUTER_TENSORS
  yield Tensor(
      outer["embedding"][0], ("embedding",), None, outer["embedding"][1]
  )
  dense = config.num_dense_layers
  stacks = (
      ("layers", range(dense), {**attention, **_DENSE_MLP}),
      ("moe_layers", range(dense, config.num_layers), {**attention, **_MOE}),
  )
  yield from llama.stacked_tensors(
      params, stacks, _EXPERTS, config.num_experts, "DeepSeek-V3"
  )
  for name in ("final_norm", "unembedding"):
    if name in params:
      yield Tensor(outer[name][0], (name,), None, outer[name][1])
