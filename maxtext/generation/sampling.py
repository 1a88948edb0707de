"""Autoregressive sampling from the model: token ids in, token ids out.

`SamplingOptions` says how to continue a prompt: greedily (`temperature` 0)
or by drawing from the softmax of the logits divided by `temperature`,
optionally only among the `top_k` most likely ids and within the smallest
set of ids whose probability reaches `top_p` (nucleus sampling); `seed`
fixes the draws; `stop_ids` end a continuation. `filter_logits` and
`choose` implement the choice for both samplers: this module's windowed
`sample` and the key/value-cache decoder (`maxtext.generation`), which is
the one to use for anything beyond a look at a model.

`sample(params, config, prompt_ids, options)` continues one prompt with
`options.max_new_tokens` ids per sample (`sample_many`: several prompts of
one length). Draws come from `jax.random` with
one `seed`, so a seed gives the same ids on the same backend every time.
There is no key/value cache: every new token runs `transformer.apply` over a
fixed [num_samples, max_sequence_length] window, so the loop compiles once
for a given (num_samples, max_new_tokens, greedy, filtered) and a prompt of any
length up to the window. Attention is causal, so ids after the filled part
of the window do not change the logits read. Once the window is full it
slides by one token per step (rotary position embeddings are relative, so a
shifted window means the same), which lets a continuation run past
`max_sequence_length` while the model sees its last `max_sequence_length`
tokens.
"""

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.core import checks
from maxtext.model import model_config
from maxtext.model import transformer

# The id that fills a continuation after it stopped (after a stop id, or in
# a row that has finished while others go on); the returned lengths say
# where the real ids end.
PAD_ID = 0

# The largest seed `jax.random.PRNGKey` takes.
MAX_SEED = 2**63 - 1
# The most samples one call draws: they are the rows of one batch.
MAX_NUM_SAMPLES = 4096


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
  """How to continue a prompt; checked when built.

  Attributes:
    max_new_tokens: ids to generate per sample (>= 1).
    temperature: 0 = greedy (argmax; the seed plays no part), else the
      softmax temperature (> 0).
    top_k: draw only among the k most likely ids; 0 = all.
    top_p: draw only among the most likely ids whose probabilities (after
      temperature and top_k) first reach this sum (nucleus sampling); 1 =
      all. In (0, 1].
    seed: the seed of the draws (>= 0); the same seed gives the same ids.
    num_samples: independent continuations (rows drawn with their own
      randomness; all equal when greedy).
    stop_ids: ids that end a continuation (the stop id is kept, then
      `PAD_ID` follows); empty = run to max_new_tokens.

  Raises:
    TypeError/ValueError: naming the option and its value: max_new_tokens
      or num_samples below 1, temperature negative or not finite, top_k or
      seed negative, top_p outside (0, 1], a stop id not a
      non-negative int.
  """

  max_new_tokens: int
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  num_samples: int = 1
  stop_ids: tuple[int, ...] = ()

  def __post_init__(self):
    if isinstance(self.stop_ids, (str, bytes)) or not isinstance(
        self.stop_ids, (tuple, list)
    ):
      raise TypeError(
          f"stop_ids must be a tuple of ints, got {self.stop_ids!r}"
      )
    checked = dict(
        max_new_tokens=checks.check_int(
            "max_new_tokens", self.max_new_tokens, 1
        ),
        temperature=checks.check_number("temperature", self.temperature),
        top_k=checks.check_int("top_k", self.top_k, 0),
        top_p=checks.check_number("top_p", self.top_p),
        seed=checks.check_int("seed", self.seed, 0),
        num_samples=checks.check_int("num_samples", self.num_samples, 1),
        stop_ids=tuple(
            checks.check_int("stop id", i, 0) for i in self.stop_ids
        ),
    )
    if checked["seed"] > MAX_SEED:
      raise ValueError(
          f"seed must be at most {MAX_SEED} (JAX's seeds are 64-bit signed "
          f"integers), got {checked['seed']}"
      )
    if checked["num_samples"] > MAX_NUM_SAMPLES:
      raise ValueError(
          f"num_samples must be at most {MAX_NUM_SAMPLES} (the samples are "
          "the rows of one batch on the devices; draw more with other "
          f"seeds), got {checked['num_samples']}"
      )
    if checked["temperature"] < 0:
      raise ValueError(
          "temperature must be >= 0 (0 = greedy), got "
          f"{checked['temperature']!r}"
      )
    if not 0 < checked["top_p"] <= 1:
      raise ValueError(
          f"top_p must be in (0, 1] (1 = all ids), got {checked['top_p']!r}"
      )
    # The checked values (plain ints and floats, also for numpy scalars)
    # replace the given ones; the class is frozen to its users.
    for name, value in checked.items():
      object.__setattr__(self, name, value)

  @property
  def greedy(self) -> bool:
    """Whether the next id is the argmax (temperature 0)."""
    return self.temperature == 0

  @property
  def filtered(self) -> bool:
    """Whether draws are restricted (top_k or top_p; never when greedy)."""
    return not self.greedy and (self.top_k > 0 or self.top_p < 1)


def filter_logits(
    logits: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
) -> jax.Array:
  """Sets the logits of ids that top_k and top_p exclude to -inf.

  The top-k cut keeps ids at or above the k-th largest logit (ties with it
  are kept); the nucleus cut then keeps the most likely ids up to and
  including the first whose cumulative probability (softmax of the kept
  logits / temperature) reaches top_p, again with its ties. The most likely
  id is always kept. All three arguments are arrays, so one compiled
  program serves every value.

  Args:
    logits: float32 [N, V].
    temperature: float32 scalar > 0.
    top_k: int32 scalar; 0 = no cut.
    top_p: float32 scalar in (0, 1]; 1 = no cut.

  Returns:
    float32 [N, V], logits or -inf.
  """
  vocab = logits.shape[-1]
  ranked = -jnp.sort(-logits, axis=-1)  # descending
  kth = jax.lax.dynamic_index_in_dim(
      ranked, jnp.clip(top_k - 1, 0, vocab - 1), axis=1
  )
  kth = jnp.where(top_k > 0, kth, -jnp.inf)
  ranked = jnp.where(ranked < kth, -jnp.inf, ranked)
  probs = jax.nn.softmax(ranked / temperature, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs  # mass of the likelier ids
  kept = jnp.maximum(jnp.sum(before < top_p, axis=-1, keepdims=True), 1)
  cut = jnp.take_along_axis(ranked, kept - 1, axis=-1)
  cut = jnp.where(top_p < 1, cut, kth)
  return jnp.where(logits < jnp.maximum(cut, kth), -jnp.inf, logits)


def choose(
    logits: jax.Array,
    keys: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    *,
    greedy: bool,
    filtered: bool,
) -> jax.Array:
  """The next id of each row of float32 [N, V] `logits`.

  Args:
    logits: float32 [N, V].
    keys: raw PRNG keys (`jax.random.PRNGKey`'s uint32 kind): [N, 2], one
      per row (each row draws with its own key), or [2], one key for the
      whole [N, V] draw.
    temperature, top_k, top_p: as `filter_logits`.
    greedy: the argmax (the other arguments play no part).
    filtered: apply `filter_logits` (False when top_k 0 and top_p 1).

  Returns:
    int32 [N].
  """
  if greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if filtered:
    logits = filter_logits(logits, temperature, top_k, top_p)
  scaled = logits / temperature
  if keys.ndim == 1:
    return jax.random.categorical(keys, scaled, axis=-1).astype(jnp.int32)
  return jax.vmap(jax.random.categorical)(keys, scaled).astype(jnp.int32)


def choose_with_log_prob(
    logits: jax.Array,
    keys: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    allowed_vocab: jax.Array,
    *,
    greedy: bool,
    filtered: bool,
) -> tuple[jax.Array, jax.Array]:
  """`choose` among ids below `allowed_vocab`, with each chosen id's
  log-probability under the temperature-scaled distribution (log-softmax
  of logits / temperature, before top-k / top-p filtering): what a
  policy-gradient loss trains (GRPO's behaviour log-probabilities).

  Args:
    logits: float32 [N, V].
    keys: [N, 2] raw PRNG keys, one per row.
    temperature, top_k, top_p: as `filter_logits` (temperature 1 when
      greedy).
    allowed_vocab: int32 scalar; ids at or above it are never chosen.
    greedy, filtered: as `choose`.

  Returns:
    (ids int32 [N], log_probs float32 [N]).
  """
  vocab = jnp.arange(logits.shape[-1])
  token = choose(
      jnp.where(vocab < allowed_vocab, logits, -jnp.inf),
      keys,
      temperature,
      top_k,
      top_p,
      greedy=greedy,
      filtered=filtered,
  )
  log_prob = jnp.take_along_axis(
      jax.nn.log_softmax(logits / temperature, axis=-1),
      token[:, None],
      axis=-1,
  )[:, 0]
  return token, log_prob


def check_for_model(
    options: "SamplingOptions",
    config: model_config.ModelConfig,
    allowed_vocab: int,
) -> int:
  """Checks `options` against a model's vocabulary; returns the allowed
  vocabulary (`allowed_vocab`, 0 meaning config.vocab_size).

  Raises:
    TypeError/ValueError: one line naming the problem: options not
      SamplingOptions, allowed_vocab above the model's vocabulary, top_k
      above the allowed one, a stop id outside the model's vocabulary.
  """
  if not isinstance(options, SamplingOptions):
    raise TypeError(
        f"options must be a SamplingOptions, got {type(options).__name__}"
    )
  vocab = config.vocab_size
  allowed_vocab = checks.check_int("allowed_vocab", allowed_vocab, 0) or vocab
  if allowed_vocab > vocab:
    raise ValueError(
        f"allowed_vocab={allowed_vocab}: above the model's vocab_size {vocab}"
    )
  if options.top_k > allowed_vocab:
    raise ValueError(
        f"top_k={options.top_k}: above the vocabulary of {allowed_vocab} ids"
    )
  bad_stops = [i for i in options.stop_ids if i >= vocab]
  if bad_stops:
    raise ValueError(
        f"stop id {bad_stops[0]} is outside the model's vocabulary [0, {vocab})"
    )
  return allowed_vocab


def mask_after_stop(
    ids: np.ndarray, stop_ids: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
  """`ids` [N, T] with `PAD_ID` after each row's first stop id, and the
  rows' lengths (up to and including the stop id)."""
  ids = np.array(ids, copy=True)
  lengths = np.full(ids.shape[0], ids.shape[1], np.int32)
  if stop_ids:
    hits = np.isin(ids, np.asarray(stop_ids))
    first = np.where(hits.any(axis=1), hits.argmax(axis=1) + 1, ids.shape[1])
    lengths = first.astype(np.int32)
    ids[np.arange(ids.shape[1])[None, :] >= lengths[:, None]] = PAD_ID
  return ids, lengths


@functools.partial(
    jax.jit,
    static_argnames=("config", "max_new_tokens", "greedy", "filtered"),
)
def _sample_loop(
    params,
    window,
    filled,
    key,
    temperature,
    top_k,
    top_p,
    allowed_vocab,
    *,
    config: model_config.ModelConfig,
    max_new_tokens: int,
    greedy: bool,
    filtered: bool,
):
  """The compiled loop; see `sample`.

  Args:
    params: the model's parameters.
    window: int32 [N, S] ids, the first `filled` of each row the prompt.
    filled: int32 scalar, 1 <= filled <= S.
    key: the PRNG key of the run.
    temperature: float32 scalar (> 0 unless greedy).
    top_k: int32 scalar (0 = all ids).
    top_p: float32 scalar (1 = all ids).
    allowed_vocab: int32 scalar; ids at or above it are never chosen.
    config: the model's config (static: JAX hashes it).
    max_new_tokens: ids to add to each row.
    greedy: argmax instead of drawing.
    filtered: whether top_k or top_p restrict the draws.

  Returns:
    int32 [N, max_new_tokens]: the new ids.
  """
  rows, length = window.shape
  out = jnp.zeros((rows, max_new_tokens), jnp.int32)

  def body(i, carry):
    window, filled, out = carry
    logits = transformer.apply(params, window, config)
    last = jax.lax.dynamic_index_in_dim(logits, filled - 1, 1, keepdims=False)
    vocab = jnp.arange(last.shape[-1])
    last = jnp.where(vocab < allowed_vocab, last, -jnp.inf)
    token = choose(
        last,
        jax.random.fold_in(key, i),
        temperature,
        top_k,
        top_p,
        greedy=greedy,
        filtered=filtered,
    )
    full = filled == length
    window = jnp.where(full, jnp.roll(window, -1, axis=1), window)
    at = jnp.where(full, length - 1, filled)
    window = jax.lax.dynamic_update_slice_in_dim(
        window, token[:, None], at, axis=1
    )
    out = jax.lax.dynamic_update_slice_in_dim(out, token[:, None], i, axis=1)
    return window, jnp.minimum(filled + 1, length), out

  _, _, out = jax.lax.fori_loop(0, max_new_tokens, body, (window, filled, out))
  return out


def sample(
    params: Any,
    config: model_config.ModelConfig,
    prompt_ids: Sequence[int],
    options: SamplingOptions,
    *,
    allowed_vocab: int = 0,
) -> np.ndarray:
  """Continues `prompt_ids` with the model.

  Args:
    params: the model's parameters (`transformer.init_params`' tree).
    config: the model's config or the run's (its model fields,
      `model_config.of`, are the compiled loop's static argument).
    prompt_ids: 1 to config.max_sequence_length ids in [0, vocab_size).
    options: how many ids to generate, and how to choose them.
    allowed_vocab: ids at or above this are never chosen (a tokenizer
      smaller than the model's vocabulary); 0 = config.vocab_size.

  Returns:
    int32 [options.num_samples, options.max_new_tokens]: the new ids (the
    prompt excluded), `PAD_ID` after a row's first stop id.

  Raises:
    TypeError/ValueError: `options` not SamplingOptions, top_k above the
      vocabulary, or a prompt that is empty, longer than
      max_sequence_length, or holds an id outside the vocabulary (named,
      with the value).
  """
  return sample_many(
      params, config, [prompt_ids], options, allowed_vocab=allowed_vocab
  )


def sample_many(
    params: Any,
    config: model_config.ModelConfig,
    prompts: Sequence[Sequence[int]],
    options: SamplingOptions,
    *,
    allowed_vocab: int = 0,
) -> np.ndarray:
  """Continues prompts of one length together, each `num_samples` times.

  Args and Raises: as `sample`; every prompt must have the first one's
  length (the window has one filled length).

  Returns:
    int32 [len(prompts) * num_samples, max_new_tokens]; row r continues
    prompt r // num_samples.
  """
  allowed_vocab = check_for_model(options, config, allowed_vocab)
  vocab = config.vocab_size
  length = config.max_sequence_length
  rows = []
  for prompt_ids in prompts:
    prompt = [int(checks.check_int("prompt id", i)) for i in prompt_ids]
    if not prompt:
      raise ValueError("prompt is empty: give at least one token")
    if len(prompt) > length:
      raise ValueError(
          f"prompt holds {len(prompt)} tokens, more than the model's "
          f"max_sequence_length {length}; shorten it"
      )
    if rows and len(prompt) != len(rows[0]):
      raise ValueError(
          f"prompts of {len(rows[0])} and {len(prompt)} tokens: the windowed "
          "sampler continues prompts of one length together"
      )
    bad = [i for i in prompt if not 0 <= i < vocab]
    if bad:
      raise ValueError(
          f"prompt id {bad[0]} is outside the model's vocabulary [0, {vocab})"
      )
    rows.append(prompt)
  window = np.zeros((len(rows) * options.num_samples, length), np.int32)
  for index, prompt in enumerate(rows):
    first = index * options.num_samples
    window[first : first + options.num_samples, : len(prompt)] = prompt
  greedy = options.greedy
  out = _sample_loop(
      params,
      jnp.asarray(window),
      jnp.int32(len(rows[0])),
      jax.random.PRNGKey(options.seed),
      jnp.float32(options.temperature if not greedy else 1.0),
      jnp.int32(options.top_k),
      jnp.float32(options.top_p),
      jnp.int32(allowed_vocab),
      config=model_config.of(config),
      max_new_tokens=options.max_new_tokens,
      greedy=greedy,
      filtered=options.filtered,
  )
  return mask_after_stop(np.asarray(jax.device_get(out)), options.stop_ids)[0]
