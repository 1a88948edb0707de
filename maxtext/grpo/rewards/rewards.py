"""Reward functions: code the user names in the config, called per completion.

`config.grpo_reward_functions` names them, comma-separated, as
`module:function` with an optional `=weight` (1 when left out), e.g.
`maxtext.grpo.tasks.progression_task:exact_match=1.0,my_rewards:brevity=0.1`.
Each is a plain Python function, in one of two forms:

    reward(prompt, completion) -> float                   # ids
    reward(prompt, completion, **task_fields) -> float    # text

called once per completion. The ids form (the built-in progression task)
gets the prompt's and the completion's token ids (tuples of ints; a
completion ends at its stop id, which it keeps). The text form (a task of
text records, `maxtext/env/`) gets the prompt's text, the model's text (its
turns, decoded, joined by a newline) and the task record's other fields as
keyword arguments (a math problem's "answer", say; take `**_` for the rest).
A step's reward of a completion is the weighted sum of the functions'
values; each function's own mean is reported as `rewards/<function>`.

A reward that raises (any exception, `SystemExit` and overflow included),
returns anything but a finite real number (`10**400` is too large for a
float), or makes the weighted total non-finite, is an error of the run,
never a silent zero: `RewardError` carries one line naming the function,
the prompt index (within the step's prompts), the sample and the problem.

Timeouts: `load(spec, timeout_seconds)` (the run passes
`config.grpo_reward_timeout_seconds`) calls the functions in a worker
process (`reward_worker`), so a call that does not return within the
timeout is stopped and is a `RewardError` naming the function and the
prompt. Functions of `__main__` (which a worker cannot import), and
functions given without a timeout, are called in this process.

In a run of several processes the functions run once per job: process 0
scores the completions and every process takes its values, or its error
line, from it (`share.from_lead`), so a function whose value or failure
depends on where it runs (a clock, a remote judge, a file) cannot make the
processes diverge, and all stop at the same step when it fails.
"""

import dataclasses
import math
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from maxtext.env import share
from maxtext.grpo.rewards import reward_call
from maxtext.grpo.rewards import reward_worker
from maxtext.run import batch_source

_FIELD = reward_call.FIELD


class RewardError(batch_source.UserCodeError):
  """A reward function raised or returned a non-finite value (one line);
  the training loop checkpoints the last completed step before it goes
  on."""


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
  # Calls through this worker (`reward_worker.Worker`) as function
  # `index` of its names, under its timeout; None: calls in this process.
  worker: Any = dataclasses.field(default=None, compare=False)
  index: int = 0

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


def load(
    spec: str, timeout_seconds: Optional[float] = None
) -> list[RewardFunction]:
  """Imports every function `spec` names; call before any device work.

  Args:
    spec: the `grpo_reward_functions` value.
    timeout_seconds: the most a call may take (> 0); the functions then
      run in a worker process (but those of `__main__`). None: in this
      process, without a timeout.

  Raises:
    ValueError: one line naming the field and the entry that does not
      parse, import or name a callable.
  """
  if timeout_seconds is not None and not timeout_seconds > 0:
    raise ValueError(
        f"config.grpo_reward_timeout_seconds={timeout_seconds}: must be > 0"
    )
  entries = parse(spec)
  functions = [
      (name, reward_call.import_function(name), w) for name, w in entries
  ]
  in_worker = [
      name for name, _, _ in functions if not name.startswith("__main__:")
  ]
  worker = None
  if timeout_seconds is not None and in_worker:
    worker = reward_worker.Worker(in_worker, timeout_seconds)
  return [
      RewardFunction(
          name,
          fn,
          weight,
          worker if name in in_worker else None,
          in_worker.index(name) if name in in_worker else 0,
      )
      for name, fn, weight in functions
  ]


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
    prompts: Sequence[Any],
    completions: Sequence[Any],
    num_generations: int,
    fields: Optional[Sequence[dict[str, Any]]] = None,
) -> Rewards:
  """Calls every function on every (prompt, completion), once per job (on
  process 0; every process gets its values).

  Args:
    functions: from `load`.
    prompts: P id sequences, or P texts.
    completions: P x G id sequences (or texts), prompt-major (completion r
      continues prompt r // num_generations).
    num_generations: G.
    fields: per prompt, the keyword arguments of the text form (None: the
      ids form).

  Raises:
    RewardError: one line naming the function, the prompt index, the sample
      and the exception or the value returned (process 0's, on every
      process).
  """
  if len(completions) != len(prompts) * num_generations:
    raise ValueError(
        f"{len(completions)} completions for {len(prompts)} prompts x "
        f"{num_generations} generations"
    )
  if jax.process_count() == 1:
    per_function, total = score_here(
        functions, prompts, completions, num_generations, fields
    )
    return Rewards(total, per_function)
  outcome = None
  if share.is_lead():
    try:
      per_function, total = score_here(
          functions, prompts, completions, num_generations, fields
      )
      outcome = {
          "total": total.tolist(),
          "per_function": {k: v.tolist() for k, v in per_function.items()},
      }
    except RewardError as e:
      outcome = {"error": str(e)}
  # JSON carries a finite float64 exactly (its shortest repr).
  outcome = share.from_lead(outcome)
  if "error" in outcome:
    raise RewardError(outcome["error"])
  return Rewards(
      np.asarray(outcome["total"], np.float64),
      {
          k: np.asarray(v, np.float64)
          for k, v in outcome["per_function"].items()
      },
  )


def _where(function: RewardFunction, row: int, num_generations: int) -> str:
  index, sample = divmod(row, num_generations)
  return f"reward function {function.name} on prompt {index} (sample {sample})"


def _values(
    function, prompts, completions, num_generations, fields
) -> np.ndarray:
  """One function's values of every completion; RewardError on a failure."""
  pairs = [
      (
          reward_call.as_argument(prompts[row // num_generations]),
          reward_call.as_argument(completion),
      )
      + (() if fields is None else (fields[row // num_generations],))
      for row, completion in enumerate(completions)
  ]
  if function.worker is None:
    answers = (reward_call.check_call(function.fn, *p) for p in pairs)
  else:
    answers = function.worker.calls(function.index, pairs)
  values = np.zeros(len(completions))
  row = 0
  try:
    for row, answer in enumerate(answers):
      if "error" in answer:
        raise RewardError(
            f"{_where(function, row, num_generations)} {answer['error']}"
        )
      values[row] = answer["value"]
  except reward_worker.Timeout:
    raise RewardError(
        f"{_where(function, row, num_generations)} did not return within "
        f"{function.worker.timeout_s:g} s "
        "(config.grpo_reward_timeout_seconds); it was stopped"
    ) from None
  except reward_worker.Died as e:
    raise RewardError(
        f"{_where(function, row, num_generations)} ended the reward worker "
        f"process ({e})"
    ) from None
  return values


def score_here(functions, prompts, completions, num_generations, fields=None):
  """(per function values, weighted totals), computed in this process
  (`score` computes them on process 0 alone and shares them); RewardError
  on a failure or a non-finite total."""
  per_function = {}
  total = np.zeros(len(completions))
  for function in functions:
    values = _values(function, prompts, completions, num_generations, fields)
    per_function[function.short_name] = values
    with np.errstate(over="ignore", invalid="ignore"):
      total += function.weight * values
  bad = np.flatnonzero(~np.isfinite(total))
  if bad.size:
    index, sample = divmod(int(bad[0]), num_generations)
    raise RewardError(
        f"the weighted reward of prompt {index} (sample {sample}) is "
        f"{float(total[bad[0]])!r}: weights x values "
        + " + ".join(
            f"{f.weight:g} x {per_function[f.short_name][bad[0]]:g}"
            for f in functions
        )
        + f" overflow ({_FIELD})"
    )
  return per_function, total
