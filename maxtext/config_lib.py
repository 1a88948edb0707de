"""Config checks and helpers: validation before any device work, JSON, loading.

`validate(config)` checks every field of a run configuration (the fields of
`maxtext/configs/base.py`, no more, no fewer): its type, its range, and the
relations between fields. Errors are `TypeError` (wrong type) or `ValueError`
(bad value) and name the field and the value. Checks that need the devices
(batch divisible by the device count, mesh shape) belong to the mesh code.

The expected type of each field is the type of its default in `base.py`; the
MLPerf submission fields are checked by `maxtext.mllog.rules`, against what
the installed `mlperf_logging` package knows.
"""

import importlib.util
import json
import math
import os
from typing import Any

from absl import logging
import ml_collections

from maxtext import checks
from maxtext.configs import base
from maxtext.mllog import hyperparameters as mllog_hyperparameters_lib
from maxtext.mllog import rules

ALLOWED_DTYPES = ("float32", "bfloat16", "float16")
DATASET_TYPES = ("synthetic", "tokens_file", "grain")
HARDWARE = ("auto", "cpu", "tpu", "gpu")
# What sets a header key whose name is not a config field's, for the header
# proof's messages (hyperparameters.hyperparameters_from_config logs them).
_HEADER_SOURCES = {
    "opt_base_learning_rate": "config.learning_rate",
    "opt_end_learning_rate": "config.learning_rate * lr_end_fraction",
    "opt_learning_rate_warmup_steps": "config.warmup_steps",
    "opt_learning_rate_decay_steps": (
        "config.lr_schedule_steps (0 = steps) - warmup_steps"
    ),
    "opt_adamw_beta_1": "config.adam_b1",
    "opt_adamw_beta_2": "config.adam_b2",
    "opt_adamw_epsilon": "config.adam_eps",
    "opt_adamw_weight_decay": "config.weight_decay",
    "opt_gradient_clip_norm": "config.grad_clip_norm",
    "max_steps": "config.steps",
    "eval_samples": "config.eval_steps * eval_batch_size",
    "train_samples": "config.mllog_train_samples",
    "moe_aux_loss_coeff": "config.load_balance_loss_weight",
}
# The config file a header proof names: validation does not know the file.
# The trainer's default for the same unknown (trainer.run).
PROOF_CONFIG_FILENAME = "unknown"

# Expected Python type of every field: the type of its default in base.py, so
# a field is declared once, there. `float` fields also take ints.
FIELD_TYPES: dict[str, type] = {
    key: type(value) for key, value in base.get_config().items()
}


def _text_metadata():
  """maxtext.text.metadata, imported only for dataset_type="grain" configs."""
  # Lazy: other configs need neither the module nor its Bazel dep.
  # pylint: disable-next=import-outside-toplevel
  from maxtext.text import metadata as text_metadata

  return text_metadata


def _fail(key: str, value: Any, why: str) -> ValueError:
  return ValueError(f"config.{key}={value!r}: {why}")


def _check_types(values: dict[str, Any]) -> None:
  """Checks that `values` has exactly base.py's fields, each of its type."""
  missing = sorted(set(FIELD_TYPES) - set(values))
  if missing:
    raise ValueError(
        f"config is missing field(s) {missing}; every field of "
        f"maxtext/configs/base.py is required"
    )
  unknown = sorted(set(values) - set(FIELD_TYPES))
  if unknown:
    raise ValueError(
        f"config has unknown field(s) {unknown}; add new fields "
        f"to maxtext/configs/base.py, with a comment"
    )
  for key, expected in FIELD_TYPES.items():
    value = values[key]
    # Python values only (no NumPy scalars): the config is written as JSON.
    if expected is float:
      ok = checks.is_number(value) and isinstance(value, (int, float))
    elif expected is int:
      ok = checks.is_int(value) and isinstance(value, int)
    else:
      ok = isinstance(value, expected)
    if not ok:
      raise TypeError(
          f"config.{key}={value!r}: expected "
          f"{expected.__name__}, got {type(value).__name__}"
      )
    if expected is float and not math.isfinite(value):
      raise _fail(key, value, "must be finite")


def _at_least(values, key: str, minimum: int) -> None:
  if values[key] < minimum:
    raise _fail(key, values[key], f"must be >= {minimum}")


def _one_of(values, key: str, allowed) -> None:
  if values[key] not in allowed:
    raise _fail(key, values[key], f"must be one of {list(allowed)}")


def _check_relative_name(key: str, value: str) -> None:
  if (
      os.path.isabs(value)
      or "/" in value
      or "\\" in value
      or value in (".", "..")
      or value.startswith("~")
  ):
    raise _fail(
        key,
        value,
        "must be a plain directory name inside "
        "base_output_directory (no '/', '..' or absolute path)",
    )


def _check_mla(v) -> None:
  """The multi-head latent attention fields (maxtext/model/mla.py)."""
  _one_of(v, "attention_type", ("gqa", "mla"))
  for key in (
      "q_lora_rank",
      "kv_lora_rank",
      "qk_nope_head_dim",
      "qk_rope_head_dim",
      "v_head_dim",
  ):
    _at_least(v, key, 0)
  if v["attention_type"] != "mla":
    return
  for key in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
    _at_least(v, key, 1)
  _at_least(v, "qk_rope_head_dim", 2)
  if v["qk_rope_head_dim"] % 2:
    raise _fail(
        "qk_rope_head_dim",
        v["qk_rope_head_dim"],
        "must be even (rotary embeddings)",
    )


def _check_moe(v) -> None:
  """The mixture-of-experts fields (maxtext/model/moe.py)."""
  for key in (
      "num_experts",
      "num_shared_experts",
      "num_dense_layers",
      "moe_mlp_dim",
  ):
    _at_least(v, key, 0)
  _at_least(v, "expert_parallelism", 1)
  # The same values as maxtext/model/moe.py's ROUTER_SCORES and
  # LOAD_BALANCE_LOSSES.
  _one_of(v, "router_score", ("softmax", "sigmoid"))
  _one_of(v, "load_balance_loss", ("switch", "sequence"))
  for key in ("load_balance_loss_weight", "capacity_factor"):
    if v[key] < 0:
      raise _fail(key, v[key], "must be >= 0")
  experts = v["num_experts"]
  if not experts:
    if v["expert_parallelism"] != 1:
      raise _fail(
          "expert_parallelism",
          v["expert_parallelism"],
          "must be 1 when num_experts=0 (a dense model)",
      )
    return
  if not 1 <= v["num_experts_per_token"] <= experts:
    raise _fail(
        "num_experts_per_token",
        v["num_experts_per_token"],
        f"must be in [1, num_experts={experts}]",
    )
  if v["num_dense_layers"] >= v["num_layers"]:
    raise _fail(
        "num_dense_layers",
        v["num_dense_layers"],
        f"must be < num_layers={v['num_layers']} (at least one MoE "
        f"layer when num_experts > 0)",
    )
  if experts % v["expert_parallelism"]:
    raise _fail(
        "expert_parallelism",
        v["expert_parallelism"],
        f"must divide num_experts={experts}",
    )


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks every field; raises on the first problem found.

  Args:
    config: a run configuration (flat ConfigDict).

  Raises:
    TypeError: a field has the wrong type (message names field and value).
    ValueError: a field is missing, unknown, out of range or inconsistent with
      another field (message names field and value).
  """
  if not isinstance(config, (ml_collections.ConfigDict, dict)):
    raise TypeError(f"config must be a ConfigDict, got {type(config).__name__}")
  values = dict(config.items())
  _check_types(values)
  v = values

  # Run and output.
  if v["run_name"]:
    _check_relative_name("run_name", v["run_name"])
  if not v["base_output_directory"]:
    raise _fail("base_output_directory", "", "must not be empty")
  if v["base_output_directory"].startswith("gs://") and len(
      v["base_output_directory"].rstrip("/")
  ) <= len("gs://"):
    raise _fail(
        "base_output_directory",
        v["base_output_directory"],
        "needs a bucket: gs://bucket[/prefix]",
    )
  _at_least(v, "checkpoint_period", 0)
  _at_least(v, "max_checkpoints_to_keep", 0)
  # -1 = a seed drawn at the start of the run (maxtext.storage.run_record).
  _at_least(v, "seed", -1)
  _at_least(v, "data_shuffle_seed", 0)

  # Model.
  for key in (
      "vocab_size",
      "emb_dim",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
      "mlp_dim",
      "max_sequence_length",
  ):
    _at_least(v, key, 1)
  if v["num_heads"] % v["num_kv_heads"]:
    raise _fail(
        "num_kv_heads",
        v["num_kv_heads"],
        f"must divide num_heads={v['num_heads']}",
    )
  if v["head_dim"] % 2:
    raise _fail("head_dim", v["head_dim"], "must be even (rotary embeddings)")
  if v["rope_theta"] <= 0:
    raise _fail("rope_theta", v["rope_theta"], "must be > 0")
  if v["norm_epsilon"] <= 0:
    raise _fail("norm_epsilon", v["norm_epsilon"], "must be > 0")
  _one_of(v, "weight_dtype", ALLOWED_DTYPES)
  _one_of(v, "compute_dtype", ALLOWED_DTYPES)
  # The same values as maxtext/model/transformer.py's
  # ATTENTION_IMPLEMENTATIONS and REMAT_POLICIES (kept here so validation does
  # not import JAX).
  _one_of(v, "attention", ("auto", "einsum", "dot_product", "cudnn", "splash"))
  if v["attention"] == "cudnn" and v["compute_dtype"] == "float32":
    # cuDNN's fused kernel takes half precision only; casting would silently
    # change the numerics of a float32 run.
    raise _fail(
        "attention",
        "cudnn",
        "needs compute_dtype bfloat16 or float16, got 'float32'",
    )
  if v["attention"] == "cudnn" and v["hardware"] not in ("gpu", "auto"):
    # With "auto", model.attention_implementation refuses a non-GPU backend.
    raise _fail(
        "attention",
        "cudnn",
        f"needs hardware='gpu' or 'auto', got {v['hardware']!r}",
    )
  _one_of(v, "remat_policy", ("none", "full", "save_dots", "save_named"))
  _at_least(v, "loss_chunk_size", 0)
  _check_mla(v)
  _check_moe(v)

  # Data.
  _one_of(v, "dataset_type", DATASET_TYPES)
  if v["dataset_type"] == "tokens_file":
    for key in ("train_data_path", "eval_data_path"):
      if not v[key]:
        raise _fail(key, v[key], "is required when dataset_type='tokens_file'")
  _at_least(v, "grain_worker_count", 0)
  if v["dataset_type"] == "grain":
    # Reads only metadata.json: a directory without one, or a vocabulary
    # larger than the model's, is refused before any device work.
    text_metadata = _text_metadata()
    text_metadata.check_config(
        v["train_data_path"],
        v["eval_data_path"],
        v["vocab_size"],
        v["max_sequence_length"],
    )

  # Batch and steps.
  _at_least(v, "global_batch_size", 1)
  _at_least(v, "gradient_accumulation_steps", 1)
  _at_least(v, "steps", 1)
  if v["global_batch_size"] % v["gradient_accumulation_steps"]:
    raise _fail(
        "global_batch_size",
        v["global_batch_size"],
        f"must be divisible by gradient_accumulation_steps="
        f"{v['gradient_accumulation_steps']}",
    )

  # Optimizer.
  if v["learning_rate"] <= 0:
    raise _fail("learning_rate", v["learning_rate"], "must be > 0")
  _at_least(v, "warmup_steps", 0)
  _at_least(v, "lr_schedule_steps", 0)
  if v["warmup_steps"] > lr_schedule_steps(config):
    raise _fail(
        "warmup_steps",
        v["warmup_steps"],
        f"must be <= the schedule length {lr_schedule_steps(config)} "
        f"(lr_schedule_steps, 0 = steps)",
    )
  if not 0.0 <= v["lr_end_fraction"] <= 1.0:
    raise _fail("lr_end_fraction", v["lr_end_fraction"], "must be in [0, 1]")
  for key in ("adam_b1", "adam_b2"):
    if not 0.0 <= v[key] < 1.0:
      raise _fail(key, v[key], "must be in [0, 1)")
  if v["adam_eps"] <= 0:
    raise _fail("adam_eps", v["adam_eps"], "must be > 0")
  if v["weight_decay"] < 0:
    raise _fail("weight_decay", v["weight_decay"], "must be >= 0")
  if v["grad_clip_norm"] < 0:
    raise _fail(
        "grad_clip_norm", v["grad_clip_norm"], "must be >= 0 (0 = no clipping)"
    )

  # Evaluation and monitoring.
  _at_least(v, "eval_interval", 1)
  _at_least(v, "first_eval_samples", 0)
  if v["first_eval_samples"] % v["global_batch_size"]:
    raise _fail(
        "first_eval_samples",
        v["first_eval_samples"],
        f"must be a multiple of global_batch_size={v['global_batch_size']}",
    )
  _at_least(v, "eval_steps", 1)
  _at_least(v, "eval_batch_size", 1)
  if v["target_eval_loss"] < 0:
    raise _fail(
        "target_eval_loss",
        v["target_eval_loss"],
        "must be >= 0 (0 = no target)",
    )
  _at_least(v, "log_period", 1)
  _at_least(v, "profiler_steps", 0)
  _at_least(v, "profiler_start_step", 0)
  _at_least(v, "max_consecutive_skipped_steps", 1)

  # Mesh.
  for key in ("data_parallelism", "fsdp_parallelism"):
    if v[key] != -1 and v[key] < 1:
      raise _fail(key, v[key], "must be -1 (all remaining devices) or >= 1")
  if v["data_parallelism"] == -1 and v["fsdp_parallelism"] == -1:
    raise _fail(
        "fsdp_parallelism",
        -1,
        "only one of data_parallelism and fsdp_parallelism may be -1",
    )
  # Across TPU slices: the same rule for the data-center network's axes.
  for key in ("dcn_data_parallelism", "dcn_fsdp_parallelism"):
    if v[key] != -1 and v[key] < 1:
      raise _fail(key, v[key], "must be -1 (all remaining slices) or >= 1")
  if v["dcn_data_parallelism"] == -1 and v["dcn_fsdp_parallelism"] == -1:
    raise _fail(
        "dcn_fsdp_parallelism",
        -1,
        "only one of dcn_data_parallelism and dcn_fsdp_parallelism may be -1",
    )

  # Distribution.
  _at_least(v, "num_processes", 0)
  if v["num_processes"] > 1:
    address = v["coordinator_address"]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
      raise _fail(
          "coordinator_address",
          address,
          "must be 'host:port' when num_processes > 1",
      )
    if not 0 <= v["process_id"] < v["num_processes"]:
      raise _fail(
          "process_id",
          v["process_id"],
          f"must be in [0, num_processes={v['num_processes']})",
      )
  elif v["process_id"] < -1:
    raise _fail("process_id", v["process_id"], "must be >= -1")
  _at_least(v, "distributed_init_timeout_seconds", 1)
  if (
      v["num_processes"] != 1
      and v["base_output_directory"].startswith("gs://")
      and not v["checkpoint_directory"]
  ):
    # Each host stages its own copy of a gs:// run directory, so the default
    # checkpoint directory inside it would not be shared between the processes.
    raise _fail(
        "checkpoint_directory",
        "",
        f"must name storage every process shares (e.g. gs://bucket/ckpt) "
        f"when num_processes={v['num_processes']} and base_output_directory "
        f"is {v['base_output_directory']}",
    )

  # Runtime.
  _one_of(v, "hardware", HARDWARE)

  # MLPerf log. Checked even when off, so turning it on cannot fail later.
  rules.validate_submission(v)
  if (
      v["submission_division"] == "closed"
      and not v["num_experts"]
      and mllog_hyperparameters_lib.rules_require_key(
          rules.ruleset_dir(v["mllog_ruleset"]),
          "closed",
          v["submission_benchmark"],
          mllog_hyperparameters_lib.MOE_AUX_LOSS_COEFF,
      )
  ):
    # The benchmark is a mixture-of-experts model: its closed rules require
    # moe_aux_loss_coeff, which a dense model has no honest value for.
    raise _fail(
        "num_experts",
        0,
        f"a closed {v['submission_benchmark']} run needs a model with "
        f"experts (its rules require moe_aux_loss_coeff)",
    )
  if v["enable_mllog"]:
    # Only for a run with a log (a run without one submits nothing). Closed:
    # an error before any device work; open: warnings. The header proof
    # (below) holds the rest of the checker's rules.
    rules.check_reference_hyperparameters(v)
  _at_least(v, "mllog_train_samples", 0)
  command = v["cache_clear_command"]
  if "\0" in command or (command and not command.strip()):
    raise _fail(
        "cache_clear_command",
        command,
        "must be '' (the default flush) or a shell command",
    )
  if v["mllog_file"].startswith("gs://"):
    raise _fail(
        "mllog_file",
        v["mllog_file"],
        "must be a local path: the log is staged locally and mirrored to "
        "gs:// with the run directory when base_output_directory is gs://",
    )

  _at_least(v, "warmup_steps_before_run_start", -1)

  # GCS mirror.
  _at_least(v, "gcs_sync_interval_seconds", 0)
  for key in (
      "gcs_request_timeout_seconds",
      "gcs_final_timeout_seconds",
      "gcs_startup_timeout_seconds",
      "run_lock_refresh_interval_seconds",
  ):
    if v[key] <= 0:
      raise _fail(key, v[key], "must be > 0")

  if v["enable_mllog"]:
    # Last: the proof writes the log from the whole, checked config.
    _check_header_proof(
        config
        if isinstance(config, ml_collections.ConfigDict)
        else ml_collections.ConfigDict(values)
    )


def _header_proof():
  """maxtext.mllog.header_proof, imported only for configs with a log."""
  # Lazy: it loads the MLPerf logger and the compliance checker, which a
  # config without a log never needs.
  # pylint: disable-next=import-outside-toplevel
  from maxtext.mllog import header_proof

  return header_proof


def _check_header_proof(config: ml_collections.ConfigDict) -> None:
  """The MLPerf pre-flight: the official checker on the run's header.

  The log a run of `config` starts with (its real header, see
  `mllog_hyperparameters`) plus synthetic run events at the run's own
  evaluation points goes through the installed compliance checker with the
  rules of the config's ruleset, division and benchmark
  (`maxtext.mllog.header_proof`). Every failure about a header key or
  `eval_accuracy` (the first evaluation's samples, the target) is one the
  run's log would fail after the run. Closed division: an error; open: a
  warning each.

  Args:
    config: a config `validate` has checked, `enable_mllog` on.

  Raises:
    ValueError: closed division and the checker fails the header; the
      message names each failing key, its logged value and the rule.
  """
  header_proof = _header_proof()
  verdict = header_proof.prove(config, fresh_run_header(config))
  for failure in verdict.run_failures():
    # The synthetic events are this engine's, not the config's: a bug to
    # report, not a reason to refuse the run.
    logging.warning(
        "MLPerf header proof: the synthetic run events fail the checker "
        "(maxtext.mllog.header_proof): %s",
        failure.message,
    )
  problems = [
      header_proof.describe(
          f,
          config,
          _HEADER_SOURCES.get(
              f.key, f"config.{f.key}" if f.key in FIELD_TYPES else ""
          ),
      )
      for f in verdict.config_failures()
  ]
  if not problems:
    return
  rules_name = (
      f"mlperf_logging training_{config.mllog_ruleset} "
      f"{config.submission_division} {config.submission_benchmark} rules"
  )
  if config.submission_division == "closed":
    raise ValueError(
        f"closed-division pre-flight: the MLPerf log this config writes "
        f"fails the official compliance checker ({rules_name}): "
        + "; ".join(problems)
        + " (submission_division='open' runs it anyway, with warnings)"
    )
  for problem in problems:
    logging.warning(
        "MLPerf open division: the log fails the checker (%s): %s",
        rules_name,
        problem,
    )


def mllog_hyperparameters(
    config, *, data_parallelism: int, start_step: int, config_filename: str
) -> dict[str, Any]:
  """The hyperparameter events of a run's MLPerf log, without JAX.

  The trainer's MLPerf listener logs exactly these; the header proof of a
  closed run checks them before training.

  Args:
    config: the run's config.
    data_parallelism: the mesh's data axis size (the micro batch size is per
      data-parallel replica).
    start_step: the step the attempt starts from (init_checkpoint_step).
    config_filename: the config file's name, for the 6.1 disclosure.
  """
  return mllog_hyperparameters_lib.hyperparameters_from_config(
      config,
      warmup_steps=int(config.warmup_steps),
      schedule_steps=lr_schedule_steps(config),
      end_learning_rate=end_learning_rate(config),
      train_samples=train_samples(config),
      eval_samples=eval_samples(config),
      init_checkpoint_step=start_step,
      micro_batch_size=micro_batch_size(config) // data_parallelism,
      config_filename=config_filename,
  )


def fresh_run_header(
    config, config_filename: str = PROOF_CONFIG_FILENAME
) -> dict[str, Any]:
  """`mllog_hyperparameters` of a fresh run of `config`, before its mesh
  exists: the header the pre-flight proves.

  The mesh decides a data axis of -1; the rules ask only for a positive
  micro batch, which the mesh code guarantees, so -1 counts as 1 here.
  """
  return mllog_hyperparameters(
      config,
      data_parallelism=max(config.data_parallelism, 1),
      start_step=0,
      config_filename=config_filename,
  )


def end_learning_rate(config) -> float:
  """The schedule's last learning rate: learning_rate * lr_end_fraction,
  free of float noise from the multiplication (1e-3 * 0.1 is 1e-4), as the
  MLPerf log and the schedule summary state it."""
  end = float(config.learning_rate) * float(config.lr_end_fraction)
  return float(f"{end:.12g}") if end else end


def lr_schedule_steps(config) -> int:
  """Length of the learning-rate schedule: lr_schedule_steps, 0 = steps."""
  return config.lr_schedule_steps or config.steps


def micro_batch_size(config) -> int:
  """Sequences per micro-batch over all processes: global batch / K."""
  return config.global_batch_size // config.gradient_accumulation_steps


def train_samples(config) -> int:
  """`train_samples` for the MLPerf log: mllog_train_samples; 0 = the
  prepared data's training sequences (grain), else the budget."""
  if config.mllog_train_samples:
    return config.mllog_train_samples
  if config.dataset_type == "grain":
    text_metadata = _text_metadata()
    meta = text_metadata.load(config.train_data_path)
    return text_metadata.windows(meta, "train", config.max_sequence_length)
  return config.steps * config.global_batch_size


def eval_samples(config) -> int:
  """Distinct sequences in one evaluation: eval_steps * eval_batch_size, at
  most the prepared eval split's sequences (grain)."""
  samples = config.eval_steps * config.eval_batch_size
  if config.dataset_type == "grain":
    text_metadata = _text_metadata()
    meta = text_metadata.load(
        config.eval_data_path or config.train_data_path,
        "eval_data_path" if config.eval_data_path else "train_data_path",
    )
    samples = min(
        samples, text_metadata.windows(meta, "eval", config.max_sequence_length)
    )
  return samples


def to_json_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The config as a JSON-serialisable dict (field references resolved).

  Raises:
    TypeError: if a value cannot be written as JSON.
  """
  values = (
      config.to_dict()
      if isinstance(config, ml_collections.ConfigDict)
      else dict(config)
  )
  json.dumps(values)  # Raises TypeError naming the unserialisable type.
  return values


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """Loads a config file (a module with `get_config()`) by path.

  Args:
    path: path of a Python file defining `get_config() -> ConfigDict`.

  Returns:
    The ConfigDict that `get_config()` returns (not validated).

  Raises:
    FileNotFoundError: if the path does not exist.
    ValueError: if the file has no `get_config` or it returns no ConfigDict.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} does not exist")
  name = "maxtext_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  if spec is None or spec.loader is None:
    raise ValueError(f"config file {path!r} cannot be imported")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  get_config = getattr(module, "get_config", None)
  if not callable(get_config):
    raise ValueError(f"config file {path!r} defines no get_config()")
  # get_config is callable (checked above); pylint infers only getattr's None.
  config = get_config()  # pylint: disable=not-callable
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(
        f"get_config() of {path!r} returned "
        f"{type(config).__name__}, not a ConfigDict"
    )
  return config
