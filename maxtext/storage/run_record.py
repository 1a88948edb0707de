"""A run's record across attempts: the resume guard, the attempts, the seed.

A run directory belongs to one run, which may take several attempts (a
preempted or stopped run is started again with the same `run_name`). This
module keeps what each attempt ran with and refuses an attempt that would
continue the run with something else:

The run record holds the config as its values by field name
(`config_lib.to_json_dict`), the document config.json keeps: a record of the
whole config, compared and written whole, not settings this package reads.

- `check_resume(recorded, new)` compares the new config's record with the
  run's recorded one. Only the fields of `RESUMABLE_FIELDS` may change; a
  change to any other field is refused, naming each field with its old and
  new value.
  The learning-rate schedule is compared by its resolved length, so `steps`
  may change only while the schedule stays the same (see `check_resume`).
- `record_attempt(...)` keeps each attempt's resolved config: `config.json`
  is written by the first attempt and never rewritten; every attempt appends
  one line to `config_history.jsonl`.
- `resolve_seed(...)` turns `seed = -1` into a seed drawn from `os.urandom`
  on a fresh run and reuses the recorded seed on a resume, so a run is
  reproducible from its record. `config_lib.with_seed` gives the config
  copy the run then works on (and records).
- `finished_message(...)` says when a run's checkpoints are already past the
  step budget, so that the trainer can stop before it opens any output.

`data_shuffle_seed` takes no -1: it orders a tokens file, and a second drawn
seed would be a second random source to log and reproduce. It stays an
explicit config value (default 0) and, like every field outside
`RESUMABLE_FIELDS`, may not change on resume.
"""

import datetime
import json
import os
from typing import Any, Callable, Mapping, Optional

from absl import logging

from maxtext.core import checks
from maxtext.config import config_lib
from maxtext.config import optimizer
from maxtext.configs import base
from maxtext.storage import run_dir as run_dir_lib

CONFIG_JSON = "config.json"
CONFIG_HISTORY = "config_history.jsonl"

# `seed` value that asks for a fresh seed from os.urandom.
RANDOM_SEED = -1
# Drawn seeds are in [0, 2**31). jax.random.PRNGKey keeps only the low 32 bits
# of a seed unless jax_enable_x64 is on (PRNGKey(2**32) == PRNGKey(0)), so a
# wider seed would alias; 31 bits also fit every signed 32-bit reader of the
# MLPerf log.
SEED_BITS = 31

# Fields of maxtext/configs/base.py that may differ between the attempts of
# one run. None of them changes the model, the optimizer, the learning-rate
# schedule, the data a step reads or the MLPerf submission; every other field
# must match the recorded config.
RESUMABLE_FIELDS = frozenset(
    {
        # The step budget. The schedule's length is compared separately (0 =
        # steps makes it follow `steps`), see check_resume.
        "steps",
        # When to evaluate, and on how many of the fixed eval batches (batch
        # i is the same batch in every attempt). The eval batch size is not
        # here: it changes which sequences each eval batch holds.
        "eval_interval",
        "first_eval_samples",
        "eval_steps",
        # When to log, profile and checkpoint; how many checkpoints to keep.
        "log_period",
        "progress_interval_s",
        "profiler_steps",
        "profiler_start_step",
        "checkpoint_period",
        "max_checkpoints_to_keep",
        # How many skipped (non-finite) steps in a row stop the run: an
        # operator's guard, not part of training.
        "max_consecutive_skipped_steps",
        # Where the run's files are. The run directory itself is what is
        # being resumed: its recorded name may be "" (a generated name) and it
        # may have moved. A moved checkpoint directory restores the same
        # state: the state's shape and meaning are pinned by the fields that
        # must match.
        "run_name",
        "base_output_directory",
        "local_staging_directory",
        "checkpoint_directory",
        "mllog_file",
        # GCS mirror and run-lock timing.
        "gcs_sync_interval_seconds",
        "gcs_request_timeout_seconds",
        "gcs_startup_timeout_seconds",
        "gcs_final_timeout_seconds",
        "run_lock_refresh_interval_seconds",
        # Resume is how the later attempts start; start_over how one starts
        # again from step 0 (each attempt's value is in the history).
        "resume",
        "start_over",
        # Whether this attempt may read changed data files; the files'
        # fingerprints are in each attempt's provenance.
        "allow_data_change",
        # Whether this attempt may start from another KL reference than the
        # one the GRPO run pinned (maxtext/run/reference_pin.py records it).
        "grpo_allow_reference_change",
        # The machines. The state is restored into the new mesh's shardings,
        # and the data does not depend on the process count: each step's
        # global batch is drawn whole and every process keeps its rows
        # (maxtext/data/builtin_datasets.py), so a resume on another slice or
        # process count trains on the same data. Each attempt's devices are in
        # its provenance.
        "num_processes",
        "process_id",
        "coordinator_address",
        "distributed_init_timeout_seconds",
        "data_parallelism",
        "fsdp_parallelism",
        "dcn_data_parallelism",
        "dcn_fsdp_parallelism",
        "hardware",
        "allow_cpu_fallback",
        "jax_compilation_cache_dir",
        # Programs compiled ahead of time are the ones the run would compile
        # (the file is refused otherwise).
        "compiled_step_file",
        # How the same step is computed: the attention kernel ("auto" already
        # follows `hardware`), rematerialisation and loss chunking trade speed
        # for memory (a resume on a smaller accelerator may need them) without
        # changing what the gradients are; compute_dtype, which does, must
        # match. The compile warm-up before run_start leaves the state
        # untouched.
        "attention",
        "remat_policy",
        "loss_chunk_size",
        "mlp_chunks",
        "warmup_steps_before_run_start",
        # One copy of the state or two: the same update either way.
        "donate_state",
        # How long a reward call may take before it stops the run: an
        # operator's guard, not part of training.
        "grpo_reward_timeout_seconds",
    }
)
# Not resumable, on purpose: `enable_mllog`, `deferred_eval` and the
# submission fields (a submission's log must describe the run it was taken
# from, so turning the log or its deferred evaluation on or off mid-run is
# refused), `target_eval_loss` (the quality target decides when the run
# succeeds), `load_parameters_path` (the run's starting point),
# `gradient_accumulation_steps` (a logged hyperparameter that changes the
# step's arithmetic), data paths and seeds.

# Shown for a field one of the two configs lacks.
_ABSENT = "<absent>"


class ResumeRefusedError(ValueError):
  """The new config changes fields that may not change on resume."""


def _as_dict(record: Any, name: str) -> dict[str, Any]:
  """A plain dict of a config's record, values as JSON gives them."""
  if not isinstance(record, Mapping):
    raise TypeError(
        f"{name} must be a config's record (a mapping of field names to "
        f"values: config_lib.to_json_dict), got {type(record).__name__}"
    )
  # The recorded side went through JSON; so does this one, so that a tuple
  # and the list it was recorded as compare equal.
  return json.loads(json.dumps(dict(record)))


def _same(old: Any, new: Any) -> bool:
  # 30 and 30.0 are the same float field; True and 1 are not the same value.
  if isinstance(old, bool) or isinstance(new, bool):
    return type(old) is type(new) and old == new
  return old == new


def _schedule_length(values: Mapping[str, Any]) -> Optional[int]:
  if "lr_schedule_steps" not in values or "steps" not in values:
    return None
  return optimizer.schedule_length(values["lr_schedule_steps"], values["steps"])


def check_resume(
    recorded: Mapping[str, Any], new: Mapping[str, Any], *, run_name: str = ""
) -> list[tuple[str, Any, Any]]:
  """Compares a resuming attempt's config with the run's recorded config.

  Rules:
  - A field in `RESUMABLE_FIELDS` may change; every other field must be
    equal (numbers by value: 30 and 30.0 are equal).
  - `seed`: -1 in the new config matches any recorded seed (the recorded
    seed is reused, see `resolve_seed`); another value must equal it.
  - The learning-rate schedule is compared by its resolved length
    (`optimizer.lr_schedule_steps`: lr_schedule_steps, 0 = steps). So with
    lr_schedule_steps = 0 a change of `steps` changes the schedule and is
    refused; setting lr_schedule_steps to the recorded length keeps the
    schedule, and then `steps` may change (and the raw lr_schedule_steps
    change is listed as allowed).
  - A field the recorded config lacks (added to base.py since the run
    started) matches when the new value is its base.py default, and is then
    listed as a change; a field only the recorded config has (removed from
    base.py) is listed as a change: the code that read it is gone.

  Args:
    recorded: the run's recorded config (`load_recorded_config`).
    new: the new attempt's config's record (`config_lib.to_json_dict`).
    run_name: named in the refusal's first line.

  Returns:
    The allowed changes as (field, recorded value, new value), sorted by
    field, for the console (`describe_changes`). Values a side lacks are
    "<absent>".

  Raises:
    ResumeRefusedError (a ValueError): fields that may not change differ;
      the first line says so, then one line per field "name: old -> new".
    TypeError: an argument is not a config's record.
  """
  old = _as_dict(recorded, "recorded")
  values = _as_dict(new, "new")
  defaults = config_lib.to_json_dict(base.get_config())
  allowed, refused = _compare_fields(old, values, defaults)
  schedule_change = _schedule_change(old, values)
  if schedule_change is not None:
    allowed = [c for c in allowed if c[0] != "lr_schedule_steps"]
    refused.append(schedule_change)
    refused.sort()
  if refused:
    run = f"run {run_name!r}" if run_name else "the run"
    raise ResumeRefusedError(
        f"Refusing to resume {run}: {len(refused)} field(s) differ from the "
        f"run's recorded config and may not change on resume (start a new "
        f"run_name to change them):\n  " + "\n  ".join(refused)
    )
  return allowed


def _compare_fields(
    old: Mapping[str, Any],
    values: Mapping[str, Any],
    defaults: Mapping[str, Any],
) -> tuple[list[tuple[str, Any, Any]], list[str]]:
  """Judges each field of either config by `check_resume`'s rules, the
  schedule's length aside.

  Args:
    old: the recorded config's fields.
    values: the new config's fields.
    defaults: base.py's fields, for a field the recorded config lacks.

  Returns:
    The allowed changes as (field, recorded value, new value) and the
    refused ones as "name: old -> new" lines, both sorted by field; a raw
    lr_schedule_steps change is allowed here.
  """
  allowed, refused = [], []
  for key in sorted(set(old) | set(values)):
    if key not in old:
      if key in RESUMABLE_FIELDS or _same(
          defaults.get(key, _ABSENT), values[key]
      ):
        allowed.append((key, _ABSENT, values[key]))
      else:
        refused.append(
            f"{key}: {_ABSENT} (base default "
            f"{defaults.get(key, _ABSENT)!r}) -> {values[key]!r}"
        )
      continue
    if key not in values:
      allowed.append((key, old[key], _ABSENT))
      continue
    if _same(old[key], values[key]):
      continue
    if key == "seed" and values[key] == RANDOM_SEED:
      continue  # The recorded seed is reused.
    if key in RESUMABLE_FIELDS or key == "lr_schedule_steps":
      # lr_schedule_steps is judged by check_resume, by the schedule it
      # resolves to.
      allowed.append((key, old[key], values[key]))
    else:
      refused.append(f"{key}: {old[key]!r} -> {values[key]!r}")
  return allowed, refused


def _schedule_change(
    old: Mapping[str, Any], values: Mapping[str, Any]
) -> Optional[str]:
  """The refusal line of a changed learning-rate schedule length, or None
  when it is unchanged (or a side does not resolve one)."""
  old_length, new_length = _schedule_length(old), _schedule_length(values)
  if old_length is None or new_length is None or old_length == new_length:
    return None
  return (
      f"learning-rate schedule length (lr_schedule_steps, 0 = steps): "
      f"{old_length} -> {new_length} (recorded lr_schedule_steps="
      f"{old['lr_schedule_steps']}, steps={old['steps']}; new "
      f"lr_schedule_steps={values['lr_schedule_steps']}, steps="
      f"{values['steps']}); set lr_schedule_steps={old_length} to change "
      f"steps and keep the schedule"
  )


def describe_changes(changes: list[tuple[str, Any, Any]]) -> str:
  """Console text for `check_resume`'s allowed changes ("" if none)."""
  if not changes:
    return ""
  return "Resuming with changed fields (allowed on resume):\n  " + "\n  ".join(
      f"{key}: {old!r} -> {new!r}" for key, old, new in changes
  )


def _read_history(path: str) -> list[dict[str, Any]]:
  """The attempts of config_history.jsonl that parse, oldest first.

  A line cut short by a crash mid-append is skipped with a warning; the
  lines after it still count.
  """
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except FileNotFoundError:
    return []
  attempts = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      attempt = json.loads(line)
    except ValueError:
      logging.warning(
          "%s line %d is not JSON (cut short?); skipped.", path, number
      )
      continue
    if isinstance(attempt, dict) and isinstance(attempt.get("config"), dict):
      attempts.append(attempt)
    else:
      logging.warning("%s line %d holds no attempt; skipped.", path, number)
  return attempts


def read_config_json(run_dir: str) -> Optional[dict[str, Any]]:
  """The run's config.json document ({"config", "provenance"}); None where
  the run directory has no config.json.

  Raises:
    ValueError: the file is not JSON or holds no 'config' object.
  """
  path = os.path.join(run_dir, CONFIG_JSON)
  try:
    with open(path, encoding="utf-8") as f:
      document = json.load(f)
  except FileNotFoundError:
    return None
  except ValueError as e:
    raise ValueError(
        f"{path} is not valid JSON ({e}); the run's recorded "
        f"config cannot be read"
    ) from e
  if not isinstance(document, dict) or not isinstance(
      document.get("config"), dict
  ):
    raise ValueError(
        f"{path} holds no 'config' object; the run's recorded "
        f"config cannot be read"
    )
  return document


def recorded_data(run_dir: str) -> Optional[dict[str, Any]]:
  """The data provenance of the run's newest recorded attempt, or None.

  The newest attempt's, so that a change allowed once (allow_data_change)
  is the reference for the attempts after it.
  """
  for attempt in reversed(_read_history(os.path.join(run_dir, CONFIG_HISTORY))):
    data = (attempt.get("provenance") or {}).get("data")
    if data is not None:
      return data
  document = read_config_json(run_dir)
  if document is None:
    return None
  return (document.get("provenance") or {}).get("data")


def load_recorded_config(run_dir: str) -> Optional[dict[str, Any]]:
  """The config of the run's newest recorded attempt, or None for a new run.

  The newest attempt is the last line of config_history.jsonl; a run
  directory written before that file existed has only config.json.

  Args:
    run_dir: the local run directory.

  Returns:
    The recorded config as a dict, or None when the run directory records no
    attempt.

  Raises:
    ValueError: config.json exists but cannot be read as a run record.
  """
  attempts = _read_history(os.path.join(run_dir, CONFIG_HISTORY))
  if attempts:
    return attempts[-1]["config"]
  document = read_config_json(run_dir)
  return None if document is None else document["config"]


def new_run_id() -> str:
  """A fresh run id: 32 hex digits from os.urandom."""
  return os.urandom(16).hex()


def recorded_run_id(run_dir: str) -> Optional[str]:
  """The id the run recorded at its first attempt (its provenance's
  `run_id`); None for a run recorded before runs had ids, or none yet."""
  attempts = _read_history(os.path.join(run_dir, CONFIG_HISTORY))
  if attempts:
    provenance = attempts[0].get("provenance") or {}
  else:
    document = read_config_json(run_dir)
    provenance = {} if document is None else document.get("provenance") or {}
  run_id = provenance.get("run_id")
  return run_id if isinstance(run_id, str) and run_id else None


def record_attempt(
    run_dir: str,
    record: Mapping[str, Any],
    provenance: Mapping[str, Any],
    start_step: int,
    *,
    now: Optional[datetime.datetime] = None,
) -> int:
  """Records one attempt of the run; call it on the writing process only.

  The first attempt writes config.json ({"config": ..., "provenance": ...},
  `start_step` added to the provenance); later attempts leave it as it is
  (a missing one is written again from the first recorded attempt). Every
  attempt, the first included, appends one line to config_history.jsonl:
  {"attempt", "time_utc", "start_step", "config", "provenance"}.

  Args:
    run_dir: the local run directory (it must exist).
    record: the attempt's resolved config (its seed resolved) as its
      values by field name (`config_lib.to_json_dict`).
    provenance: what produced the attempt (`run_dir.provenance()` plus the
      run's name and mirror URL); JSON-serialisable.
    start_step: completed steps when the attempt starts.
    now: the attempt's start time (tests); defaults to now, in UTC.

  Returns:
    The attempt's number, 1 for the first.

  Raises:
    TypeError/ValueError: a bad argument (named).
  """
  start_step = checks.check_int("start_step", start_step, 0)
  if not isinstance(provenance, Mapping):
    raise TypeError(
        f"provenance must be a mapping, got {type(provenance).__name__}"
    )
  if now is None:
    now = datetime.datetime.now(datetime.timezone.utc)
  if not isinstance(now, datetime.datetime):
    raise TypeError(f"now must be a datetime.datetime, got {now!r}")
  values = _as_dict(record, "record")
  history_path = os.path.join(run_dir, CONFIG_HISTORY)
  attempts = _read_history(history_path)
  if read_config_json(run_dir) is None:
    _write_first_config(
        run_dir,
        (
            attempts[0]
            if attempts
            else dict(
                config=values, provenance=provenance, start_step=start_step
            )
        ),
    )
  _append_history(
      history_path, len(attempts) + 1, now, start_step, values, provenance
  )
  return len(attempts) + 1


def _write_first_config(run_dir: str, first: Mapping[str, Any]) -> None:
  """Writes config.json from the first attempt's history entry (its config,
  and its provenance with its start_step)."""
  # The run holds its directory's lock: nobody else writes config.json.
  run_dir_lib.write_config_json(
      os.path.join(run_dir, CONFIG_JSON),
      first["config"],
      dict(
          first.get("provenance") or {}, start_step=first.get("start_step", 0)
      ),
  )


def _append_history(
    path: str,
    attempt: int,
    now: datetime.datetime,
    start_step: int,
    values: Mapping[str, Any],
    provenance: Mapping[str, Any],
) -> None:
  """Appends the attempt's line to config_history.jsonl at `path`, synced
  to disk (see `record_attempt`)."""
  line = json.dumps(
      {
          "attempt": attempt,
          "time_utc": now.astimezone(datetime.timezone.utc).isoformat(),
          "start_step": start_step,
          "config": values,
          "provenance": dict(provenance),
      },
      sort_keys=True,
  )
  with open(path, "a+b") as f:
    # A previous attempt that died mid-append left no newline; start afresh
    # so that its fragment stays one unreadable line, not two.
    f.seek(0, os.SEEK_END)
    if f.tell():
      f.seek(-1, os.SEEK_END)
      if f.read(1) != b"\n":
        f.write(b"\n")
    f.write(line.encode() + b"\n")
    f.flush()
    os.fsync(f.fileno())


def new_seed() -> int:
  """A seed from os.urandom, in [0, 2**SEED_BITS).

  Multi-process runs draw it on process 0 and broadcast it, like the run
  name, so that every process initialises and reads the same data.
  """
  return int.from_bytes(os.urandom(4), "little") >> (32 - SEED_BITS)


def resolve_seed(
    seed: Any,
    recorded: Optional[Mapping[str, Any]],
    *,
    draw: Callable[[], int] = new_seed,
) -> int:
  """The run's seed, logged here and nowhere else.

  - Resuming (`recorded` is not None): the recorded seed (the new config's
    seed is -1 or the same; `check_resume` refuses anything else).
  - A fresh run with seed = -1: a new seed from `draw()`.
  - Otherwise: `seed`.

  Args:
    seed: the attempt's config.seed.
    recorded: the run's recorded config, None for a fresh run.
    draw: where a fresh seed comes from (multi-process runs pass one that
      draws on process 0 and broadcasts; tests pass a fake).

  Returns:
    A non-negative seed.

  Raises:
    ValueError: the recorded seed is not a seed, differs from a concrete new
      seed, or `draw` returned something outside [0, 2**SEED_BITS).
  """
  if recorded is not None:
    old = recorded.get("seed")
    if not checks.is_int(old) or isinstance(old, bool) or old < 0:
      raise ValueError(
          f"the run's recorded config has seed={old!r}, not a "
          f"resolved seed; the run cannot be resumed with it"
      )
    if seed not in (RANDOM_SEED, old):
      raise ValueError(
          f"config.seed={seed!r} differs from the run's recorded "
          f"seed {old}; use {old} or -1 to resume"
      )
    logging.info("Seed %d, recorded by the run (resume).", old)
    return int(old)
  if seed == RANDOM_SEED:
    drawn = draw()
    if not checks.is_int(drawn) or not 0 <= drawn < 2**SEED_BITS:
      raise ValueError(
          f"the drawn seed {drawn!r} is not in [0, 2**{SEED_BITS})"
      )
    logging.info("Seed %d, drawn from os.urandom (config.seed=-1).", drawn)
    return int(drawn)
  seed = checks.check_int("config.seed", seed, 0)
  logging.info("Seed %d, from the config.", seed)
  return seed


def finished_message(
    run_name: str, latest_checkpoint_step: Optional[int], steps: int
) -> Optional[str]:
  """Says that a run has nothing left to train, or None if it has.

  A run whose newest checkpoint has completed `steps` steps or more is
  done: the trainer logs the message and exits 0 before it opens the MLPerf
  log, so no attempt file without an evaluation is left behind.

  Args:
    run_name: the run's name, for the message.
    latest_checkpoint_step: the newest checkpoint's step, None if none.
    steps: the new config's step budget.

  Returns:
    The message, or None when there are steps to train.
  """
  steps = checks.check_int("steps", steps, 1)
  if latest_checkpoint_step is None:
    return None
  latest = checks.check_int("latest_checkpoint_step", latest_checkpoint_step, 0)
  if latest < steps:
    return None
  return (
      f"Run {run_name!r} already completed step {latest} "
      f"(steps={steps}); nothing to do. To train further, raise steps "
      f"(keeping the learning-rate schedule: set lr_schedule_steps to "
      f"the recorded schedule length)."
  )
