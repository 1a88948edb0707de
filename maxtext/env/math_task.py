"""The built-in math task: word problems with a numeric answer.

Each problem is one of a few story templates (sums, differences, products,
a sum then a product) with numbers drawn for its index; its record holds the
question ("prompt") and the answer ("answer", an integer as text). The
split is by the problem's text: a problem whose text hashes to 0 mod 8 is
held out, so no held-out question is ever drawn for training, and the
held-out set is the first `num_eval` of them by index.

`correct(prompt, completion, answer)` is the verifier, a reward function of
the text form: the model's answer is read and compared with `math-verify`
(the last number or `\\boxed{}` value in the text, compared as a number).
`demonstration` writes the worked solution, ending in `\\boxed{answer}`.
"""

import hashlib
from typing import Any

import numpy as np

from maxtext.env import tasks

_NAMES = ("Ann", "Bo", "Cy", "Di", "Ed", "Flo")
_THINGS = ("apples", "coins", "books", "pens", "shells")

# (question, worked solution, answer) templates over numbers a, b, c.
_TEMPLATES = (
    (
        "{n} has {a} {t} and gets {b} more. How many {t} now?",
        "{a}+{b}={r}",
        lambda a, b, c: a + b,
    ),
    (
        "{n} has {a} {t} and gives away {b}. How many {t} are left?",
        "{a}-{b}={r}",
        lambda a, b, c: a - b,
    ),
    (
        "{n} buys {a} boxes of {b} {t}. How many {t}?",
        "{a}*{b}={r}",
        lambda a, b, c: a * b,
    ),
    (
        "{n} has {a} bags of {b} {t} and {c} loose {t}. How many {t}?",
        "{a}*{b}+{c}={r}",
        lambda a, b, c: a * b + c,
    ),
)


def _held_out(prompt: str) -> bool:
  return hashlib.sha256(prompt.encode()).digest()[0] % 8 == 0


def problem(index: int) -> dict[str, Any]:
  """Problem `index` (>= 0): its record."""
  rng = np.random.default_rng([7, index])
  kind = int(rng.integers(len(_TEMPLATES)))
  question, working, fn = _TEMPLATES[kind]
  a, b, c = (int(x) for x in rng.integers(2, 10, size=3))
  if kind == 1 and b > a:
    a, b = b, a
  values = dict(
      n=_NAMES[int(rng.integers(len(_NAMES)))],
      t=_THINGS[int(rng.integers(len(_THINGS)))],
      a=a,
      b=b,
      c=c,
      r=fn(a, b, c),
  )
  return {
      "id": f"math-{index}",
      "prompt": question.format(**values),
      "answer": str(values["r"]),
      "working": working.format(**values),
  }


def correct(prompt: str, completion: str, answer: str, **fields) -> float:
  """1.0 when the completion's answer equals `answer` (math-verify)."""
  del prompt, fields
  # Imported here: only the processes that verify load sympy.
  import math_verify  # pylint: disable=import-outside-toplevel

  got = math_verify.parse(completion)
  if not got:
    return 0.0
  return float(math_verify.verify(math_verify.parse(answer), got))


class MathTask(tasks.Task):
  """Word problems (module docstring)."""

  kind = "math"

  def __init__(self, num_eval: int, seed: int = 0):
    if num_eval < 1:
      raise ValueError(f"grpo_eval_prompts={num_eval}: must be >= 1")
    self._seed = seed
    self._eval = []
    index = 0
    while len(self._eval) < num_eval:
      record = problem(index)
      if _held_out(record["prompt"]):
        self._eval.append(record)
      index += 1

  def train_records(self, step: int, count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng([self._seed, 1, step])
    out = []
    while len(out) < count:
      record = problem(int(rng.integers(0, 2**40)))
      if not _held_out(record["prompt"]):
        out.append(record)
    return out

  def eval_records(self) -> list[dict[str, Any]]:
    return list(self._eval)

  def demonstration(self, record: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": record["prompt"]},
        {
            "role": "assistant",
            "content": f"{record['working']}. \\boxed{{{record['answer']}}}",
        },
    ]


def make_task(num_eval: int, seed: int = 0) -> MathTask:
  """`config.grpo_task = "maxtext.env.math_task:make_task"`."""
  return MathTask(num_eval, seed)
