"""Reward functions: code the user names in the config, called per completion.

`config.grpo_reward_functions` names them, comma-separated, as
`module:function` with an optional `=weight` (1 when left out), e.g.
`maxtext.grpo.progression_task:exact_match=1.0,my_rewards:brevity=0.1`.
Each is a plain Python function

    reward(prompt, completion) -> float

called once per completion with the prompt's and the completion's token ids
(tuples of ints; a completion ends at its stop id, which it keeps). A step's
reward of a completion is the weighted sum of the functions' values; each
function's own mean is reported as `rewards/<function>`.

A reward that raises, or returns anything but a finite number, is an error
of the run, never a silent zero: `RewardError` carries one line naming the
function, the prompt index (within the step's prompts), the sample and the
problem.
"""

import dataclasses
import importlib
import math
from typing import Callable, Sequence

import numpy as np

_FIELD = "config.grpo_reward_functions"


class RewardError(RuntimeError):
  """A reward function raised or returned a non-finite value (one line)."""


@dataclasses.dataclass(frozen=True)
class RewardFunction:
  """One named reward function and its weight.

  Attributes:
    name: "module:function", as the config names it.
    fn: the function.
    weight: its weight in the completion's total reward.
  """

  name: str
  fn: Callable[..., float]
  weight: float

  @property
  def short_name(self) -> str:
    """The function's name, as in `rewards/<short_name>`."""
    return self.name.rsplit(":", 1)[-1]


def parse(spec: str) -> list[tuple[str, float]]:
  """(name, weight) pairs of a `grpo_reward_functions` value; imports nothing.

  Raises:
    ValueError: one line naming the field and the bad entry.
  """
  entries = [part.strip() for part in spec.split(",")]
  if not any(entries):
    raise ValueError(f"{_FIELD}={spec!r}: name at least one module:function")
  out = []
  for entry in entries:
    name, _, weight_text = entry.partition("=")
    name = name.strip()
    module, _, function = name.partition(":")
    if not module or not function or ":" in function:
      raise ValueError(
          f"{_FIELD}={spec!r}: {entry!r} is not module:function[=weight]"
      )
    try:
      weight = float(weight_text) if weight_text.strip() else 1.0
    except ValueError:
      raise ValueError(
          f"{_FIELD}={spec!r}: {entry!r} has a weight that is not a number"
      ) from None
    if not math.isfinite(weight):
      raise ValueError(f"{_FIELD}={spec!r}: {entry!r}: weight must be finite")
    out.append((name, weight))
  short = [n.rsplit(":", 1)[-1] for n, _ in out]
  if len(set(short)) != len(short):
    raise ValueError(
        f"{_FIELD}={spec!r}: two functions share a name ({short}); each "
        "is reported as rewards/<function>"
    )
  return out


def load(spec: str) -> list[RewardFunction]:
  """Imports every function `spec` names; call before any device work.

  Raises:
    ValueError: one line naming the field and the entry that does not
      parse, import or name a callable.
  """
  functions = []
  for name, weight in parse(spec):
    module_name, function_name = name.split(":")
    try:
      module = importlib.import_module(module_name)
    except Exception as exc:
      # Whatever the import raises, the user's answer is the same line.
      raise ValueError(
          f"{_FIELD}: {name!r} does not import: {type(exc).__name__}: {exc}"
      ) from None
    fn = getattr(module, function_name, None)
    if not callable(fn):
      raise ValueError(
          f"{_FIELD}: {name!r}: module {module_name!r} has no function "
          f"{function_name!r}"
      )
    functions.append(RewardFunction(name, fn, weight))
  return functions


@dataclasses.dataclass(frozen=True)
class Rewards:
  """Every completion's rewards.

  Attributes:
    total: float64 [N]: the weighted sum per completion.
    per_function: short name -> float64 [N]: each function's own values.
  """

  total: np.ndarray
  per_function: dict[str, np.ndarray]


def score(
    functions: Sequence[RewardFunction],
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    num_generations: int,
) -> Rewards:
  """Calls every function on every (prompt, completion).

  Args:
    functions: from `load`.
    prompts: P id sequences.
    completions: P x G id sequences, prompt-major (completion r continues
      prompt r // num_generations).
    num_generations: G.

  Raises:
    RewardError: one line naming the function, the prompt index, the sample
      and the exception or the value returned.
  """
  if len(completions) != len(prompts) * num_generations:
    raise ValueError(
        f"{len(completions)} completions for {len(prompts)} prompts x "
        f"{num_generations} generations"
    )
  per_function = {}
  total = np.zeros(len(completions))
  for function in functions:
    values = np.zeros(len(completions))
    for row, completion in enumerate(completions):
      index, sample = divmod(row, num_generations)
      where = (
          f"reward function {function.name} on prompt {index} "
          f"(sample {sample})"
      )
      try:
        value = function.fn(tuple(prompts[index]), tuple(completion))
      except Exception as exc:
        # User code: any exception stops the run with this one line.
        raise RewardError(
            f"{where} raised {type(exc).__name__}: {exc}"
        ) from exc
      if isinstance(value, bool) or not isinstance(
          value, (int, float, np.integer, np.floating)
      ):
        raise RewardError(
            f"{where} returned {value!r}: a reward is a finite number"
        )
      if not math.isfinite(float(value)):
        raise RewardError(
            f"{where} returned {float(value)!r}: a reward must be finite"
        )
      values[row] = float(value)
    per_function[function.short_name] = values
    total += function.weight * values
  return Rewards(total, per_function)
