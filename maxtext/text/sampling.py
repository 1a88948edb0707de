"""Autoregressive sampling from the model: token ids in, token ids out.

`sample(params, config, prompt_ids, options)` continues a prompt with
`options.max_new_tokens` ids per sample, chosen greedily (`temperature` 0)
or drawn from the softmax of the logits divided by `temperature`, optionally
only among the `top_k` most likely ids. Draws come from `jax.random` with one
`seed`, so a seed gives the same ids on the same backend every time. The
options are one `SamplingOptions`, checked when it is built.

There is no key/value cache: every new token runs `transformer.apply` over a
fixed [num_samples, max_sequence_length] window, so the loop compiles once
for a given (num_samples, max_new_tokens, top_k, greedy) and a prompt of any
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

from maxtext import checks
from maxtext.model import transformer


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
  """How to continue a prompt; checked when built.

  Attributes:
    max_new_tokens: ids to generate per sample (>= 1).
    temperature: 0 = greedy (argmax; the seed plays no part), else the
      softmax temperature (> 0).
    top_k: draw only among the k most likely ids; 0 = all.
    seed: the seed of the draws (>= 0); the same seed gives the same ids.
    num_samples: independent continuations (rows drawn with their own
      randomness; all equal when greedy).

  Raises:
    TypeError/ValueError: naming the option and its value: max_new_tokens
      or num_samples below 1, temperature negative or not finite, top_k or
      seed negative.
  """

  max_new_tokens: int
  temperature: float = 0.0
  top_k: int = 0
  seed: int = 0
  num_samples: int = 1

  def __post_init__(self):
    checked = dict(
        max_new_tokens=checks.check_int(
            "max_new_tokens", self.max_new_tokens, 1
        ),
        temperature=checks.check_number("temperature", self.temperature),
        top_k=checks.check_int("top_k", self.top_k, 0),
        seed=checks.check_int("seed", self.seed, 0),
        num_samples=checks.check_int("num_samples", self.num_samples, 1),
    )
    if checked["temperature"] < 0:
      raise ValueError(
          "temperature must be >= 0 (0 = greedy), got "
          f"{checked['temperature']!r}"
      )
    # The checked values (plain ints and floats, also for numpy scalars)
    # replace the given ones; the class is frozen to its users.
    for name, value in checked.items():
      object.__setattr__(self, name, value)

  @property
  def greedy(self) -> bool:
    """Whether the next id is the argmax (temperature 0)."""
    return self.temperature == 0


def _choose(logits, key, temperature, *, greedy: bool, top_k: int):
  """The next id of each row of float32 [N, V] `logits`."""
  if greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if top_k:
    # Ids below the k-th largest logit of their row are never drawn (ties
    # with the k-th are kept).
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  return jax.random.categorical(key, logits / temperature, axis=-1).astype(
      jnp.int32
  )


@functools.partial(
    jax.jit,
    static_argnames=("config", "max_new_tokens", "greedy", "top_k"),
)
def _sample_loop(
    params,
    window,
    filled,
    key,
    temperature,
    allowed_vocab,
    *,
    config,
    max_new_tokens: int,
    greedy: bool,
    top_k: int,
):
  """The compiled loop; see `sample`.

  Args:
    params: the model's parameters.
    window: int32 [N, S] ids, the first `filled` of each row the prompt.
    filled: int32 scalar, 1 <= filled <= S.
    key: the PRNG key of the run.
    temperature: float32 scalar (> 0 unless greedy).
    allowed_vocab: int32 scalar; ids at or above it are never chosen.
    config: the model's config (hashable: a frozen ConfigDict).
    max_new_tokens: ids to add to each row.
    greedy: argmax instead of drawing.
    top_k: draw among this many ids (0 = all).

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
    token = _choose(
        last,
        jax.random.fold_in(key, i),
        temperature,
        greedy=greedy,
        top_k=top_k,
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
    config: Any,
    prompt_ids: Sequence[int],
    options: SamplingOptions,
    *,
    allowed_vocab: int = 0,
) -> np.ndarray:
  """Continues `prompt_ids` with the model.

  Args:
    params: the model's parameters (`transformer.init_params`' tree).
    config: the model's config, frozen (an ml_collections FrozenConfigDict:
      it is a static argument of the compiled loop).
    prompt_ids: 1 to config.max_sequence_length ids in [0, vocab_size).
    options: how many ids to generate, and how to choose them.
    allowed_vocab: ids at or above this are never chosen (a tokenizer
      smaller than the model's vocabulary); 0 = config.vocab_size.

  Returns:
    int32 [options.num_samples, options.max_new_tokens]: the new ids (the
    prompt excluded).

  Raises:
    TypeError/ValueError: `options` not SamplingOptions, top_k above the
      vocabulary, or a prompt that is empty, longer than
      max_sequence_length, or holds an id outside the vocabulary (named,
      with the value).
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
  prompt = [int(checks.check_int("prompt id", i)) for i in prompt_ids]
  length = config.max_sequence_length
  if not prompt:
    raise ValueError("prompt is empty: give at least one token")
  if len(prompt) > length:
    raise ValueError(
        f"prompt holds {len(prompt)} tokens, more than the model's "
        f"max_sequence_length {length}; shorten it"
    )
  bad = [i for i in prompt if not 0 <= i < vocab]
  if bad:
    raise ValueError(
        f"prompt id {bad[0]} is outside the model's vocabulary [0, {vocab})"
    )
  window = np.zeros((options.num_samples, length), np.int32)
  window[:, : len(prompt)] = prompt
  greedy = options.greedy
  out = _sample_loop(
      params,
      jnp.asarray(window),
      jnp.int32(len(prompt)),
      jax.random.PRNGKey(options.seed),
      jnp.float32(options.temperature if not greedy else 1.0),
      jnp.int32(allowed_vocab),
      config=config,
      max_new_tokens=options.max_new_tokens,
      greedy=greedy,
      top_k=options.top_k if not greedy else 0,
  )
  return np.asarray(jax.device_get(out))
