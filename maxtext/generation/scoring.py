"""Log-probabilities of given completions, in one teacher-forced pass.

`completion_log_probs_and_entropy` is the traceable piece a policy-gradient
loss builds on (the GRPO loss does): prompts and completions packed into one
right-padded [B, S] batch, one `transformer.apply` over it, and per
completion id the log-softmax of the logits at the position before it,
divided by a sampling temperature (and the entropy of that distribution).
`completion_log_probs` masks it to each completion's
length; `score` is its host-side form: id lists in, a float32 array out.
Padding (after a completion's end, and every position of a row's prompt) has
log-probability 0.
"""

import functools
import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import checks
from maxtext.generation import decoder
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.generation import sampling


def completion_log_probs_and_entropy(
    params: Any,
    tokens: jax.Array,
    prompt_lengths: jax.Array,
    completion_width: int,
    config: model_config.ModelConfig,
    mesh: Optional[jax.sharding.Mesh] = None,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Per completion position: the log-probability of its id and the entropy.

  Args:
    params: the model's parameters.
    tokens: int32 [B, W]: prompt then completion, right-padded.
    prompt_lengths: int32 [B], >= 1.
    completion_width: L, the completion columns returned.
    config: the model's config.
    mesh: as `transformer.apply`.
    temperature: of the distribution scored, softmax(logits / temperature)
      (> 0): the one a sampler at that temperature draws from, before top-k
      and top-p filtering (the decoder's `log_probs`).

  Returns:
    (log_probs, entropy), float32 [B, L] each: column j belongs to the id at
    tokens[b, prompt_lengths[b] + j] (meaningless past the completion's end:
    the caller masks). Every position is scored, `config.loss_chunk_size`
    positions at a time (`transformer.next_token_log_probs`), and the
    completion's columns picked from the [B, W] results.
  """
  width = tokens.shape[1]
  log_probs, entropy = transformer.next_token_log_probs(
      params, tokens, config, mesh, temperature=temperature
  )
  # Completion id j sits at prompt_length + j; the position before it
  # predicts it.
  at = jnp.clip(
      prompt_lengths[:, None] - 1 + jnp.arange(completion_width)[None, :],
      0,
      width - 2,
  )
  return (
      jnp.take_along_axis(log_probs, at, axis=1),
      jnp.take_along_axis(entropy, at, axis=1),
  )


def packed_completion_log_probs_and_entropy(
    params: Any,
    tokens: jax.Array,
    segment_ids: jax.Array,
    positions: jax.Array,
    completion_at: jax.Array,
    config: model_config.ModelConfig,
    mesh: Optional[jax.sharding.Mesh] = None,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """`completion_log_probs_and_entropy` of sequences packed into rows.

  One pass of the model over the packed rows (`transformer.Rows`: each
  sequence sees only itself) scores every position's next id; each
  completion id's value is then picked from the position before it. The
  pick is a gather of two float32 [R, W] arrays, not of the logits, so rows
  and sequences may sit on different devices cheaply.

  Args:
    params: the model's parameters.
    tokens: int32 [R, W] packed rows (`maxtext.data.packing.layout`).
    segment_ids, positions: int32 [R, W] of those rows.
    completion_at: int32 [B, L]: for completion id j of sequence b, the
      flat index r * W + c of the row position before it (whose logits
      predict it); any index in [0, R * W) past a completion's end.
    config: the model's config.
    mesh: as `transformer.apply`.
    temperature: as `completion_log_probs_and_entropy`.

  Returns:
    (log_probs, entropy), float32 [B, L] each, as
    `completion_log_probs_and_entropy` returns them.
  """
  log_probs, entropy = transformer.next_token_log_probs(
      params,
      tokens,
      config,
      mesh,
      transformer.Rows(segment_ids, positions),
      temperature,
  )
  return (
      log_probs.reshape(-1)[completion_at],
      entropy.reshape(-1)[completion_at],
  )


def completion_log_probs(
    params: Any,
    tokens: jax.Array,
    prompt_lengths: jax.Array,
    completion_lengths: jax.Array,
    config: model_config.ModelConfig,
    mesh: Optional[jax.sharding.Mesh] = None,
    temperature: float = 1.0,
) -> jax.Array:
  """Per-id log-probabilities of each row's completion.

  Args:
    params: the model's parameters.
    tokens: int32 [B, S] rows of prompt then completion, right-padded.
    prompt_lengths: int32 [B], >= 1.
    completion_lengths: int32 [B], prompt + completion <= S.
    config: the model's config.
    mesh: as `transformer.apply`.
    temperature: as `completion_log_probs_and_entropy`.

  Returns:
    float32 [B, S]: column j is the log-probability of completion id j
    (tokens[b, prompt_lengths[b] + j]); 0 where j >= completion_lengths[b].
  """
  length = tokens.shape[1]
  picked, _ = completion_log_probs_and_entropy(
      params, tokens, prompt_lengths, length, config, mesh, temperature
  )
  column = jnp.arange(length)[None, :]
  return jnp.where(column < completion_lengths[:, None], picked, 0.0)


@functools.partial(jax.jit, static_argnames=("config", "mesh"))
def _score(
    params,
    tokens,
    prompt_lengths,
    completion_lengths,
    temperature,
    config: model_config.ModelConfig,
    mesh,
):
  """`completion_log_probs`, compiled (`temperature` traced, not static)."""
  return completion_log_probs(
      params,
      tokens,
      prompt_lengths,
      completion_lengths,
      config,
      mesh,
      temperature,
  )


def score(
    params: Any,
    config: model_config.ModelConfig,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    mesh: Optional[jax.sharding.Mesh] = None,
    temperature: float = 1.0,
) -> np.ndarray:
  """The model's log-probability of each completion id given its prompt.

  Args:
    params: the model's parameters (one device, or sharded over `mesh`).
    config: the model's config or the run's (its model fields,
      `model_config.of`, are the compiled program's static argument).
    prompts: B id lists, each non-empty.
    completions: B id lists (may be empty); prompt + completion <=
      config.max_sequence_length.
    mesh: split the rows over this mesh's batch axes; None = one device.
    temperature: score softmax(logits / temperature) (> 0).

  Returns:
    float32 [B, longest completion]; 0 past a completion's end.

  Raises:
    ValueError: one line naming the row: counts differ, a bad prompt or
      completion id, a row longer than max_sequence_length, rows not
      divisible by the mesh's batch shards.
  """
  if len(prompts) != len(completions):
    raise ValueError(
        f"{len(prompts)} prompts but {len(completions)} completions: give "
        "one completion per prompt"
    )
  prompts = decoder.check_prompts(prompts, config, 0)
  vocab, limit = config.vocab_size, config.max_sequence_length
  rows = []
  for index, (prompt, completion) in enumerate(zip(prompts, completions)):
    ids = [checks.check_int(f"completion {index} id", i) for i in completion]
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
      raise ValueError(
          f"completion {index} id {bad[0]} is outside the model's "
          f"vocabulary [0, {vocab})"
      )
    if len(prompt) + len(ids) > limit:
      raise ValueError(
          f"row {index}: prompt {len(prompt)} + completion {len(ids)} tokens "
          f"exceed the model's max_sequence_length {limit}"
      )
    rows.append((prompt, ids))
  decoder.check_rows(mesh, len(rows), f"{len(rows)}")
  longest = max(len(p) + len(c) for p, c in rows)
  length = max(decoder.cache_length(longest, limit), 2)
  tokens = np.full((len(rows), length), sampling.PAD_ID, np.int32)
  for row, (prompt, completion) in enumerate(rows):
    tokens[row, : len(prompt) + len(completion)] = prompt + completion
  lengths = [
      np.asarray([len(p) for p, _ in rows], np.int32),
      np.asarray([len(c) for _, c in rows], np.int32),
  ]
  arrays = [jnp.asarray(tokens)] + [jnp.asarray(x) for x in lengths]
  if mesh is not None:
    arrays = [
        jax.device_put(x, decoder.batch_sharding(mesh, x.ndim)) for x in arrays
    ]
  if math.isnan(temperature) or temperature <= 0:
    raise ValueError(f"temperature={temperature!r}: must be > 0")
  out = _score(
      params,
      *arrays,
      jnp.float32(temperature),
      config=model_config.of(config),
      mesh=mesh,
  )
  width = max(len(c) for _, c in rows)
  return np.asarray(jax.device_get(out))[:, :width]
