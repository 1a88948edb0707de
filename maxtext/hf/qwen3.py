"""Hugging Face Qwen3 (Qwen3ForCausalLM, Qwen3MoeForCausalLM) <-> the model.

Config: `config_fields(hf_config)` gives the project's model fields from a
Qwen3 or Qwen3-MoE config.json: grouped-query attention with an RMSNorm
over each query and key head (`qk_norm`; Qwen3's norms scale by w, not
1 + w), no biases, `head_dim` of its own (not hidden_size / heads), tied
embeddings where the config says; Qwen3-MoE's softmax router over
`num_experts`, its top `num_experts_per_tok` renormalised when
`norm_topk_prob` (`router_norm_topk`), no shared expert, and the dense
layers of `mlp_only_layers` when they are the first n layers
(`num_dense_layers`). `hf_config(config)` is the reverse, from the same
tables (`_FIELDS`, `_MOE_FIELDS`, `_REQUIRED`, `_FIXED`); an option either
side lacks is refused with one line naming the field.

Tensors (`tensors`, one table for both directions), Hugging Face's
`nn.Linear` [out, in] to the project's [in, out] (E hidden, H heads, K kv
heads, D head_dim, F the expert width, X experts):

  model.layers.N.self_attn.q_proj/k_proj/v_proj/o_proj  as Llama's (llama.py)
  model.layers.N.self_attn.q_norm.weight   [D]      q_norm   [D]
  model.layers.N.self_attn.k_norm.weight   [D]      k_norm   [D]
  model.layers.N.mlp.gate_proj/up_proj/down_proj (dense layers) as Llama's
  model.layers.N.mlp.gate.weight           [X, E]   router   [E, X]
  model.layers.N.mlp.experts.J.gate_proj/up_proj.weight [F, E]
                                                    w_gate / w_up [X, E, F]
  model.layers.N.mlp.experts.J.down_proj.weight [E, F]  w_down [X, F, E]
  model.embed_tokens, model.norm, lm_head, the layer norms  as Llama's

Qwen3 rotates halves, as Llama does: no permutation.
"""

from collections.abc import Iterator, Mapping
from typing import Any

from maxtext.hf import llama
from maxtext.model import model_config

ARCHITECTURE = "Qwen3ForCausalLM"
MOE_ARCHITECTURE = "Qwen3MoeForCausalLM"
ARCHITECTURES = (ARCHITECTURE, MOE_ARCHITECTURE)
UnsupportedError = llama.UnsupportedError
Tensor = llama.Tensor

_NEEDED = llama.NEEDED  # A key without a default: import needs it.
# config.json keys that must hold one value (the model implements only it):
# (key, the value, its default when absent). Export writes these values.
_REQUIRED = (
    ("attention_bias", False, False),
    ("hidden_act", "silu", "silu"),
    ("use_sliding_window", False, False),
)
# Qwen3-MoE only: every layer past the dense ones is sparse.
_MOE_REQUIRED = (("decoder_sparse_step", 1, 1),)
# config.json key <-> project field: (key, field, type, default when the
# key is absent or null). Import reads them, export writes them.
# The shape's keys, shared with the Qwen3.5 layout (`maxtext.hf.qwen35`).
SHAPE_FIELDS = (
    ("vocab_size", "vocab_size", int, _NEEDED),
    ("hidden_size", "emb_dim", int, _NEEDED),
    ("num_hidden_layers", "num_layers", int, _NEEDED),
    ("num_attention_heads", "num_heads", int, _NEEDED),
    ("num_key_value_heads", "num_kv_heads", int, _NEEDED),
    ("head_dim", "head_dim", int, _NEEDED),
)
_FIELDS = SHAPE_FIELDS + (
    ("intermediate_size", "mlp_dim", int, _NEEDED),
    ("rms_norm_eps", "norm_epsilon", float, 1e-6),
    ("tie_word_embeddings", "tie_word_embeddings", bool, False),
)
_MOE_FIELDS = (
    ("num_experts", "num_experts", int, _NEEDED),
    ("num_experts_per_tok", "num_experts_per_token", int, _NEEDED),
    ("moe_intermediate_size", "moe_mlp_dim", int, _NEEDED),
    ("norm_topk_prob", "router_norm_topk", bool, False),
)
# Project fields every Qwen3 model has: import sets them, export refuses a
# config with another value (naming the field).
_FIXED = {
    "attention_type": "gqa",
    "qk_norm": True,
    "rope_scaling": "none",
}
_MOE_FIXED = {
    "router_score": "softmax",
    "router_bias": False,
    "num_shared_experts": 0,
    "num_expert_groups": 1,
    "routed_scaling_factor": 1.0,
    # Qwen3-MoE drops no token.
    "capacity_factor": 0.0,
}
# Training sequences up to the model's context, at most this many tokens.
_MAX_SEQUENCE = 8192


def _architecture(hf: Mapping[str, Any], source: str) -> str:
  architectures = hf.get("architectures") or [hf.get("model_type")]
  for name in architectures:
    if name in ARCHITECTURES:
      return name
  raise UnsupportedError(
      f"{source}: architecture {architectures[0]!r} is not supported "
      f"(supported: {', '.join(ARCHITECTURES)})"
  )


def _dense_layers(hf: Mapping[str, Any], source: str) -> int:
  """`num_dense_layers` of Qwen3-MoE's `mlp_only_layers`: it must list the
  first n layers (the model keeps its dense layers in front)."""
  layers = sorted(int(i) for i in hf.get("mlp_only_layers") or [])
  if layers != list(range(len(layers))):
    raise UnsupportedError(
        f"{source}: mlp_only_layers={layers!r} is not supported (only the "
        "first n layers, [0, ..., n-1], may be dense)"
    )
  return len(layers)


def config_fields(hf: Mapping[str, Any], source: str) -> dict[str, Any]:
  """The project's model fields of a Qwen3 or Qwen3-MoE config.json.

  Args:
    hf: the parsed config.json.
    source: its path, named in errors.

  Raises:
    UnsupportedError: an option the model lacks; one line naming it.
    KeyError: a field the conversion needs is missing.
  """
  moe = _architecture(hf, source) == MOE_ARCHITECTURE
  for key, wanted, default in _REQUIRED + (_MOE_REQUIRED if moe else ()):
    llama.require(hf, source, key, wanted, default)
  kinds = sorted(set(hf.get("layer_types") or ["full_attention"]))
  if kinds != ["full_attention"]:
    raise UnsupportedError(
        f"{source}: layer_types={kinds!r} is not supported (only "
        "'full_attention')"
    )
  theta, scaling = llama.rope_config(hf)
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind != "default":
    raise UnsupportedError(
        f"{source}: rope_type {kind!r} is not supported (only 'default')"
    )
  fields = llama.read_fields(hf, _FIELDS)
  fields.update(_FIXED)
  fields.update(
      rope_theta=theta,
      max_sequence_length=min(
          int(hf.get("max_position_embeddings", 4096)), _MAX_SEQUENCE
      ),
  )
  if moe:
    if hf.get("num_experts") is None and "num_local_experts" in hf:
      # transformers 5 writes the expert count under this name; the
      # published config.json files say num_experts.
      hf = {**hf, "num_experts": hf["num_local_experts"]}
    fields.update(llama.read_fields(hf, _MOE_FIELDS))
    if not fields["num_experts"]:
      raise UnsupportedError(
          f"{source}: num_experts=0 is not supported in a "
          f"{MOE_ARCHITECTURE} (a dense model is a {ARCHITECTURE})"
      )
    fields.update(_MOE_FIXED)
    fields["num_dense_layers"] = _dense_layers(hf, source)
  return fields


def check_exportable(config: model_config.ModelConfig) -> None:
  """Raises UnsupportedError (one line naming the field) unless a Qwen3
  (dense) or Qwen3-MoE model can hold the model `config`."""
  fixed = dict(_FIXED)
  if config.num_experts:
    fixed.update(_MOE_FIXED)
  name = MOE_ARCHITECTURE if config.num_experts else ARCHITECTURE
  llama.check_fixed(config, fixed, name)


def hf_config(config: model_config.ModelConfig, dtype: str) -> dict[str, Any]:
  """A Qwen3 (num_experts 0) or Qwen3-MoE config.json for the project's
  `config` with weights in `dtype`: what `config_fields` reads back as the
  same fields.

  Raises:
    UnsupportedError: `check_exportable`'s refusal.
  """
  check_exportable(config)
  rope = {"rope_type": "default", "rope_theta": float(config.rope_theta)}
  moe = bool(config.num_experts)
  document = {
      "architectures": [MOE_ARCHITECTURE if moe else ARCHITECTURE],
      "model_type": "qwen3_moe" if moe else "qwen3",
      **llama.written_fields(config, _FIELDS),
      **{key: wanted for key, wanted, _ in _REQUIRED},
      "max_position_embeddings": config.max_sequence_length,
      # Both layouts: older transformers read rope_theta and rope_scaling.
      "rope_theta": float(config.rope_theta),
      "rope_scaling": None,
      "rope_parameters": rope,
      "torch_dtype": dtype,
      "dtype": dtype,
  }
  if moe:
    document.update(llama.written_fields(config, _MOE_FIELDS))
    document.update({key: wanted for key, wanted, _ in _MOE_REQUIRED})
    document["mlp_only_layers"] = list(range(config.num_dense_layers))
  return document


_LINEAR = llama.LINEAR
_ATTENTION = {
    **{
        name: llama.LAYER_TENSORS[name]
        for name in ("attn_norm", "mlp_norm", "wq", "wk", "wv", "wo")
    },
    "q_norm": ("self_attn.q_norm.weight", llama.SAME),
    "k_norm": ("self_attn.k_norm.weight", llama.SAME),
}
_DENSE_MLP = {
    name: llama.LAYER_TENSORS[name] for name in ("w_gate", "w_up", "w_down")
}
_ROUTER = {"router": ("mlp.gate.weight", _LINEAR)}
_EXPERTS = {
    "w_gate": "gate_proj.weight",
    "w_up": "up_proj.weight",
    "w_down": "down_proj.weight",
}


def tensors(
    params: Mapping[str, Any], config: model_config.ModelConfig
) -> Iterator[Tensor]:
  """Every Hugging Face tensor of the model `params` (a pytree of arrays or
  shapes from `transformer.init_params`) for `config`, in file order."""
  outer = llama.OUTER_TENSORS
  yield Tensor(
      outer["embedding"][0], ("embedding",), None, outer["embedding"][1]
  )
  dense = config.num_dense_layers if config.num_experts else config.num_layers
  stacks = (
      ("layers", range(dense), {**_ATTENTION, **_DENSE_MLP}),
      (
          "moe_layers",
          range(dense, config.num_layers),
          {**_ATTENTION, **_ROUTER},
      ),
  )
  yield from llama.stacked_tensors(
      params, stacks, _EXPERTS, config.num_experts, "Qwen3"
  )
  for name in ("final_norm", "unembedding"):
    if name in params:
      yield Tensor(outer[name][0], (name,), None, outer[name][1])
