"""Hugging Face Llama (LlamaForCausalLM) <-> this project's dense model.

Config: `config_fields(hf_config)` gives the project's model fields from a
Llama config.json (Llama 3.x: grouped-query heads, `rope_type: "llama3"`
frequency scaling, tied or untied embeddings); `hf_config(config)` is the
reverse.

Tensors: Hugging Face's `nn.Linear` weights are [out, in]; the project's
matrices are [in, out], with the heads split out:

  model.embed_tokens.weight            [V, E]      embedding      [V, E]
  model.layers.N.input_layernorm       [E]         attn_norm      [L, E]
  model.layers.N.self_attn.q_proj      [H*D, E]    wq             [L, E, H, D]
  model.layers.N.self_attn.k_proj/v    [K*D, E]    wk / wv        [L, E, K, D]
  model.layers.N.self_attn.o_proj      [E, H*D]    wo             [L, H, D, E]
  model.layers.N.post_attention_layernorm          mlp_norm       [L, E]
  model.layers.N.mlp.gate_proj/up_proj [M, E]      w_gate / w_up  [L, E, M]
  model.layers.N.mlp.down_proj         [E, M]      w_down         [L, M, E]
  model.norm.weight                    [E]         final_norm     [E]
  lm_head.weight                       [V, E]      unembedding    [E, V]

Rotary embeddings need no permutation: Hugging Face's Llama rotates halves
(dimension i with i + D/2, `rotate_half`), as `maxtext.model.layers.rope`
does; the logit tests check it.
"""

from collections.abc import Iterator, Mapping
import dataclasses
from typing import Any, Callable

import numpy as np

from maxtext.model import model_config

ARCHITECTURE = "LlamaForCausalLM"


class UnsupportedError(ValueError):
  """config.json describes a model this converter does not handle."""


def rope_config(hf: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
  """(rope_theta, scaling dict) of either config.json layout: transformers
  5's `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
  params = dict(hf.get("rope_parameters") or {})
  scaling = dict(hf.get("rope_scaling") or params)
  theta = hf.get("rope_theta", params.get("rope_theta", 10000.0))
  return float(theta), scaling


def config_fields(hf: Mapping[str, Any], source: str) -> dict[str, Any]:
  """The project's model fields of a Llama config.json.

  Args:
    hf: the parsed config.json.
    source: its path, named in errors.

  Raises:
    UnsupportedError: another architecture, or a Llama option the model
      lacks (biases, another activation or rotary scaling); one line.
  """
  _check_llama(hf, source)
  heads = int(hf["num_attention_heads"])
  theta, scaling = rope_config(hf)
  fields = {
      "vocab_size": int(hf["vocab_size"]),
      "emb_dim": int(hf["hidden_size"]),
      "num_layers": int(hf["num_hidden_layers"]),
      "num_heads": heads,
      "num_kv_heads": int(hf.get("num_key_value_heads") or heads),
      "head_dim": int(hf.get("head_dim") or hf["hidden_size"] // heads),
      "mlp_dim": int(hf["intermediate_size"]),
      "rope_theta": theta,
      "norm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
      "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
      # Training sequences up to the model's context, at most 8192 tokens.
      "max_sequence_length": min(
          int(hf.get("max_position_embeddings", 2048)), 8192
      ),
      "rope_scaling": "none",
  }
  fields.update(_rope_scaling_fields(scaling, source))
  return fields


def _check_llama(hf: Mapping[str, Any], source: str) -> None:
  """Raises UnsupportedError unless config.json `hf` (at `source`) is a
  Llama without biases, with SiLU."""
  architectures = hf.get("architectures") or [hf.get("model_type")]
  if ARCHITECTURE not in architectures:
    raise UnsupportedError(
        f"{source}: architecture {architectures[0]!r} is not supported "
        f"(supported: {ARCHITECTURE})"
    )
  for key, wanted in (
      ("attention_bias", False),
      ("mlp_bias", False),
      ("hidden_act", "silu"),
  ):
    if hf.get(key, wanted) != wanted:
      raise UnsupportedError(
          f"{source}: {key}={hf[key]!r} is not supported (only {wanted!r})"
      )


def _rope_scaling_fields(
    scaling: Mapping[str, Any], source: str
) -> dict[str, Any]:
  """The project's rotary scaling fields of a Llama config.json's scaling
  dict (`rope_config`): none for the default, Llama 3's otherwise.

  Raises:
    UnsupportedError: another rope_type; one line.
  """
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind == "default":
    return {}
  if kind != "llama3":
    raise UnsupportedError(
        f"{source}: rope_type {kind!r} is not supported (default or llama3)"
    )
  return dict(
      rope_scaling="llama3",
      rope_scaling_factor=float(scaling["factor"]),
      rope_low_freq_factor=float(scaling["low_freq_factor"]),
      rope_high_freq_factor=float(scaling["high_freq_factor"]),
      rope_original_max_position=int(
          scaling["original_max_position_embeddings"]
      ),
  )


def hf_config(config: model_config.ModelConfig, dtype: str) -> dict[str, Any]:
  """A Llama config.json for the project's `config` with weights in `dtype`.

  Raises:
    UnsupportedError: a rotary scaling Llama's config cannot state.
  """
  if config.rope_scaling not in ("none", "llama3"):
    raise UnsupportedError(
        f"config.rope_scaling={config.rope_scaling!r}: a {ARCHITECTURE} has "
        "no such rotary scaling (none or llama3)"
    )
  rope = {"rope_type": "default", "rope_theta": float(config.rope_theta)}
  if config.rope_scaling == "llama3":
    rope = {
        "rope_type": "llama3",
        "rope_theta": float(config.rope_theta),
        "factor": float(config.rope_scaling_factor),
        "low_freq_factor": float(config.rope_low_freq_factor),
        "high_freq_factor": float(config.rope_high_freq_factor),
        "original_max_position_embeddings": int(
            config.rope_original_max_position
        ),
    }
  return {
      "architectures": [ARCHITECTURE],
      "model_type": "llama",
      "vocab_size": config.vocab_size,
      "hidden_size": config.emb_dim,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim,
      "intermediate_size": config.mlp_dim,
      "hidden_act": "silu",
      "max_position_embeddings": config.max_sequence_length,
      "rms_norm_eps": float(config.norm_epsilon),
      # Both layouts: older transformers read rope_theta and rope_scaling.
      "rope_theta": float(config.rope_theta),
      "rope_scaling": rope if config.rope_scaling == "llama3" else None,
      "rope_parameters": rope,
      "attention_bias": False,
      "mlp_bias": False,
      "tie_word_embeddings": bool(config.tie_word_embeddings),
      "torch_dtype": dtype,
      "dtype": dtype,
  }


# The families' config tables (deepseek.py, qwen3.py) are rows of
# (config.json key, project field, type, default when the key is absent or
# null); NEEDED as the default: import needs the key.
NEEDED = object()


def require(hf: Mapping[str, Any], source: str, key: str, wanted, default):
  """Raises UnsupportedError unless config.json `hf` (at `source`) holds
  `wanted` at `key` (`default` when absent or null)."""
  value = hf.get(key, default)
  if value is None:
    value = default
  if value != wanted:
    raise UnsupportedError(
        f"{source}: {key}={value!r} is not supported (only {wanted!r})"
    )


def read_fields(hf: Mapping[str, Any], table) -> dict[str, Any]:
  """The project fields of a config `table` from config.json `hf`.

  Raises:
    KeyError: a NEEDED key is absent or null.
  """
  fields = {}
  for key, field, kind, default in table:
    value = hf.get(key)
    if value is None:
      if default is NEEDED:
        raise KeyError(key)
      value = default
    fields[field] = kind(value)
  return fields


def field_values(config: model_config.ModelConfig) -> dict[str, Any]:
  """The model config's fields by name, for the tables of fields a family
  writes or fixes (a run's config gives its model fields:
  `model_config.of`)."""
  return dataclasses.asdict(model_config.of(config))


def check_fixed(
    config: model_config.ModelConfig,
    fixed: Mapping[str, Any],
    architecture: str,
) -> None:
  """Raises UnsupportedError naming the first field of `fixed` whose value
  in `config` is not the one `architecture` holds."""
  values = field_values(config)
  for field, wanted in fixed.items():
    if values[field] != wanted:
      raise UnsupportedError(
          f"config.{field}={values[field]!r}: a {architecture} needs "
          f"{wanted!r}"
      )


def written_fields(config: model_config.ModelConfig, table) -> dict[str, Any]:
  """The config.json keys of a config `table` from the project's `config`."""
  values = field_values(config)
  return {key: kind(values[field]) for key, field, kind, _ in table}


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one project matrix is stored in Hugging Face's layout.

  `to_project(hf_array, project_shape)` and `to_hf(project_array)` convert
  one (unstacked) tensor; `hf_shape(project_shape)` is the shape the
  checkpoint must have.
  """

  hf_shape: Callable[[tuple[int, ...]], tuple[int, ...]]
  to_project: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


SAME = Layout(lambda s: s, lambda a, s: a, lambda a: a)
# [out, in] <-> [in, out].
LINEAR = Layout(lambda s: s[::-1], lambda a, s: a.T, lambda a: a.T)
# [H*D, E] <-> [E, H, D]: the output features are the heads.
HEADS_OUT = Layout(
    lambda s: (s[1] * s[2], s[0]),
    lambda a, s: a.T.reshape(s),
    lambda a: a.reshape(a.shape[0], -1).T,
)
# [E, H*D] <-> [H, D, E]: the input features are the heads.
HEADS_IN = Layout(
    lambda s: (s[2], s[0] * s[1]),
    lambda a, s: a.T.reshape(s),
    lambda a: a.reshape(-1, a.shape[-1]).T,
)

# Per-layer parameters: project name -> (Hugging Face name suffix, layout).
LAYER_TENSORS = {
    "attn_norm": ("input_layernorm.weight", SAME),
    "mlp_norm": ("post_attention_layernorm.weight", SAME),
    "wq": ("self_attn.q_proj.weight", HEADS_OUT),
    "wk": ("self_attn.k_proj.weight", HEADS_OUT),
    "wv": ("self_attn.v_proj.weight", HEADS_OUT),
    "wo": ("self_attn.o_proj.weight", HEADS_IN),
    "w_gate": ("mlp.gate_proj.weight", LINEAR),
    "w_up": ("mlp.up_proj.weight", LINEAR),
    "w_down": ("mlp.down_proj.weight", LINEAR),
}
# Top-level parameters: project name -> (Hugging Face name, layout).
OUTER_TENSORS = {
    "embedding": ("model.embed_tokens.weight", SAME),
    "final_norm": ("model.norm.weight", SAME),
    "unembedding": ("lm_head.weight", LINEAR),
}


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One Hugging Face tensor and where it goes: `path` is the project
  parameter's key path, `layer` its index in the stack (None: unstacked),
  `expert` its index in the experts axis after the layer axis (None: the
  parameter has none; a mixture-of-experts model stores each expert's
  matrix as its own tensor). A tensor that holds several parameters is
  one Tensor per parameter, all of that `hf_name`, each with `join_axis`:
  its layout's `hf_shape` is the whole tensor's, `to_project` takes its
  part of the whole, and the parts' `to_hf` outputs, in plan order,
  concatenated on `join_axis` and reshaped to `hf_shape`, are the whole."""

  hf_name: str
  path: tuple[str, ...]
  layer: int | None
  layout: Layout
  expert: int | None = None
  join_axis: int | None = None


def tensors(params: Mapping[str, Any]) -> Iterator[Tensor]:
  """Every Hugging Face tensor of the dense model `params` (a pytree of
  arrays or shapes from `transformer.init_params`), in file order."""
  for name in ("embedding",):
    yield Tensor(OUTER_TENSORS[name][0], (name,), None, OUTER_TENSORS[name][1])
  for name in params["layers"]:
    if name not in LAYER_TENSORS:
      raise UnsupportedError(f"parameter layers/{name} has no Llama tensor")
  num_layers = params["layers"]["wq"].shape[0]
  for i in range(num_layers):
    for name, (suffix, layout) in LAYER_TENSORS.items():
      yield Tensor(f"model.layers.{i}.{suffix}", ("layers", name), i, layout)
  for name in ("final_norm", "unembedding"):
    if name in params:
      yield Tensor(
          OUTER_TENSORS[name][0], (name,), None, OUTER_TENSORS[name][1]
      )


def stacked_tensors(
    params: Mapping[str, Any],
    stacks,
    experts: Mapping[str, str],
    num_experts: int,
    family: str,
) -> Iterator[Tensor]:
  """The per-layer tensors of a model with dense and MoE stacks, in file
  order.

  Args:
    params: the parameter pytree (arrays or shapes).
    stacks: (stack name, the Hugging Face layer numbers it holds, name ->
      (tensor name suffix, layout)) for each stack.
    experts: in "moe_layers", project name -> the suffix of each expert's
      tensor `mlp.experts.J.<suffix>` ([out, in], one per expert).
    num_experts: experts per MoE layer.
    family: the architecture named in errors.

  Raises:
    UnsupportedError: a parameter with no tensor in the tables.
  """
  for stack, numbers, names in stacks:
    if stack not in params:
      continue
    moe = stack == "moe_layers"
    for name in params[stack]:
      if name not in names and not (moe and name in experts):
        raise UnsupportedError(
            f"parameter {stack}/{name} has no {family} tensor"
        )
    for index, n in enumerate(numbers):
      prefix = f"model.layers.{n}."
      for name in params[stack]:
        if moe and name in experts:
          for j in range(num_experts):
            yield Tensor(
                f"{prefix}mlp.experts.{j}.{experts[name]}",
                (stack, name),
                index,
                LINEAR,
                expert=j,
            )
        else:
          suffix, layout = names[name]
          yield Tensor(prefix + suffix, (stack, name), index, layout)
