"""The built-in verifiable task: continue an arithmetic progression exactly.

The default config pretrains on progressions (a + d t) mod vocab_size with
d in `maxtext.data.builtin_datasets.SYNTHETIC_STEPS`. Here a prompt is the first
`prompt_length` (>= 2) terms of such a progression and a completion is
right when it continues it with the next `completion_length` terms. The
prompts are drawn so that no term wraps past the vocabulary, so the answer
follows from the prompt alone (d = its last term minus the one before) and
the reward functions need nothing but (prompt, completion).

Every (start, difference) pair that fits is one prompt; a fixed permutation
of them puts the first `num_eval` aside as held-out prompts, never drawn for
training. Training prompts of step s are a function of (seed, s), so a
resumed run draws the prompts an uninterrupted one would.
"""

from typing import Sequence

import numpy as np

from maxtext.data import builtin_datasets


def expected_continuation(prompt: Sequence[int], length: int) -> list[int]:
  """The `length` terms after `prompt` (>= 2 terms)."""
  step = prompt[-1] - prompt[-2]
  return [prompt[-1] + step * (i + 1) for i in range(length)]


def exact_match(prompt: Sequence[int], completion: Sequence[int]) -> float:
  """1 when the completion is the progression's next terms, else 0.

  Its length is the completion's own: a stop id or the length limit ends it;
  an empty completion scores 0.
  """
  if len(prompt) < 2:
    raise ValueError(f"a prompt needs 2 terms to fix the step; got {prompt}")
  if not completion:
    return 0.0
  want = expected_continuation(prompt, len(completion))
  return float(list(completion) == want)


def prefix_match(prompt: Sequence[int], completion: Sequence[int]) -> float:
  """The fraction of the completion that is right before its first error."""
  if len(prompt) < 2:
    raise ValueError(f"a prompt needs 2 terms to fix the step; got {prompt}")
  if not completion:
    return 0.0
  want = expected_continuation(prompt, len(completion))
  right = 0
  for got, expected in zip(completion, want):
    if got != expected:
      break
    right += 1
  return right / len(completion)


class ProgressionTask:
  """Training and held-out prompts of the progression task.

  Args:
    vocab_size: the model's vocabulary; every term stays below it.
    prompt_length: terms given (>= 2).
    completion_length: terms asked for (>= 1).
    num_eval: held-out prompts (>= 1), fewer than all prompts.
    seed: the run's seed (training draws).

  Raises:
    ValueError: naming the argument when the task is impossible.
  """

  def __init__(
      self,
      vocab_size: int,
      prompt_length: int,
      completion_length: int,
      num_eval: int,
      seed: int = 0,
  ):
    if prompt_length < 2:
      raise ValueError(
          f"grpo_prompt_length={prompt_length}: the progression task needs "
          ">= 2 terms to fix the step"
      )
    if completion_length < 1:
      raise ValueError(f"completion_length={completion_length}: must be >= 1")
    span = prompt_length + completion_length - 1
    pairs = [
        (start, step)
        for step in builtin_datasets.SYNTHETIC_STEPS
        for start in range(vocab_size)
        if start + step * span < vocab_size
    ]
    if num_eval < 1 or num_eval >= len(pairs):
      raise ValueError(
          f"grpo_eval_prompts={num_eval}: must be in [1, {len(pairs)}) for "
          f"vocab_size={vocab_size} and {span + 1} terms"
      )
    order = np.random.default_rng(0).permutation(len(pairs))
    pairs = np.asarray(pairs)[order]
    self._eval, self._train = pairs[:num_eval], pairs[num_eval:]
    self._prompt_length = prompt_length
    self._completion_length = completion_length
    self._seed = seed

  def _prompts(self, pairs: np.ndarray) -> list[list[int]]:
    t = np.arange(self._prompt_length)
    return [list(map(int, a + d * t)) for a, d in pairs]

  @property
  def num_train_prompts(self) -> int:
    """How many distinct training prompts there are."""
    return len(self._train)

  def train_prompts(self, step: int, count: int) -> list[list[int]]:
    """The `count` training prompts of step `step`."""
    rng = np.random.default_rng([self._seed, 0, step])
    return self._prompts(self._train[rng.integers(0, len(self._train), count)])

  def eval_prompts(self) -> list[list[int]]:
    """The held-out prompts, always the same ones."""
    return self._prompts(self._eval)

  def answers(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """The right completion of each prompt."""
    return [expected_continuation(p, self._completion_length) for p in prompts]
