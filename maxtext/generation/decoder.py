"""Generation with a key/value cache: batched prefill, then one step a token.

`generate(params, config, prompts, options)` continues a batch of prompts of
different lengths as one `sampling.SamplingOptions` says (greedy,
temperature, top_k, top_p, seed, stop ids; each prompt `num_samples` times):

1. Prefill: the prompts, right-padded to the cache length T, run through
   `cached_model.forward` once at positions 0..T-1, which fills the cache;
   each row's next-token logits are read at its own last prompt position.
2. Decode: a `jax.lax.while_loop`, one step per new token: every row chooses
   its next id (`sampling.choose`, each row with its own PRNG key, folded
   from the seed, the row and the step), then that id runs through the model
   at the row's own position (prompt length + step), writing its entry into
   the cache and giving the next logits. A row stops after one of the stop
   ids or `max_new_tokens` ids; a stopped row yields `sampling.PAD_ID` from
   then on, and the loop ends when every row has stopped.

The slots a prefill fills past a row's prompt hold the padding's entries;
each is overwritten by the row's own token before any query of the row can
see it, since a query at position p sees slots 0..p only. A hybrid model's
Gated DeltaNet states are left after each row's own prompt (the prefill
passes the prompt lengths: padding changes no state).

Generation stops at the model's `max_sequence_length`: a prompt plus
`max_new_tokens` longer than that is refused with one line (the windowed
sampler of `maxtext.generation.sampling` slides past it; this decoder does not).

Compilation: one program per (rows, cache length, greedy or not, filtered
or not, stop-id slots, mesh). The cache length is a bucket, the smallest
power of two (at least `_MIN_CACHE_LENGTH`) that holds the longest prompt
and `max_new_tokens`, capped at `max_sequence_length`; the prompt lengths,
`max_new_tokens`, temperature, top_k, top_p, seed and stop ids are arrays of
the program, so changing them compiles nothing new.

Sharding: with a `mesh`, the rows are split over its batch axes
(`maxtext.runtime.mesh.batch_axes`) and so is the cache; the parameters stay
where the caller put them (as the trainer shards them: `model_setup`).
"""

import dataclasses
import functools
import math
from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import checks
from maxtext.runtime import device_memory
from maxtext.runtime import mesh as mesh_lib
from maxtext.generation import cached_model
from maxtext.generation import kv_cache
from maxtext.model import model_config
from maxtext.generation import sampling

# The smallest cache length: short generations share one program.
_MIN_CACHE_LENGTH = 16
# Stop ids are passed padded to a multiple of this many slots (with -1,
# which matches no id), so one program serves any few stop ids.
_STOP_SLOTS = 8


@dataclasses.dataclass(frozen=True)
class Generation:
  """What `generate` returns, one row per (prompt, sample).

  Attributes:
    ids: int32 [rows, max_new_tokens] new ids; `sampling.PAD_ID` after a
      row stopped. Row r continues prompt r // num_samples.
    lengths: int32 [rows], the real ids of each row (a stop id included).
    log_probs: float32 [rows, max_new_tokens], the log-probability of each
      id under the temperature-scaled distribution it was drawn from
      (log-softmax of logits / temperature; temperature 1 when greedy),
      before top-k / top-p filtering; 0 at padding.
    cache_length: the cache's positions per row (the length bucket).
    cache_bytes: bytes of the whole cache (all rows and layers, with a
      hybrid model's recurrent states).
  """

  ids: np.ndarray
  lengths: np.ndarray
  log_probs: np.ndarray
  cache_length: int
  cache_bytes: int


def cache_length(needed: int, max_sequence_length: int) -> int:
  """The cache length bucket for `needed` positions (<= the maximum)."""
  bucket = max(_MIN_CACHE_LENGTH, 1 << max(needed - 1, 0).bit_length())
  return min(bucket, max_sequence_length)


def batch_sharding(
    mesh: jax.sharding.Mesh, ndim: int, axis: int = 0
) -> jax.sharding.NamedSharding:
  """Sharding of an `ndim`-dimensional array whose dimension `axis` is the
  rows: split over the mesh's batch axes, the rest replicated."""
  spec = [None] * ndim
  spec[axis] = mesh_lib.batch_axes(mesh)
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def check_rows(mesh: Optional[jax.sharding.Mesh], rows: int, what: str):
  """Raises ValueError (naming `what`) unless `rows` splits evenly over the
  mesh's batch shards; nothing to check without a mesh."""
  if mesh is None:
    return
  shards = math.prod(mesh.shape[a] for a in mesh_lib.batch_axes(mesh))
  if rows % shards:
    raise ValueError(
        f"{what} rows is not divisible by the mesh's {shards} batch shards"
    )


def check_cache_fits(
    config: model_config.ModelConfig,
    rows: int,
    shards: int,
    length: int,
    limit: Optional[int],
) -> None:
  """Refuses, in one line before anything is allocated, a cache whose
  share on one device (rows / shards rows of `length` positions, with a
  hybrid's recurrent states) alone exceeds `limit` bytes (None: unknown,
  nothing checked), naming the rows that would fit."""
  if limit is None:
    return
  per_row = kv_cache.bytes_per_token(
      config
  ) * length + kv_cache.state_bytes_per_row(config)
  need = per_row * (rows // shards)
  if need > limit:
    fits = (limit // per_row) * shards
    raise ValueError(
        f"the static decoder's cache of {rows} rows x {length} positions "
        f"takes {need / 2**30:.2f} GiB a device, more than its "
        f"{limit / 2**30:.2f} GiB: at most {fits} rows fit beside nothing "
        "else (use the paged decoder, or fewer rows or new tokens)"
    )


@functools.partial(
    jax.jit,
    static_argnames=("config", "length", "greedy", "filtered", "mesh"),
)
def _generate(
    params,
    tokens,
    lengths,
    seed_key,
    temperature,
    top_k,
    top_p,
    max_new_tokens,
    stop_ids,
    allowed_vocab,
    *,
    config: model_config.ModelConfig,
    length: int,
    greedy: bool,
    filtered: bool,
    mesh: Optional[jax.sharding.Mesh],
):
  """The compiled prefill and decode loop; see the module docstring.

  Args:
    params: the model's parameters.
    tokens: int32 [B, T'] prompts, right-padded to their own length bucket
      (the prefill runs over these T' positions, not over the cache).
    lengths: int32 [B] prompt lengths (>= 1).
    seed_key: the PRNG key of the seed.
    temperature, top_k, top_p: as `sampling.filter_logits`.
    max_new_tokens: int32 scalar, lengths + it <= T.
    stop_ids: int32 [S] (-1 = no stop id).
    allowed_vocab: int32 scalar; ids at or above it are never chosen.
    config, greedy, filtered: static; as `sampling.choose`.
    length: static; T, the cache's positions (>= T').
    mesh: static; the mesh whose batch axes split the rows, or None.

  Returns:
    (ids, log_probs): int32 and float32 [B, T]; the first max_new_tokens
    columns are the generation.
  """
  rows = tokens.shape[0]
  cache, logits = _prefill(params, tokens, lengths, config, length, mesh)
  row_keys = jax.vmap(lambda r: jax.random.fold_in(seed_key, r))(
      jnp.arange(rows)
  )

  def cond(carry):
    step, _, _, done, _, _ = carry
    return (step < max_new_tokens) & ~jnp.all(done)

  body = functools.partial(
      _decode_step,
      params=params,
      lengths=lengths,
      row_keys=row_keys,
      draw=(temperature, top_k, top_p, allowed_vocab),
      stop_ids=stop_ids,
      config=config,
      greedy=greedy,
      filtered=filtered,
  )
  carry = (
      jnp.int32(0),
      cache,
      logits,
      jnp.zeros((rows,), jnp.bool_),
      jnp.full((rows, length), sampling.PAD_ID, jnp.int32),
      jnp.zeros((rows, length), jnp.float32),
  )
  _, _, _, _, ids, log_probs = jax.lax.while_loop(cond, body, carry)
  if mesh is not None:
    # Every device ends with every row (a few ids a row): the host reads
    # them whole, in each process of a multi-process job.
    ids, log_probs = (
        jax.lax.with_sharding_constraint(
            x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        )
        for x in (ids, log_probs)
    )
  return ids, log_probs


def _prefill(
    params, tokens, lengths, config: model_config.ModelConfig, length: int, mesh
):
  """`_generate`'s prefill: the prompts into a fresh cache of `length`
  positions (its rows split over `mesh`'s batch axes).

  Returns:
    (the cache, float32 [B, V] each row's logits after its last prompt id).
  """
  rows = tokens.shape[0]
  cache = kv_cache.init(config, rows, length)
  if mesh is not None:
    cache = jax.tree_util.tree_map(
        lambda x: jax.lax.with_sharding_constraint(
            x, batch_sharding(mesh, x.ndim, 1)
        ),
        cache,
    )
  positions = jnp.broadcast_to(
      jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape
  )
  hidden, cache = cached_model.forward(
      params, tokens, positions, cache, config, lengths=lengths
  )
  last = jnp.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)
  return cache, cached_model.logits(params, last)[:, 0]


def _decode_step(
    carry,
    *,
    params,
    lengths,
    row_keys,
    draw,
    stop_ids,
    config: model_config.ModelConfig,
    greedy: bool,
    filtered: bool,
):
  """One step of `_generate`'s loop: each row draws an id (PAD once it is
  done), records it and its log-probability, and runs the model on it.

  `carry`: (step, cache, logits, done, ids, log_probs); `draw`:
  (temperature, top_k, top_p, allowed_vocab).
  """
  step, cache, logits, done, ids, log_probs = carry
  keys = jax.vmap(lambda k: jax.random.fold_in(k, step))(row_keys)
  token, log_prob = sampling.choose_with_log_prob(
      logits,
      keys,
      *draw,
      greedy=greedy,
      filtered=filtered,
  )
  token = jnp.where(done, sampling.PAD_ID, token)
  ids = ids.at[:, step].set(token)
  log_probs = log_probs.at[:, step].set(jnp.where(done, 0.0, log_prob))
  done = done | jnp.isin(token, stop_ids)
  hidden, cache = cached_model.forward(
      params, token[:, None], (lengths + step)[:, None], cache, config
  )
  logits = cached_model.logits(params, hidden)[:, 0]
  return step + 1, cache, logits, done, ids, log_probs


def _prompt_ids(index: int, prompt: Sequence[int]) -> list[int]:
  """Prompt `index`'s ids as a list of Python ints.

  A rollout's contexts grow to tens of thousands of ids, so the common
  forms are read at C speed: a NumPy integer array, or a sequence whose
  elements are all ints or all NumPy integers. Anything else is read id by
  id with `checks.check_int`, which names the first that is not an
  integer (a bool is not).
  """
  if isinstance(prompt, np.ndarray):
    if prompt.ndim == 1 and prompt.dtype.kind in "iu":
      return prompt.tolist()
    return _slow_ids(index, prompt)
  kinds = set(map(type, prompt))
  if kinds <= {int}:
    return list(prompt)
  if all(issubclass(kind, np.integer) for kind in kinds):
    return np.asarray(prompt).tolist()
  return _slow_ids(index, prompt)


def _slow_ids(index: int, prompt) -> list[int]:
  """The ids checked one by one: the first that is not an int is named."""
  return [checks.check_int(f"prompt {index} id", i) for i in prompt]


def check_prompts(
    prompts: Sequence[Sequence[int]],
    config: model_config.ModelConfig,
    reserved: Union[int, Sequence[int]],
) -> list[list[int]]:
  """The prompts as lists of ints, checked against the model.

  Args:
    prompts: one or more non-empty id sequences.
    config: the model's config.
    reserved: positions each prompt must leave free (max_new_tokens): one
      number for all, or one per prompt.

  Raises:
    TypeError/ValueError: one line naming the prompt and the problem (no
      prompts, an empty one, an id outside the vocabulary, too long).
  """
  if isinstance(prompts, (str, bytes)) or len(prompts) == 0:
    raise ValueError("prompts: give at least one prompt (a list of id lists)")
  vocab, limit = config.vocab_size, config.max_sequence_length
  checked = []
  for index, prompt in enumerate(prompts):
    ids = _prompt_ids(index, prompt)
    if not ids:
      raise ValueError(f"prompt {index} is empty: give at least one token")
    if min(ids) < 0 or max(ids) >= vocab:
      bad = next(i for i in ids if not 0 <= i < vocab)
      raise ValueError(
          f"prompt {index} id {bad} is outside the model's vocabulary "
          f"[0, {vocab})"
      )
    free = reserved if isinstance(reserved, int) else reserved[index]
    if len(ids) + free > limit:
      raise ValueError(
          f"prompt {index} of {len(ids)} tokens + max_new_tokens={free} "
          f"= {len(ids) + free} exceeds the model's max_sequence_length "
          f"{limit}; the cached decoder does not slide: shorten the prompt "
          "or ask for fewer tokens"
      )
    checked.append(ids)
  return checked


def generate(
    params: Any,
    config: model_config.ModelConfig,
    prompts: Sequence[Sequence[int]],
    options: sampling.SamplingOptions,
    *,
    allowed_vocab: int = 0,
    mesh: Optional[jax.sharding.Mesh] = None,
) -> Generation:
  """Continues each prompt `options.num_samples` times.

  Args:
    params: the model's parameters (`transformer.init_params`' tree), on one
      device or sharded over `mesh` as the trainer shards them.
    config: the model's config or the run's (its model fields,
      `model_config.of`, are the compiled program's static argument).
    prompts: id lists of 1 or more ids each; len(prompt) + max_new_tokens
      <= config.max_sequence_length.
    options: how many ids and how to choose them.
    allowed_vocab: ids at or above this are never chosen (a tokenizer
      smaller than the model's vocabulary); 0 = config.vocab_size.
    mesh: split the rows over this mesh's batch axes; None = one device.

  Returns:
    A `Generation` of len(prompts) * num_samples rows.

  Raises:
    TypeError/ValueError: one line naming the option or prompt: options
      not SamplingOptions, top_k above the vocabulary, a stop id outside
      it, a bad or too long prompt, rows not divisible by the mesh's
      batch shards, a cache whose share alone exceeds a device's memory
      (`check_cache_fits`).
  """
  config = model_config.of(config)
  allowed_vocab = sampling.check_for_model(options, config, allowed_vocab)
  new = options.max_new_tokens
  prompts = check_prompts(prompts, config, new)
  rows = len(prompts) * options.num_samples
  check_rows(
      mesh,
      rows,
      f"{len(prompts)} prompts x num_samples={options.num_samples} = {rows}",
  )
  longest = max(len(p) for p in prompts)
  length = cache_length(longest + new, config.max_sequence_length)
  _check_cache(config, rows, length, mesh)
  # The prefill runs over the prompts' own bucket: over the whole cache it
  # computed (and held) activations and scores for positions that are
  # padding.
  tokens, lengths = _prompt_rows(
      prompts, options.num_samples, cache_length(longest, length), mesh
  )
  ids, log_probs = _generate(
      params,
      tokens,
      lengths,
      jax.random.PRNGKey(options.seed),
      jnp.float32(1.0 if options.greedy else options.temperature),
      jnp.int32(options.top_k),
      jnp.float32(options.top_p),
      jnp.int32(new),
      jnp.asarray(_stop_slots(options.stop_ids)),
      jnp.int32(allowed_vocab),
      config=config,
      length=length,
      greedy=options.greedy,
      filtered=options.filtered,
      mesh=mesh,
  )
  ids, log_probs = jax.device_get((ids, log_probs))
  ids, lengths = sampling.mask_after_stop(
      np.asarray(ids)[:, :new], options.stop_ids
  )
  return Generation(
      ids=ids,
      lengths=lengths,
      log_probs=np.asarray(log_probs)[:, :new],
      cache_length=length,
      cache_bytes=_cache_bytes(config, length) * rows,
  )


def _check_cache(
    config: model_config.ModelConfig, rows: int, length: int, mesh
) -> None:
  """`check_cache_fits` for `rows` rows of `length` positions, split over
  `mesh`'s batch axes, on its first device (or JAX's first)."""
  shards = 1
  if mesh is not None:
    shards = math.prod(mesh.shape[a] for a in mesh_lib.batch_axes(mesh))
  device = mesh.devices.flat[0] if mesh is not None else jax.devices()[0]
  check_cache_fits(
      config, rows, shards, length, device_memory.bytes_limit(device)
  )


def _prompt_rows(prompts, num_samples: int, width: int, mesh):
  """The rows `_generate` takes: each prompt `num_samples` times.

  Returns:
    (int32 [rows, width] ids, right-padded; int32 [rows] their lengths),
    on the devices (split over `mesh`'s batch axes).
  """
  rows = len(prompts) * num_samples
  tokens = np.full((rows, width), sampling.PAD_ID, np.int32)
  lengths = np.zeros((rows,), np.int32)
  for index, prompt in enumerate(prompts):
    for sample in range(num_samples):
      row = index * num_samples + sample
      tokens[row, : len(prompt)] = prompt
      lengths[row] = len(prompt)
  if mesh is not None:
    # From the host's copy, which every process holds whole.
    return (
        jax.device_put(tokens, batch_sharding(mesh, 2)),
        jax.device_put(lengths, batch_sharding(mesh, 1)),
    )
  return jnp.asarray(tokens), jnp.asarray(lengths)


def _stop_slots(stop_ids: Sequence[int]) -> np.ndarray:
  """int32 stop ids padded with -1 to a multiple of `_STOP_SLOTS` (so the
  compiled program depends on their count only in steps of it)."""
  slots = -(-max(len(stop_ids), 1) // _STOP_SLOTS) * _STOP_SLOTS
  padded = np.full((slots,), -1, np.int32)
  padded[: len(stop_ids)] = stop_ids
  return padded


def _cache_bytes(config: model_config.ModelConfig, length: int) -> int:
  """A row's cache bytes at `length` positions, recurrent state included."""
  return kv_cache.bytes_per_token(config) * length + (
      kv_cache.state_bytes_per_row(config)
  )
