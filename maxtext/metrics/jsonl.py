"""The `metrics.jsonl` record format: one schema for writers and readers.

A run writes `<run_dir>/metrics.jsonl`: one JSON object per line, e.g.

  {"step": 3, "kind": "train", "loss": 2.5, ..., "step_time_s": 0.1}
  {"step": 3, "kind": "eval", "eval_loss": 2.75, "eval_time": 0.4}

Every record has an int "step" (the trainer's 0-based step index; an eval
record carries the train step it follows) and a "kind", "train" or "eval".
The other keys are metric names mapping to numbers. A train record's loss is
under "loss"; an eval record's metrics carry the "eval_" prefix, so its loss
is under "eval_loss" (`metric_key` gives the key of a metric for a kind).

JSON has no NaN or infinity, so non-finite values are written as the strings
"NaN", "Infinity" and "-Infinity" (the spellings Python's `float()` parses
back); `read_jsonl` turns them back into floats.

This module has no TensorBoard or JAX dependency, so tools can read a run's
metrics without loading the training stack.
"""

from collections.abc import Mapping
import json
import math
import os
import tempfile
from typing import Any

from absl import logging

from maxtext.core import checks
from maxtext.metrics import throughput

METRICS_FILENAME = "metrics.jsonl"

# Record kinds.
TRAIN = "train"
EVAL = "eval"
KINDS = (TRAIN, EVAL)

# Keys every record has; metric names may not use them.
STEP_KEY = "step"
KIND_KEY = "kind"
RESERVED_KEYS = frozenset({STEP_KEY, KIND_KEY})

# Metric names of train records.
LOSS_KEY = "loss"
LEARNING_RATE_KEY = "learning_rate"
GRAD_NORM_KEY = "grad_norm"
STEP_TIME_KEY = "step_time_s"
TOKENS_PER_SECOND_KEY = "tokens_per_s"
# Seconds of the step's time the host spent waiting for the data set.
DATA_WAIT_KEY = "data_wait_s"

# Eval records name their metrics with this prefix: "eval_loss", "eval_time".
EVAL_PREFIX = "eval_"
EVAL_LOSS_KEY = EVAL_PREFIX + LOSS_KEY
EVAL_TIME_KEY = EVAL_PREFIX + "time"

# Fields that measure the machine's speed (times and the rates derived from
# them): two runs of the same training agree on everything else.
TIMING_KEYS = frozenset(
    {STEP_TIME_KEY, DATA_WAIT_KEY, EVAL_TIME_KEY, *throughput.KEYS}
)

_NON_FINITE_FROM_JSON = {
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}


def metric_key(kind: str, metric: str) -> str:
  """Returns the key under which a record of `kind` holds `metric`.

  Args:
    kind: "train" or "eval".
    metric: the metric's base name, e.g. "loss".

  Returns:
    `metric` for train records, "eval_" + `metric` for eval records
    (`metric_key("eval", "loss") == "eval_loss"`).

  Raises:
    ValueError: `kind` is not a record kind, or `metric` is empty.
  """
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  if not isinstance(metric, str) or not metric:
    raise ValueError(f"metric must be a non-empty str, got {metric!r}")
  return EVAL_PREFIX + metric if kind == EVAL else metric


def _json_value(value: int | float) -> int | float | str:
  if isinstance(value, float) and not math.isfinite(value):
    if math.isnan(value):
      return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
  return value


def encode_record(
    step: int, kind: str, scalars: Mapping[str, int | float]
) -> str:
  """Returns one `metrics.jsonl` line (without the newline).

  Args:
    step: the step index (>= 0).
    kind: "train" or "eval".
    scalars: metric name -> Python int or float; non-finite floats are
      written as "NaN", "Infinity" or "-Infinity".

  Raises:
    TypeError: `step` is not an int.
    ValueError: `step` is negative, `kind` is not a record kind, or a metric
      name is reserved ("step", "kind").
  """
  step = checks.check_int("step", step, 0)
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  reserved = RESERVED_KEYS.intersection(scalars)
  if reserved:
    raise ValueError(f"metric names {sorted(reserved)} are reserved")
  record = {STEP_KEY: step, KIND_KEY: kind}
  record.update((k, _json_value(v)) for k, v in scalars.items())
  return json.dumps(record, allow_nan=False)


def _decode_value(value: Any) -> Any:
  if isinstance(value, str) and value in _NON_FINITE_FROM_JSON:
    return _NON_FINITE_FROM_JSON[value]
  return value


def _parse_line(path: str, number: int, line: str) -> dict[str, Any]:
  """The record on line `number` of `path`, its non-finite values decoded.

  Raises:
    ValueError: the line is not JSON or not a record (names path:number).
  """
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(
        f"{path}:{number}: not valid JSON ({e}): {line[:80]!r}"
    ) from e
  if (
      not isinstance(record, dict)
      or not checks.is_int(record.get(STEP_KEY))
      or record.get(KIND_KEY) not in KINDS
  ):
    raise ValueError(
        f"{path}:{number}: expected an object with an int {STEP_KEY!r} and "
        f"{KIND_KEY!r} in {KINDS}, got {line[:80]!r}"
    )
  return {k: _decode_value(v) for k, v in record.items()}


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """Reads a `metrics.jsonl` file.

  A torn last line (a process killed mid-write) is dropped with a warning;
  any other malformed line is an error.

  Args:
    path: the file.

  Returns:
    The records in file order, non-finite values back as floats.

  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: a line other than the last is not a JSON object with an
      integer "step" and a "kind" of "train" or "eval"; names path and line.
  """
  path = os.fspath(path)
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  # A complete file ends with "\n", leaving one empty final element.
  torn_tail = lines[-1]
  lines = lines[:-1]
  records = [
      _parse_line(path, number, line)
      for number, line in enumerate(lines, start=1)
  ]
  if torn_tail:
    try:
      records.append(_parse_line(path, len(lines) + 1, torn_tail))
    except ValueError:
      logging.warning("%s: dropping a torn last line: %r", path, torn_tail[:80])
  return records


def read_untimed(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """`read_jsonl` without the `TIMING_KEYS` fields: what two runs of the same
  training (one resumed, one not; one warmed up, one not) must agree on."""
  return [
      {k: v for k, v in record.items() if k not in TIMING_KEYS}
      for record in read_jsonl(path)
  ]


def truncate_jsonl(path: str | os.PathLike[str], first_step: int) -> int:
  """Drops every record with step >= `first_step` from a metrics file.

  The file is rewritten through a temporary file and an atomic rename, so a
  crash during truncation leaves either the old or the new file. A missing
  file is left missing.

  Args:
    path: the `metrics.jsonl` file.
    first_step: the first step the resumed run will write (>= 0).

  Returns:
    The number of records kept.

  Raises:
    TypeError, ValueError: `first_step` is not an int >= 0.
    ValueError: the file is malformed (see `read_jsonl`).
  """
  first_step = checks.check_int("first_step", first_step, 0)
  path = os.fspath(path)
  if not os.path.exists(path):
    return 0
  kept = [r for r in read_jsonl(path) if r[STEP_KEY] < first_step]
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp_path = tempfile.mkstemp(
      dir=directory, prefix=".metrics.", suffix=".tmp"
  )
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      for r in kept:
        scalars = {k: v for k, v in r.items() if k not in RESERVED_KEYS}
        f.write(encode_record(r[STEP_KEY], r[KIND_KEY], scalars) + "\n")
    os.replace(tmp_path, path)
  except BaseException:
    os.unlink(tmp_path)
    raise
  return len(kept)
