"""Hugging Face Qwen3.5-MoE (Qwen3_5MoeForCausalLM) <-> the hybrid model.

Followed: transformers 5.24.0, `models/qwen3_5_moe/` (configuration and
modeling). Two checkpoint layouts are read: `Qwen3_5MoeForCausalLM` (the
text model: `model.layers.N...`, config.json holds the text fields) and
`Qwen3_5MoeForConditionalGeneration` (the published one: the text model
under `model.language_model.`, its fields under config.json's
`text_config`, beside a vision tower `model.visual.*` and the
multi-token-prediction layers `mtp.*`, which the model has no use for: they
are not read, and `notes` says so in one line each). Export writes the
`Qwen3_5MoeForCausalLM` layout.

Config (`config_fields`, `hf_config`; tables `_FIELDS`, `_REQUIRED`,
`_FIXED`): every layer has the MoE layer (softmax router, top
`num_experts_per_tok` renormalised to sum to 1, one shared expert of width
`shared_expert_intermediate_size` gated by sigmoid(x . shared_expert_gate));
`layer_types` must be the pattern of one `full_attention_interval` n (layer
i full attention iff (i + 1) % n == 0, the rest `linear_attention`, Gated
DeltaNet with the `linear_*` fields); all norms but the DeltaNet output
norm are zero-centred (1 + w); attention is gated (`attention_output_gate`)
with per-head q/k norms and rotary embeddings on the first
`partial_rotary_factor` of each head. `rope_parameters`' `mrope_section` and
`mrope_interleaved` (the vision model's 3-D positions) are accepted: with
text positions the three position rows are equal and the rotary is the 1-D
partial rotary (`qwen35_logits_test` checks it against transformers').

Tensors (`tensors`), Hugging Face's `nn.Linear` [out, in] to the project's
[in, out] (E hidden, H heads, K kv heads, D head_dim, Hk/Hv the DeltaNet
key/value heads of width Dk/Dv, kd = Hk Dk, vd = Hv Dv, C the convolution
kernel, X experts, F the expert width, S the shared expert width), layer N
of the prefix `model.layers.N.` (`model.language_model.layers.N.`):

  full-attention layers -> the stack moe_layers:
  self_attn.q_proj.weight [H*2D, E], per head D query rows then D gate rows
                                   wq [E, H, D] and wq_gate [E, H, D]
  self_attn.k_proj/v_proj/o_proj, q_norm, k_norm   as Qwen3's (qwen3.py)
  linear-attention layers -> the stack linear_layers:
  linear_attn.in_proj_qkv.weight [2 kd + vd, E]   wq [E, Hk, Dk], wk, wv
  linear_attn.conv1d.weight [2 kd + vd, 1, C]     conv_q [C, Hk, Dk], ...
  linear_attn.in_proj_z.weight [vd, E]            wz [E, Hv, Dv]
  linear_attn.in_proj_a/in_proj_b.weight [Hv, E]  wa / wb [E, Hv]
  linear_attn.A_log, dt_bias [Hv]                 a_log, dt_bias
  linear_attn.norm.weight [Dv]                    out_norm (plain scale)
  linear_attn.out_proj.weight [E, vd]             wo [Hv, Dv, E]
  every layer:
  input_layernorm / post_attention_layernorm      attn_norm / mlp_norm
  mlp.gate.weight [X, E]                          router [E, X]
  mlp.experts.J.gate_proj/up_proj/down_proj       w_gate / w_up / w_down
  mlp.shared_expert.gate_proj/up_proj/down_proj   shared_w_gate/_up/_down
  mlp.shared_expert_gate.weight [1, E]            shared_gate [E]
  embed_tokens, norm, lm_head                     as Llama's (llama.py)

A tensor that is several parameters (q_proj, in_proj_qkv, conv1d) is one
`llama.Tensor` per parameter with the same name: import slices its part,
export joins the parts (`join_axis`).
"""

from collections.abc import Iterator, Mapping
from typing import Any

from maxtext.hf import config_json
from maxtext.hf import llama
from maxtext.hf import qwen3
from maxtext.model import model_config

ARCHITECTURE = "Qwen3_5MoeForCausalLM"
VLM_ARCHITECTURE = "Qwen3_5MoeForConditionalGeneration"
ARCHITECTURES = (ARCHITECTURE, VLM_ARCHITECTURE)
UnsupportedError = llama.UnsupportedError
Tensor = llama.Tensor

_NEEDED = llama.NEEDED
# config.json keys that must hold one value: (key, value, default).
_REQUIRED = (
    ("attention_bias", False, False),
    ("hidden_act", "silu", "silu"),
)
_FIELDS = qwen3.SHAPE_FIELDS + (
    ("rms_norm_eps", "norm_epsilon", float, 1e-6),
    ("tie_word_embeddings", "tie_word_embeddings", bool, False),
    ("num_experts", "num_experts", int, _NEEDED),
    ("num_experts_per_tok", "num_experts_per_token", int, _NEEDED),
    ("moe_intermediate_size", "moe_mlp_dim", int, _NEEDED),
    ("shared_expert_intermediate_size", "shared_expert_mlp_dim", int, _NEEDED),
    ("linear_num_key_heads", "linear_num_key_heads", int, _NEEDED),
    ("linear_num_value_heads", "linear_num_value_heads", int, _NEEDED),
    ("linear_key_head_dim", "linear_key_head_dim", int, _NEEDED),
    ("linear_value_head_dim", "linear_value_head_dim", int, _NEEDED),
    ("linear_conv_kernel_dim", "linear_conv_kernel_dim", int, _NEEDED),
)
# Project fields every Qwen3.5-MoE model has.
_FIXED = {
    "attention_type": "gqa",
    "qk_norm": True,
    "norm_zero_centered": True,
    "attention_output_gate": True,
    "rope_scaling": "none",
    "num_dense_layers": 0,
    "num_shared_experts": 1,
    "shared_expert_gate": True,
    "router_score": "softmax",
    "router_norm_topk": True,
    "router_bias": False,
    "num_expert_groups": 1,
    "routed_scaling_factor": 1.0,
    # Qwen3.5-MoE drops no token.
    "capacity_factor": 0.0,
}
_MAX_SEQUENCE = 8192
# The rotary fields of rope_parameters the import reads or accepts.
_ROPE_KEYS = {
    "rope_type",
    "rope_theta",
    "partial_rotary_factor",
    "mrope_section",
    "mrope_interleaved",
}


def _architecture(hf: Mapping[str, Any], source: str) -> str:
  for name in hf.get("architectures") or [hf.get("model_type")]:
    if name in ARCHITECTURES:
      return name
  raise UnsupportedError(
      f"{source}: architecture is not one of {', '.join(ARCHITECTURES)}"
  )


def text_config(hf: Mapping[str, Any], source: str) -> Mapping[str, Any]:
  """The text model's fields: config.json itself (Qwen3_5MoeForCausalLM)
  or its `text_config` (Qwen3_5MoeForConditionalGeneration)."""
  if _architecture(hf, source) == VLM_ARCHITECTURE:
    if not isinstance(hf.get("text_config"), Mapping):
      raise KeyError("text_config")
    config_json.check(hf["text_config"], f"{source} (text_config)")
    return hf["text_config"]
  return hf


def prefix(hf: Mapping[str, Any], source: str) -> str:
  """The text model's tensor name prefix in the checkpoint."""
  if _architecture(hf, source) == VLM_ARCHITECTURE:
    return "model.language_model."
  return "model."


def layer_types(interval: int, num_layers: int) -> list[str]:
  """transformers' layer_types of a `full_attention_interval`."""
  return [
      "full_attention" if (i + 1) % interval == 0 else "linear_attention"
      for i in range(num_layers)
  ]


def _interval(text: Mapping[str, Any], source: str) -> int:
  """The full_attention_interval whose pattern `layer_types` is."""
  num_layers = int(text["num_hidden_layers"])
  kinds = text.get("layer_types")
  if kinds is None:
    return int(text.get("full_attention_interval", 4))
  kinds = list(kinds)
  if "full_attention" in kinds:
    interval = kinds.index("full_attention") + 1
    if kinds == layer_types(interval, num_layers) and interval > 1:
      return interval
  raise UnsupportedError(
      f"{source}: layer_types={kinds!r} is not supported (only "
      "full_attention every n-th layer, n >= 2, the rest linear_attention, "
      "num_hidden_layers a multiple of n)"
  )


def config_fields(hf: Mapping[str, Any], source: str) -> dict[str, Any]:
  """The project's model fields of a Qwen3.5-MoE config.json.

  Raises:
    UnsupportedError: an option the model lacks; one line naming it.
    KeyError: a field the conversion needs is missing.
  """
  text = text_config(hf, source)
  for key, wanted, default in _REQUIRED:
    llama.require(text, source, key, wanted, default)
  rope = dict(text.get("rope_parameters") or {})
  unknown = sorted(set(rope) - _ROPE_KEYS)
  if unknown:
    raise UnsupportedError(
        f"{source}: rope_parameters.{unknown[0]} is not supported"
    )
  kind = rope.get("rope_type", "default")
  if kind != "default":
    raise UnsupportedError(
        f"{source}: rope_type {kind!r} is not supported (only 'default')"
    )
  fields = llama.read_fields(text, _FIELDS)
  fields.update(_FIXED)
  fields.update(
      mlp_dim=fields["moe_mlp_dim"],  # No dense MLP reads it.
      full_attention_interval=_interval(text, source),
      rope_theta=float(rope.get("rope_theta", 10000.0)),
      partial_rotary_factor=float(rope.get("partial_rotary_factor", 0.25)),
      max_sequence_length=min(
          int(text.get("max_position_embeddings", 4096)), _MAX_SEQUENCE
      ),
  )
  if hf.get("tie_word_embeddings") is not None:
    fields["tie_word_embeddings"] = bool(hf["tie_word_embeddings"])
  return fields


def notes(hf: Mapping[str, Any], names) -> list[str]:
  """One line for each part of the checkpoint the import leaves out: the
  vision tower and the multi-token-prediction layers."""
  lines = []
  for part, start, why in (
      ("vision tower", "model.visual.", "the model is text-only"),
      (
          "multi-token-prediction layers",
          "mtp.",
          "the model has no multi-token-prediction head",
      ),
  ):
    count = sum(name.startswith(start) for name in names)
    if count:
      lines.append(
          f"warning: the {part} ({count} tensors {start}*) is not "
          f"imported: {why}"
      )
  del hf
  return lines


def check_exportable(config: model_config.ModelConfig) -> None:
  """Raises UnsupportedError (one line naming the field) unless a
  Qwen3_5MoeForCausalLM can hold the model `config`."""
  llama.check_fixed(config, _FIXED, ARCHITECTURE)
  if config.full_attention_interval < 2:
    raise UnsupportedError(
        f"config.full_attention_interval={config.full_attention_interval}: "
        f"a {ARCHITECTURE} needs >= 2"
    )


def hf_config(config: model_config.ModelConfig, dtype: str) -> dict[str, Any]:
  """A Qwen3_5MoeForCausalLM config.json of `config` with weights in
  `dtype`, which `config_fields` reads back as the same fields."""
  check_exportable(config)
  return {
      "architectures": [ARCHITECTURE],
      "model_type": "qwen3_5_moe_text",
      **llama.written_fields(config, _FIELDS),
      **{key: wanted for key, wanted, _ in _REQUIRED},
      "layer_types": layer_types(
          config.full_attention_interval, config.num_layers
      ),
      "max_position_embeddings": config.max_sequence_length,
      "rope_parameters": {
          "rope_type": "default",
          "rope_theta": float(config.rope_theta),
          "partial_rotary_factor": float(config.partial_rotary_factor),
      },
      "torch_dtype": dtype,
      "dtype": dtype,
  }


def _rows(start: int, stop: int, total: int) -> llama.Layout:
  """Rows [start, stop) of a fused [total, E] projection <-> [E, heads,
  width] (export joins the parts on axis 0)."""
  return llama.Layout(
      lambda s: (total, s[0]),
      lambda a, s: a[start:stop].T.reshape(s),
      lambda a: a.reshape(a.shape[0], -1).T,
  )


def _conv(start: int, stop: int, total: int) -> llama.Layout:
  """Channels [start, stop) of the fused depthwise kernel [total, 1, C]
  <-> [C, heads, width]."""
  return llama.Layout(
      lambda s: (total, 1, s[0]),
      lambda a, s: a[start:stop, 0, :].T.reshape(s),
      lambda a: a.reshape(a.shape[0], -1).T[:, None, :],
  )


def _gated_query(half: int) -> llama.Layout:
  """Half `half` (0 query, 1 gate) of q_proj [H*2D, E], each head's D
  query rows then its D gate rows, <-> [E, H, D]; export joins the two
  [H, D, E] halves on axis 1."""
  return llama.Layout(
      lambda s: (s[1] * 2 * s[2], s[0]),
      lambda a, s: a.reshape(s[1], 2, s[2], s[0])[:, half].transpose(2, 0, 1),
      lambda a: a.transpose(1, 2, 0),
  )


_GATE_VECTOR = llama.Layout(
    lambda s: (1,) + tuple(s), lambda a, s: a[0], lambda a: a[None]
)

_MOE = {
    "attn_norm": ("input_layernorm.weight", llama.SAME),
    "mlp_norm": ("post_attention_layernorm.weight", llama.SAME),
    "router": ("mlp.gate.weight", llama.LINEAR),
    "shared_w_gate": ("mlp.shared_expert.gate_proj.weight", llama.LINEAR),
    "shared_w_up": ("mlp.shared_expert.up_proj.weight", llama.LINEAR),
    "shared_w_down": ("mlp.shared_expert.down_proj.weight", llama.LINEAR),
    "shared_gate": ("mlp.shared_expert_gate.weight", _GATE_VECTOR),
}
_EXPERTS = {
    "w_gate": "gate_proj.weight",
    "w_up": "up_proj.weight",
    "w_down": "down_proj.weight",
}


def _attention_table() -> dict[str, tuple[str, llama.Layout, Any]]:
  """name -> (suffix, layout, join axis) of a full-attention layer."""
  table = {
      name: llama.LAYER_TENSORS[name] + (None,) for name in ("wk", "wv", "wo")
  }
  table["wq"] = ("self_attn.q_proj.weight", _gated_query(0), 1)
  table["wq_gate"] = ("self_attn.q_proj.weight", _gated_query(1), 1)
  table["q_norm"] = ("self_attn.q_norm.weight", llama.SAME, None)
  table["k_norm"] = ("self_attn.k_norm.weight", llama.SAME, None)
  return table


def _linear_table(
    config: model_config.ModelConfig,
) -> dict[str, tuple[str, llama.Layout, Any]]:
  """name -> (suffix, layout, join axis) of a Gated DeltaNet layer."""
  kd = config.linear_num_key_heads * config.linear_key_head_dim
  vd = config.linear_num_value_heads * config.linear_value_head_dim
  total = 2 * kd + vd
  parts = {"q": (0, kd), "k": (kd, 2 * kd), "v": (2 * kd, total)}
  table = {}
  for name, (start, stop) in parts.items():
    table["w" + name] = (
        "linear_attn.in_proj_qkv.weight",
        _rows(start, stop, total),
        0,
    )
    table["conv_" + name] = (
        "linear_attn.conv1d.weight",
        _conv(start, stop, total),
        0,
    )
  table.update(
      {
          "wz": ("linear_attn.in_proj_z.weight", llama.HEADS_OUT, None),
          "wa": ("linear_attn.in_proj_a.weight", llama.LINEAR, None),
          "wb": ("linear_attn.in_proj_b.weight", llama.LINEAR, None),
          "a_log": ("linear_attn.A_log", llama.SAME, None),
          "dt_bias": ("linear_attn.dt_bias", llama.SAME, None),
          "out_norm": ("linear_attn.norm.weight", llama.SAME, None),
          "wo": ("linear_attn.out_proj.weight", llama.HEADS_IN, None),
      }
  )
  return table


def tensors(
    params: Mapping[str, Any],
    config: model_config.ModelConfig,
    name_prefix: str = "model.",
) -> Iterator[Tensor]:
  """Every Hugging Face tensor of the hybrid model `params` (arrays or
  shapes of `transformer.init_params`) for `config`, the text model's
  names under `name_prefix`.

  Raises:
    UnsupportedError: a parameter with no tensor in the tables.
  """
  outer = llama.OUTER_TENSORS
  yield Tensor(
      name_prefix + "embed_tokens.weight",
      ("embedding",),
      None,
      outer["embedding"][1],
  )
  kinds = layer_types(config.full_attention_interval, config.num_layers)
  moe = {name: value + (None,) for name, value in _MOE.items()}
  stacks = (
      ("moe_layers", "full_attention", {**_attention_table(), **moe}),
      ("linear_layers", "linear_attention", {**_linear_table(config), **moe}),
  )
  for stack, kind, table in stacks:
    for name in params[stack]:
      if name not in table and name not in _EXPERTS:
        raise UnsupportedError(
            f"parameter {stack}/{name} has no {ARCHITECTURE} tensor"
        )
    numbers = [n for n, k in enumerate(kinds) if k == kind]
    # The table's order: the parts of a joined tensor in their order.
    names = [name for name in table if name in params[stack]] + [
        name for name in _EXPERTS if name in params[stack]
    ]
    for index, n in enumerate(numbers):
      layer = f"{name_prefix}layers.{n}."
      for name in names:
        if name in _EXPERTS:
          for j in range(config.num_experts):
            yield Tensor(
                f"{layer}mlp.experts.{j}.{_EXPERTS[name]}",
                (stack, name),
                index,
                llama.LINEAR,
                expert=j,
            )
          continue
        suffix, layout, join = table[name]
        yield Tensor(
            layer + suffix, (stack, name), index, layout, join_axis=join
        )
  yield Tensor(
      name_prefix + "norm.weight", ("final_norm",), None, outer["final_norm"][1]
  )
  if "unembedding" in params:
    yield Tensor(
        "lm_head.weight", ("unembedding",), None, outer["unembedding"][1]
    )
