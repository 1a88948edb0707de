"""What a decode step must read, and the step time the memory allows.

A decode step runs the model on one new id per row. It does a few FLOPs per
byte it reads, so on an accelerator its time is bounded below by the bytes
it must read from HBM over the HBM bandwidth (`hbm_bandwidth`):

  weights   every parameter once, in the compute dtype (the dtype a rollout
            holds them in: cast once before decoding), except an untied
            input embedding table, of which a step reads one row per row.
            A mixture of experts counts every expert: the bound of a step
            whose rows reach every expert.
  cache     each row's visible keys and values (`kv_cache.bytes_per_token`
            per position, every attention layer).
  states    each row's recurrent states, for a hybrid model's Gated
            DeltaNet layers (`kv_cache.state_bytes_per_row`).

The cache and the states depend on the rows a step runs, so they are the
mean over a generation's decode steps: a row that generates n ids after a
p-id context runs n steps (each samples from the logits the step before
left, then runs the model on that id), and its j-th step attends over
p + j positions; the generation's D decode steps share the rows' sum.

The limit is `StepBytes.total` / bandwidth; a measured step (the timed
seconds over D) reaches `limit / measured` of it. The timed seconds include
prefill and the host's work between calls, so the fraction is a lower bound
on the decode steps' own.
"""

import dataclasses
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.generation import kv_cache
from maxtext.metrics import hbm_bandwidth
from maxtext.model import model_config


@dataclasses.dataclass(frozen=True)
class StepBytes:
  """The bytes one decode step reads (the module docstring's terms).

  Attributes:
    weights: the parameters' bytes in the compute dtype.
    cache: the mean key/value bytes of a step's rows.
    states: the mean recurrent-state bytes of a step's rows.
    steps: the decode steps the means are over.
  """

  weights: int
  cache: float
  states: float
  steps: int

  @property
  def total(self) -> float:
    return self.weights + self.cache + self.states


def weight_bytes(config: model_config.ModelConfig, params: Any) -> int:
  """The bytes a step reads of `params` (arrays or shapes), each element in
  `config.compute_dtype`: all but an untied input embedding table."""
  count = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
  if "unembedding" in params:
    count -= int(np.prod(params["embedding"].shape))
  return count * jnp.dtype(config.compute_dtype).itemsize


def step_bytes(
    config: model_config.ModelConfig,
    params: Any,
    context_lengths: Sequence[int],
    new_tokens: Sequence[int],
    steps: int,
) -> StepBytes:
  """The mean bytes a decode step of a generation reads.

  Args:
    config: the model's config.
    params: its parameters (arrays or shapes).
    context_lengths: each row's context (prompt) ids.
    new_tokens: the ids each row generated, row for row.
    steps: the generation's decode steps.

  Raises:
    ValueError: steps < 1, or the two lengths differ in rows.
  """
  if steps < 1:
    raise ValueError(f"steps={steps}: a generation with no decode step")
  p = np.asarray(context_lengths, np.int64)
  n = np.asarray(new_tokens, np.int64)
  if p.shape != n.shape:
    raise ValueError(
        f"{p.size} context lengths for {n.size} rows of new tokens"
    )
  # Step j of a row attends over p + j positions, j = 1 .. n.
  positions = int(np.sum(n * p + n * (n + 1) // 2))
  row_steps = int(np.sum(n))
  return StepBytes(
      weights=weight_bytes(config, params),
      cache=kv_cache.bytes_per_token(config) * positions / steps,
      states=kv_cache.state_bytes_per_row(config) * row_steps / steps,
      steps=steps,
  )


def limit_seconds(step: StepBytes, device_kind: str) -> Optional[float]:
  """The bandwidth-limited seconds of the step on `device_kind`, or None
  where its bandwidth is unknown."""
  bandwidth = hbm_bandwidth.hbm_bytes_per_s(device_kind)
  return None if bandwidth is None else step.total / bandwidth


def report(step: StepBytes, device_kind: str, seconds: float) -> list[str]:
  """The two lines a benchmark prints: the bytes, then the limit against
  the measured step (`seconds` over `step.steps`)."""
  measured_ms = 1e3 * seconds / step.steps
  lines = [
      f"decode step reads: {step.weights} weight bytes + "
      f"{round(step.cache)} cache bytes + {round(step.states)} state bytes "
      f"= {round(step.total)} bytes (mean of {step.steps} steps)"
  ]
  limit = limit_seconds(step, device_kind)
  if limit is None:
    lines.append(
        f"bandwidth limit: unknown for {device_kind!r}; measured "
        f"{measured_ms:.3f} ms a step"
    )
    return lines
  bandwidth = hbm_bandwidth.hbm_bytes_per_s(device_kind)
  lines.append(
      f"bandwidth limit: {device_kind} {bandwidth / 1e9:.0f} GB/s: "
      f"{1e3 * limit:.3f} ms a step; measured {measured_ms:.3f} ms a step: "
      f"{1e3 * limit / measured_ms:.3f} of the limit"
  )
  return lines
