"""One call of a reward function, judged: a finite real number or one line.

Shared by the run's process and the reward worker's (`reward_worker`), so a
value is judged the same wherever the function ran. Imports nothing of JAX:
the worker starts in a fraction of a second.
"""

import importlib
import math
from typing import Any, Callable, Optional

import numpy as np

FIELD = "config.grpo_reward_functions"
_FIELD = FIELD

# Modules of this project's own reward functions under the names earlier
# versions of it had (and wrote into runs' recorded configs), by their names
# now: a run recorded with an old name resumes with that name.
MOVED_MODULES = {
    "maxtext.grpo.progression_task": "maxtext.grpo.tasks.progression_task",
}


def import_function(name: str) -> Callable[..., float]:
  """The function "module:function" names, imported.

  Raises:
    ValueError: one line naming the field and the entry that does not
      import or name a callable.
  """
  module_name, function_name = name.split(":")
  try:
    module = importlib.import_module(
        MOVED_MODULES.get(module_name, module_name)
    )
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
  return fn


def check_call(
    fn: Callable[..., Any],
    prompt: Any,
    completion: Any,
    fields: Optional[dict[str, Any]] = None,
) -> dict:
  """Calls `fn(prompt, completion, **fields)`; {"value": float} or
  {"error": line}.

  `prompt` and `completion` are id tuples (the ids form) or texts (a text
  task's, with its record's fields as keyword arguments).

  Any exception (SystemExit and KeyboardInterrupt included: a reward does
  not end the run by itself) and any value that is not a finite real
  number is an error, said in one line.
  """
  try:
    value = fn(prompt, completion, **(fields or {}))
  # User code: anything it raises (SystemExit too) stops the run with this
  # one line.
  except BaseException as exc:  # pylint: disable=broad-exception-caught
    lines = str(exc).strip().splitlines()
    text = f": {lines[0]}" if lines else ""
    return {"error": f"raised {type(exc).__name__}{text}"}
  if isinstance(value, bool) or not isinstance(
      value, (int, float, np.integer, np.floating)
  ):
    return {"error": f"returned {value!r:.80}: a reward is a finite number"}
  try:
    number = float(value)
  except OverflowError:
    return {
        "error": f"returned an integer of {len(str(abs(int(value))))} digits, "
        "too large for a float: a reward is a finite number"
    }
  if not math.isfinite(number):
    return {"error": f"returned {number!r}: a reward must be finite"}
  return {"value": number}


def as_argument(value: Any) -> Any:
  """A prompt or completion as a reward function receives it: ids as a
  tuple of ints (JSON gives lists), text as it is."""
  return tuple(value) if isinstance(value, (list, tuple)) else value
