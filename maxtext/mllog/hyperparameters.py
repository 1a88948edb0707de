"""MLPerf log hyperparameters from a run's config and its real values.

`hyperparameters_from_config` builds the hyperparameter events a log must
hold (`REQUIRED_HYPERPARAMETERS`, in order) from the config and the run's
real values, naming precisions as MLPerf spells them (`precision_name`);
`check_values` checks that each value is of the kind its key takes (a count,
a precision name, a non-empty name).
`run_hyperparameters` gives a run's header from its settings
(`mlperf_config.MlperfConfig`): the schedule as
`maxtext.config.optimizer.schedule_facts` states it (the schedule the run trains
with), the samples from the config and its prepared data (`train_samples_of`,
`eval_samples_of`); `HEADER_SOURCES` says which config fields set a key.
A workload that logs otherwise states its own values
(`workload_header.WorkloadHeader`: a GRPO run's rows, evaluation prompts,
samples, P, G and sampling options), keyed by the log's keys; a GRPO
benchmark (`is_grpo_benchmark`: its rules require
`num_generations_per_prompt`) is logged only by a run that states them.
`maxtext.mllog.logger` writes the log; this module only decides its contents.
The submission fields are checked by `maxtext.mllog.rules`.

A model with experts (`num_experts` > 0) also logs `moe_aux_loss_coeff`, its
`load_balance_loss_weight`; `rules_require_key` tells whether a benchmark's
rules demand a key (`maxtext.mllog.mlperf_preflight` refuses a closed
deepseekv3_671b run of a dense model, whose log could not carry it honestly).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Mapping, Optional

import numpy as np
import yaml

from maxtext.core import checks
from maxtext.config import config_lib
from maxtext.config import optimizer
from maxtext.mllog import mlperf_config
from maxtext.mllog import rules
from maxtext.mllog import workload_header
from maxtext.text import metadata as text_metadata

# Precision names the 6.1 disclosure keys accept.
PRECISIONS = (
    "fp64",
    "fp32",
    "tf32",
    "fp16",
    "fp8",
    "mxfp6",
    "nvfp4",
    "mxfp4",
    "bfloat16",
    "Graphcore FLOAT 16.16",
    "int8",
    "uint8",
    "int4",
    "uint4",
)

# Kinds of header value: what `check_values` demands of a key's value.
_COUNT = "count"  # An int >= 0.
_POSITIVE_COUNT = "positive count"  # An int >= 1.
_PRECISION = "precision"  # One of PRECISIONS.
_NAME = "name"  # A non-empty str.
_NUMBER = "number"  # Logged as the config gives it.

# Keys `MLLogger.hyperparameters` requires, in the order they are logged, with
# the kind of each one's value. They cover the closed llama31_8b rule and the
# 6.1 disclosure keys, so a log that passes the closed rules differs from an
# open one only in its values.
_REQUIRED_KINDS = {
    "global_batch_size": _COUNT,
    "gradient_accumulation_steps": _POSITIVE_COUNT,
    "max_sequence_length": _COUNT,
    "seed": _NUMBER,
    "opt_name": _NAME,
    "opt_base_learning_rate": _NUMBER,
    "opt_end_learning_rate": _NUMBER,
    "opt_learning_rate_warmup_steps": _COUNT,
    "opt_learning_rate_decay_steps": _COUNT,
    "opt_learning_rate_decay_schedule": _NAME,
    "opt_adamw_beta_1": _NUMBER,
    "opt_adamw_beta_2": _NUMBER,
    "opt_adamw_epsilon": _NUMBER,
    "opt_adamw_weight_decay": _NUMBER,
    "opt_gradient_clip_norm": _NUMBER,
    "max_steps": _COUNT,
    "train_samples": _COUNT,
    "eval_samples": _COUNT,
    "init_checkpoint_step": _COUNT,
    "lowest_numerical_precision_in_linear": _PRECISION,
    "lowest_numerical_precision_in_attn": _PRECISION,
    "lowest_numerical_precision_in_comm": _PRECISION,
    "tensor_parallelism": _POSITIVE_COUNT,
    "pipeline_parallelism": _POSITIVE_COUNT,
    "context_parallelism": _POSITIVE_COUNT,
    "expert_parallelism": _POSITIVE_COUNT,
    "micro_batch_size": _POSITIVE_COUNT,
    "config_filename": _NAME,
}
REQUIRED_HYPERPARAMETERS = tuple(_REQUIRED_KINDS)
_MINIMUM = {_COUNT: 0, _POSITIVE_COUNT: 1}

# Keys a GRPO benchmark's log adds after the required ones (6.1.0
# qwen35_397b_grpo), with their kinds; checked when present.
_GRPO_KINDS = {
    "num_prompts_per_step": _POSITIVE_COUNT,
    "num_generations_per_prompt": _POSITIVE_COUNT,
    "generation_training_rollout_temperature": _NUMBER,
    "generation_training_rollout_top_p": _NUMBER,
    "generation_validation_rollout_temperature": _NUMBER,
    "generation_validation_rollout_top_p": _NUMBER,
}
GRPO_HYPERPARAMETERS = tuple(_GRPO_KINDS)
# A benchmark is one of GRPO post-training when its rules require this key
# (read from the installed checker by `is_grpo_benchmark`).
GRPO_RULE_KEY = "num_generations_per_prompt"

# Logged after the required keys when the model has experts.
MOE_AUX_LOSS_COEFF = "moe_aux_loss_coeff"
# Rule requirements that make a key mandatory in a checker's YAML.
_REQUIRING = ("EXACTLY_ONE", "AT_LEAST_ONE")

# JAX dtype names -> MLPerf precision names, and their order (lowest first).
_DTYPE_PRECISION = {
    "float64": "fp64",
    "float32": "fp32",
    "tensorfloat32": "tf32",
    "bfloat16": "bfloat16",
    "float16": "fp16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}
_PRECISION_RANK = {
    "fp8": 0,
    "fp16": 1,
    "bfloat16": 1,
    "tf32": 2,
    "fp32": 3,
    "fp64": 4,
}


def precision_name(dtype: Any) -> str:
  """Maps a dtype (name or object) to its MLPerf precision name."""
  name = str(np.dtype(dtype).name) if not isinstance(dtype, str) else dtype
  if name not in _DTYPE_PRECISION:
    raise ValueError(
        f"dtype {dtype!r} has no MLPerf precision name; known: "
        f"{sorted(_DTYPE_PRECISION)}"
    )
  return _DTYPE_PRECISION[name]


def check_values(values: Mapping[str, Any]) -> None:
  """Checks that `values` holds every required key, each of its kind.

  Args:
    values: header key -> value, as `MLLogger.hyperparameters` takes them.

  Raises:
    ValueError: a required key is missing, or its value is out of range
      (a negative count, an unknown precision, an empty name).
    TypeError: a count is not an int (a bool is no count).
  """
  missing = [k for k in REQUIRED_HYPERPARAMETERS if k not in values]
  if missing:
    raise ValueError(f"hyperparameters is missing required keys {missing}")
  kinds = dict(_REQUIRED_KINDS)
  kinds.update((k, v) for k, v in _GRPO_KINDS.items() if k in values)
  for key, kind in kinds.items():
    value = values[key]
    if kind in _MINIMUM:
      checks.check_int(f"hyperparameter {key}", value, _MINIMUM[kind])
    elif kind == _PRECISION and value not in PRECISIONS:
      raise ValueError(
          f"hyperparameter {key} must be one of {PRECISIONS}, got {value!r}"
      )
    elif kind == _NAME and (not isinstance(value, str) or not value):
      raise ValueError(
          f"hyperparameter {key} must be a non-empty string, got {value!r}"
      )


def _lowest_precision(*names: str) -> str:
  return min(names, key=lambda n: _PRECISION_RANK[n])


def hyperparameters_from_config(
    mlperf: mlperf_config.MlperfConfig,
    *,
    warmup_steps: int,
    schedule_steps: int,
    train_samples: int,
    eval_samples: int,
    init_checkpoint_step: int,
    micro_batch_size: int,
    config_filename: str,
    end_learning_rate: Optional[float] = None,
    decay_schedule: str = optimizer.DECAY_SCHEDULE_NAMES["cosine"],
    tensor_parallelism: int = 1,
    pipeline_parallelism: int = 1,
    context_parallelism: int = 1,
    expert_parallelism: Optional[int] = None,
) -> dict[str, Any]:
  """The hyperparameter events of a run from its settings (`mlperf`: the
  batch, seed, steps, precisions, experts and optimizer) and real values:
  the schedule's warm-up and total (warm-up + decay) steps, the samples in
  the training set (or the disclosed number) and in one evaluation, the
  step the run starts from, the micro batch per data-parallel replica, the
  config file's name, the final learning rate (None = `learning_rate *
  lr_end_fraction`) and the decay's MLPerf name, and the parallel degrees
  (expert: None = `mlperf`'s).

  Returns:
    Every key of `REQUIRED_HYPERPARAMETERS`, in that order, then
    `moe_aux_loss_coeff` when the model has experts.
  """
  opt = mlperf.optimizer
  values = {
      **_batch(mlperf),
      "opt_name": "adamw",
      **_schedule(
          opt, warmup_steps, schedule_steps, end_learning_rate, decay_schedule
      ),
      **_adamw(opt),
      "max_steps": mlperf.steps,
      "train_samples": train_samples,
      "eval_samples": eval_samples,
      "init_checkpoint_step": init_checkpoint_step,
      **_precisions(mlperf),
      "tensor_parallelism": tensor_parallelism,
      "pipeline_parallelism": pipeline_parallelism,
      "context_parallelism": context_parallelism,
      "expert_parallelism": (
          mlperf.expert_parallelism
          if expert_parallelism is None
          else expert_parallelism
      ),
      "micro_batch_size": micro_batch_size,
      "config_filename": config_filename,
  }
  out = {key: values[key] for key in REQUIRED_HYPERPARAMETERS}
  if mlperf.num_experts > 0:
    out[MOE_AUX_LOSS_COEFF] = mlperf.load_balance_loss_weight
  return out


def _batch(mlperf: mlperf_config.MlperfConfig) -> dict[str, Any]:
  """The header's batch keys and the seed."""
  return {
      "global_batch_size": mlperf.global_batch_size,
      "gradient_accumulation_steps": mlperf.gradient_accumulation_steps,
      "max_sequence_length": mlperf.max_sequence_length,
      "seed": mlperf.seed,
  }


def _schedule(
    opt: optimizer.OptimizerConfig,
    warmup_steps: int,
    schedule_steps: int,
    end_learning_rate: Optional[float],
    decay_schedule: str,
) -> dict[str, Any]:
  """The header's learning-rate keys (`hyperparameters_from_config`'s
  arguments of the same names)."""
  if not 0 <= warmup_steps <= schedule_steps:
    raise ValueError(
        f"warmup_steps must be in [0, schedule_steps="
        f"{schedule_steps}], got {warmup_steps}"
    )
  if end_learning_rate is None:
    end_learning_rate = opt.learning_rate * opt.lr_end_fraction
  return {
      "opt_base_learning_rate": opt.learning_rate,
      "opt_end_learning_rate": end_learning_rate,
      "opt_learning_rate_warmup_steps": warmup_steps,
      "opt_learning_rate_decay_steps": schedule_steps - warmup_steps,
      "opt_learning_rate_decay_schedule": decay_schedule,
  }


def _adamw(opt: optimizer.OptimizerConfig) -> dict[str, Any]:
  """The header's AdamW keys and gradient clipping."""
  return {
      "opt_adamw_beta_1": opt.adam_b1,
      "opt_adamw_beta_2": opt.adam_b2,
      "opt_adamw_epsilon": opt.adam_eps,
      "opt_adamw_weight_decay": opt.weight_decay,
      "opt_gradient_clip_norm": opt.grad_clip_norm,
  }


def _precisions(mlperf: mlperf_config.MlperfConfig) -> dict[str, str]:
  """The lowest precisions in the linear layers, attention and
  communication: the compute dtype's, and the lower of it and the
  weights' for what is communicated."""
  linear = precision_name(mlperf.compute_dtype)
  comm = _lowest_precision(linear, precision_name(mlperf.weight_dtype))
  return {
      "lowest_numerical_precision_in_linear": linear,
      "lowest_numerical_precision_in_attn": linear,
      "lowest_numerical_precision_in_comm": comm,
  }


@functools.lru_cache(maxsize=256)
def rules_require_key(
    rules_dir: str, division: str, benchmark: str, key: str
) -> bool:
  """Whether a checker rule file requires `key` in the log (cached: the
  installed rule files do not change while a process runs).

  Args:
    rules_dir: a ruleset's directory of YAML rules (`rules.ruleset_dir`).
    division: "closed" or "open".
    benchmark: the benchmark name.
    key: the log key.

  Returns:
    True when `<division>_<benchmark>.yaml` exists and names `key` with
    REQ EXACTLY_ONE or AT_LEAST_ONE.
  """
  path = os.path.join(rules_dir, f"{division}_{benchmark}.yaml")
  if not os.path.isfile(path):
    return False
  with open(path, encoding="utf-8") as f:
    entries = yaml.safe_load(f) or []
  for entry in entries:
    rule = entry.get("KEY") if isinstance(entry, dict) else None
    if (
        isinstance(rule, dict)
        and rule.get("NAME") == key
        and rule.get("REQ") in _REQUIRING
    ):
      return True
  return False


# What sets a header key whose name is not a config field's, for the header
# proof's messages (`run_hyperparameters` logs them).
HEADER_SOURCES = {
    "opt_base_learning_rate": "config.learning_rate",
    "opt_end_learning_rate": "config.learning_rate * lr_end_fraction",
    "opt_learning_rate_warmup_steps": "config.warmup_steps",
    "opt_learning_rate_decay_steps": (
        "config.lr_schedule_steps (0 = steps) - warmup_steps"
    ),
    "opt_learning_rate_decay_schedule": "config.lr_schedule",
    "opt_adamw_beta_1": "config.adam_b1",
    "opt_adamw_beta_2": "config.adam_b2",
    "opt_adamw_epsilon": "config.adam_eps",
    "opt_adamw_weight_decay": "config.weight_decay",
    "opt_gradient_clip_norm": "config.grad_clip_norm",
    "max_steps": "config.steps",
    "eval_samples": "config.eval_steps * eval_batch_size",
    "train_samples": "config.mllog_train_samples",
    MOE_AUX_LOSS_COEFF: "config.load_balance_loss_weight",
}


def is_grpo_benchmark(mlperf: mlperf_config.MlperfConfig) -> bool:
  """Whether the log's benchmark is one of GRPO post-training.

  True when the installed checker's rules for the ruleset, division and
  benchmark require `GRPO_RULE_KEY` (6.1.0: qwen35_397b_grpo). Only a run
  whose workload states that key (`workload_header.WorkloadHeader`) may
  write its log (`maxtext.mllog.mlperf_preflight`).
  """
  return rules_require_key(
      rules.ruleset_dir(mlperf.mllog_ruleset),
      mlperf.submission_division,
      mlperf.submission_benchmark,
      GRPO_RULE_KEY,
  )


def header_sources(header: workload_header.WorkloadHeader) -> dict[str, str]:
  """`HEADER_SOURCES`, with what sets the keys the workload states."""
  return {**HEADER_SOURCES, **header.sources}


def train_samples_of(mlperf: mlperf_config.MlperfConfig) -> int:
  """`train_samples` for the MLPerf log: mllog_train_samples; 0 = the
  prepared data's training sequences (grain), else the budget."""
  if mlperf.mllog_train_samples:
    return mlperf.mllog_train_samples
  if mlperf.dataset_type == "grain":
    meta = text_metadata.load(mlperf.train_data_path)
    return text_metadata.windows(meta, "train", mlperf.max_sequence_length)
  return mlperf.steps * mlperf.global_batch_size


def eval_samples_of(mlperf: mlperf_config.MlperfConfig) -> int:
  """Distinct sequences in one evaluation: eval_steps * eval_batch_size, at
  most the prepared eval split's sequences (grain)."""
  samples = mlperf.eval_steps * mlperf.eval_batch_size
  if mlperf.dataset_type == "grain":
    meta = text_metadata.load(
        mlperf.eval_data_path or mlperf.train_data_path,
        "eval_data_path" if mlperf.eval_data_path else "train_data_path",
    )
    samples = min(
        samples, text_metadata.windows(meta, "eval", mlperf.max_sequence_length)
    )
  return samples


def run_hyperparameters(
    mlperf: mlperf_config.MlperfConfig,
    *,
    data_parallelism: int,
    start_step: int,
    config_filename: str,
    header: Optional[workload_header.WorkloadHeader] = None,
) -> dict[str, Any]:
  """The hyperparameter events of a run's MLPerf log.

  The trainer's MLPerf listener logs exactly these; the header proof of a
  run with a log checks them before training. The values the workload
  states (`header`: a GRPO run's sequences, samples and sampling) replace
  the config's; `mllog_train_samples`, when set, is the logged
  `train_samples` whoever states it.

  Args:
    mlperf: the run's MLPerf log settings.
    data_parallelism: the mesh's data axis size (the micro batch size is per
      data-parallel replica).
    start_step: the step the attempt starts from (init_checkpoint_step).
    config_filename: the config file's name, for the 6.1 disclosure.
    header: the workload's own part of the log; None = pretraining's.
  """
  schedule = optimizer.schedule_facts(mlperf.optimizer)
  stated = workload_header.of_run(mlperf, header).values
  values = hyperparameters_from_config(
      mlperf,
      warmup_steps=schedule.warmup_steps,
      schedule_steps=schedule.schedule_steps,
      end_learning_rate=schedule.end_learning_rate,
      decay_schedule=schedule.decay_schedule,
      # Samples the workload states are not counted from a data set.
      train_samples=(
          0 if "train_samples" in stated else train_samples_of(mlperf)
      ),
      eval_samples=0 if "eval_samples" in stated else eval_samples_of(mlperf),
      init_checkpoint_step=start_step,
      micro_batch_size=config_lib.micro_batch_size(mlperf) // data_parallelism,
      config_filename=config_filename,
      tensor_parallelism=mlperf.tensor_parallelism,
      context_parallelism=mlperf.context_parallelism,
  )
  values.update(stated)
  if mlperf.mllog_train_samples:
    values["train_samples"] = mlperf.mllog_train_samples
  return values
