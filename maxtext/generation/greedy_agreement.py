"""When two greedy decodings of the same request count as agreeing.

Two greedy decoders (or a decoder and a float32 forward pass) fed the same
model and context can pick different ids: each takes the argmax of logits
computed in the compute dtype, and a different order of the same sums (a
cache against a full pass, a gathered page view against a kernel, another
chip's reductions) rounds differently. Where the best two candidates are
nearly tied, the rounding decides, and from that position on the two
sequences continue different contexts.

So two id sequences of a request agree

  exactly             when they are equal, and
  within rounding     when they are equal, or when, at the first position i
                      where they differ, the model's float32 logits over
                      the common context (the prompt and the i ids both
                      chose) give the two chosen ids a and b logits within
                      the rounding of the compute dtype:

                        |l_a - l_b| <= ROUNDING_ULPS * eps * max(|l_a|, |l_b|)

                      with eps the dtype's spacing at 1 (`jnp.finfo`: 2^-7
                      for bfloat16, 2^-23 for float32): an ulp of the larger
                      logit is at most eps times it.

Past the first difference nothing is compared: the contexts differ.

ROUNDING_ULPS: one ulp is what rounding the two logits alone can move their
difference (half an ulp each). The logits are the end of a long computation
in the compute dtype: every layer's residual stream, norms and attention
outputs are rounded on the way, so the error reaching them is more.
`rounding_errors` measures it: at each position of a batch of sequences, how
far the compute dtype's forward pass moves the float32 pass's top-2 logit
difference, in units of eps * max(|l_a|, |l_b|). On the benchmark models
the largest measured is under 1.5 units (docs/PERFORMANCE.md, "Greedy
agreement, and a decode step against the bandwidth limit"); the bound, 4,
leaves more than twice that for deeper models and other chips' orders of
summation. (Between bfloat16 logits near 10 it is a difference of 0.3.)

The float32 reference runs at the highest matmul precision: on a TPU a
float32 matmul otherwise runs in one bfloat16 pass (its operands rounded to
bfloat16, the products summed in float32). For the same reason a decoder
that computes in float32 on a TPU at JAX's default matmul precision rounds
as a bfloat16 one does where it matters most, in its matmuls' operands:
`rounding_dtype` says so, and its dtype's eps is the one the rule uses.
"""

import dataclasses
import functools
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.model import model_config
from maxtext.model import transformer

ROUNDING_ULPS = 4

# Values of jax_default_matmul_precision under which a TPU runs a float32
# matmul in one bfloat16 pass (None: JAX's default).
_ONE_BFLOAT16_PASS = (None, "default", "fastest", "bfloat16")


def rounding_dtype(
    compute_dtype: Any,
    platform: Optional[str] = None,
    matmul_precision: Any = "unset",
) -> str:
  """The dtype whose rounding a decoder computing in `compute_dtype` carries.

  The compute dtype, but float32 on a TPU at a matmul precision of one
  bfloat16 pass, which rounds as bfloat16. `platform` defaults to JAX's
  default backend and `matmul_precision` to `jax_default_matmul_precision`.
  """
  name = jnp.dtype(compute_dtype).name
  if platform is None:
    platform = jax.default_backend()
  if matmul_precision == "unset":
    # The flag's value in this context (`jax.default_matmul_precision`);
    # `jax.config.read` refuses context-managed flags.
    # pylint: disable-next=no-member
    matmul_precision = jax.config.jax_default_matmul_precision
  if (
      name == "float32"
      and platform == "tpu"
      and matmul_precision in _ONE_BFLOAT16_PASS
  ):
    return "bfloat16"
  return name


def near_tie(
    logit_a: float, logit_b: float, dtype: Any, ulps: float = ROUNDING_ULPS
) -> bool:
  """Whether rounding in `dtype` can order the two logits either way."""
  eps = float(jnp.finfo(jnp.dtype(dtype)).eps)
  return abs(logit_a - logit_b) <= ulps * eps * max(abs(logit_a), abs(logit_b))


def first_difference(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
  """The first position where `a` and `b` differ (one ending before the
  other counts as differing there), or None when they are equal."""
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return None if len(a) == len(b) else min(len(a), len(b))


@dataclasses.dataclass(frozen=True)
class Agreement:
  """How many of `total` requests agree exactly and within rounding."""

  same: int
  within_rounding: int
  total: int


def _float32(config: model_config.ModelConfig) -> model_config.ModelConfig:
  """`config` computing and keeping its weights in float32."""
  return dataclasses.replace(
      config, compute_dtype="float32", weight_dtype="float32"
  )


def _bucket(length: int, cap: int) -> int:
  """A power of two >= length (at most cap): few shapes, few compiles."""
  size = 16
  while size < length:
    size *= 2
  return min(size, cap)


def float32_logits(
    params: Any, config: model_config.ModelConfig, context: Sequence[int]
) -> np.ndarray:
  """The float32 model's [vocab] logits for the id after `context`, at the
  highest matmul precision."""
  config32 = _float32(config)
  width = _bucket(len(context), config.max_sequence_length)
  tokens = np.zeros((1, width), np.int32)
  tokens[0, : len(context)] = context
  params32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)
  with jax.default_matmul_precision("highest"):
    logits = _last_logits(params32, tokens, len(context) - 1, config32)
  return np.asarray(logits)


@functools.partial(jax.jit, static_argnames=("config",))
def _last_logits(params, tokens, position, config: model_config.ModelConfig):
  # The mask is causal: the padding after `position` changes nothing there.
  return transformer.apply(params, tokens, config)[0, position]


def agreement(
    params: Any,
    config: model_config.ModelConfig,
    contexts: Sequence[Sequence[int]],
    ids_a: Sequence[Sequence[int]],
    ids_b: Sequence[Sequence[int]],
) -> Agreement:
  """Counts the requests whose two greedy id sequences agree.

  Args:
    params: the model's parameters (any dtype: cast to float32 here).
    config: the model's config; its compute dtype sets the rounding
      (`rounding_dtype`).
    contexts: each request's context ids.
    ids_a, ids_b: each request's ids from the two decodings, cut to the
      request's own length.
  """
  same = within = 0
  dtype = rounding_dtype(config.compute_dtype)
  for context, a, b in zip(contexts, ids_a, ids_b, strict=True):
    a, b = [int(i) for i in a], [int(i) for i in b]
    i = first_difference(a, b)
    if i is None:
      same += 1
      within += 1
      continue
    if i == min(len(a), len(b)):
      continue  # One stopped where the other went on: not a tie of ids.
    logits = float32_logits(params, config, list(context) + a[:i])
    within += near_tie(float(logits[a[i]]), float(logits[b[i]]), dtype)
  return Agreement(same=same, within_rounding=within, total=len(contexts))


def rounding_errors(
    params: Any, config: model_config.ModelConfig, tokens: np.ndarray
) -> np.ndarray:
  """How far the compute dtype moves the top-2 logit difference.

  Args:
    params: the model's parameters.
    config: the model's config; its compute dtype is measured.
    tokens: int32 [B, S] sequences (S <= max_sequence_length).

  Returns:
    float64 [B * S]: at each position, |d_c - d_32| / (eps * max(|l_a|,
    |l_b|)), with a, b the float32 pass's best two ids, d their logit
    difference in the compute dtype's pass (d_c) and the float32 pass's
    (d_32), eps the compute dtype's (the unit of `near_tie`).
  """
  tokens = np.asarray(tokens, np.int32)
  params32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)
  with jax.default_matmul_precision("highest"):
    exact = np.asarray(_logits(params32, tokens, _float32(config)), np.float64)
  rounded = np.asarray(_logits(params, tokens, config), np.float64)
  exact = exact.reshape(-1, exact.shape[-1])
  rounded = rounded.reshape(exact.shape)
  top = np.argsort(-exact, axis=1)[:, :2]
  rows = np.arange(len(exact))
  a, b = top[:, 0], top[:, 1]
  d32 = exact[rows, a] - exact[rows, b]
  dc = rounded[rows, a] - rounded[rows, b]
  eps = float(jnp.finfo(jnp.dtype(config.compute_dtype)).eps)
  scale = np.maximum(np.abs(exact[rows, a]), np.abs(exact[rows, b]))
  return np.abs(dc - d32) / (eps * scale)


@functools.partial(jax.jit, static_argnames=("config",))
def _logits(params, tokens, config: model_config.ModelConfig):
  return transformer.apply(params, tokens, config)
