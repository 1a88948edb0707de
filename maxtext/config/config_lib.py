"""Config checks and helpers: validation before any device work, JSON, loading.

`validate(config)` checks every field of a run configuration (the fields of
`maxtext/configs/base.py`, no more, no fewer): its type, its range, and the
relations between fields. Errors are `TypeError` (wrong type) or `ValueError`
(bad value) and name the field and the value. Checks that need the devices
(batch divisible by the device count, mesh shape) belong to the mesh code.

The expected type of each field is the type of its default in `base.py`; the
values a choice field takes are `maxtext.core.choices`', and the schedule's
length is `maxtext.config.optimizer`'s. `validate` reads no file: paths, data
files, the MLPerf log's own fields (`maxtext.mllog.mlperf_config`) and the
submission rules are checked by `maxtext.run.preflight` (the log's through
`maxtext.mllog.mlperf_preflight`, against what the installed `mlperf_logging`
package knows).
"""

import importlib.util
import json
import math
import os
from typing import Any, Mapping

import ml_collections

from maxtext.core import checks
from maxtext.core import choices
from maxtext.core import component_config
from maxtext.config import optimizer
from maxtext.configs import base
from maxtext.runtime import mesh

# Expected Python type of every field: the type of its default in base.py, so
# a field is declared once, there. `float` fields also take ints.
FIELD_TYPES: dict[str, type] = {
    key: type(value) for key, value in base.get_config().items()
}


def _fail(key: str, value: Any, why: str) -> ValueError:
  return component_config.fail(key, value, why)


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
  """Raises unless `value` is one plain directory name (no path, no control
  characters)."""
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
  control = [c for c in value if ord(c) < 32 or ord(c) == 127]
  if control:
    # A newline or escape in a directory name splits log lines and
    # confuses every listing of the run.
    raise _fail(key, value, f"holds a control character ({control[0]!r})")


def _check_mla(v) -> None:
  """The multi-head latent attention fields (maxtext/model/mla.py)."""
  _one_of(v, "attention_type", choices.ATTENTION_TYPES)
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
  if v["qk_norm"]:
    # MLA normalises its low-rank latents (q_norm, kv_norm), not its heads.
    raise _fail("qk_norm", True, "needs attention_type='gqa', got 'mla'")
  for key in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
    _at_least(v, key, 1)
  _at_least(v, "qk_rope_head_dim", 2)
  if v["qk_rope_head_dim"] % 2:
    raise _fail(
        "qk_rope_head_dim",
        v["qk_rope_head_dim"],
        "must be even (rotary embeddings)",
    )


def _check_yarn_scaling(v) -> None:
  """YaRN's rotary scaling fields (maxtext/model/layers.py)."""
  if v["rope_scaling_factor"] < 1:
    raise _fail("rope_scaling_factor", v["rope_scaling_factor"], "must be >= 1")
  _at_least(v, "rope_original_max_position", 1)
  if not v["rope_yarn_beta_fast"] > v["rope_yarn_beta_slow"] > 0:
    raise _fail(
        "rope_yarn_beta_fast",
        v["rope_yarn_beta_fast"],
        f"must be > rope_yarn_beta_slow={v['rope_yarn_beta_slow']} > 0",
    )
  for key in ("rope_yarn_mscale", "rope_yarn_mscale_all_dim"):
    if v[key] < 0:
      raise _fail(key, v[key], "must be >= 0")


def _check_llama3_scaling(v) -> None:
  """Llama 3.1's rotary scaling fields (maxtext/model/layers.py)."""
  if v["rope_scaling_factor"] < 1:
    raise _fail("rope_scaling_factor", v["rope_scaling_factor"], "must be >= 1")
  if v["rope_low_freq_factor"] <= 0:
    raise _fail(
        "rope_low_freq_factor", v["rope_low_freq_factor"], "must be > 0"
    )
  if v["rope_high_freq_factor"] <= v["rope_low_freq_factor"]:
    raise _fail(
        "rope_high_freq_factor",
        v["rope_high_freq_factor"],
        f"must be > rope_low_freq_factor={v['rope_low_freq_factor']}",
    )
  _at_least(v, "rope_original_max_position", 1)


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
  _at_least(v, "tensor_parallelism", 1)
  _at_least(v, "context_parallelism", 1)
  context = v["context_parallelism"]
  chunk = v["max_sequence_length"] // (2 * context)
  if (
      context > 1
      and v["full_attention_interval"]
      and chunk < v["linear_conv_kernel_dim"] - 1
  ):
    # Each device's chunk convolves with the chunk before's last K - 1
    # inputs (gated_deltanet._context_delta_rule).
    raise _fail(
        "context_parallelism",
        context,
        f"splits max_sequence_length={v['max_sequence_length']} into "
        f"{2 * context} chunks of {chunk} tokens, fewer than the Gated "
        f"DeltaNet's linear_conv_kernel_dim - 1 = "
        f"{v['linear_conv_kernel_dim'] - 1}",
    )
  _check_router(v)
  _check_expert_counts(v)


def _check_router(v) -> None:
  """The router's fields: score, top-k normalisation, balance and bias."""
  _one_of(v, "router_score", choices.ROUTER_SCORES)
  if v["router_norm_topk"] and v["router_score"] != "softmax":
    raise _fail(
        "router_norm_topk",
        True,
        f"needs router_score='softmax' (router_score="
        f"{v['router_score']!r} normalises its top-k weights always)",
    )
  _one_of(v, "load_balance_loss", choices.LOAD_BALANCE_LOSSES)
  rate = v["router_bias_update_rate"]
  # `not >= 0` also refuses NaN, which `< 0` would let through.
  if not rate >= 0:
    raise _fail("router_bias_update_rate", rate, "must be >= 0")
  if rate > 0 and not (v["router_bias"] and v["num_experts"]):
    raise _fail(
        "router_bias_update_rate",
        rate,
        "needs num_experts > 0 and router_bias=True (there is no bias to "
        "update)",
    )
  for key in ("load_balance_loss_weight", "capacity_factor"):
    if v[key] < 0:
      raise _fail(key, v[key], "must be >= 0")


def _check_expert_counts(v) -> None:
  """The experts a token takes, the dense layers and the expert axis
  against num_experts (a dense model: no expert axis)."""
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
  _check_expert_groups(v)


def _check_expert_groups(v) -> None:
  """Group-limited routing and the routed weights' scale."""
  if not v["routed_scaling_factor"] > 0:
    raise _fail(
        "routed_scaling_factor", v["routed_scaling_factor"], "must be > 0"
    )
  _at_least(v, "num_expert_groups", 1)
  experts, groups = v["num_experts"], v["num_expert_groups"]
  if groups == 1:
    return
  if experts % groups or experts // groups < 2:
    raise _fail(
        "num_expert_groups",
        groups,
        f"must divide num_experts={experts} into groups of at least 2 "
        f"(a group ranks by its two best scores)",
    )
  per_token = v["expert_groups_per_token"]
  least = -(-v["num_experts_per_token"] // (experts // groups))
  if not least <= per_token <= groups:
    raise _fail(
        "expert_groups_per_token",
        per_token,
        f"must be in [{least}, num_expert_groups={groups}] (its groups must "
        f"hold num_experts_per_token={v['num_experts_per_token']} experts)",
    )


def _check_run(v) -> None:
  """The run's kind, name, output directory, checkpoints and seeds."""
  _one_of(v, "workload", choices.WORKLOADS)
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
  if v["start_over"] and v["resume"]:
    raise _fail("start_over", True, "contradicts resume=True")
  # -1 = a seed drawn at the start of the run (maxtext.storage.run_record).
  _at_least(v, "seed", -1)
  _at_least(v, "data_shuffle_seed", 0)


def _check_attention(v) -> None:
  """The attention implementation against the dtypes and the hardware."""
  _one_of(v, "attention", choices.ATTENTION_IMPLEMENTATIONS)
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


def _check_model(v) -> None:
  """The network's shape, precision and memory policy."""
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
  _one_of(v, "rope_scaling", choices.ROPE_SCALINGS)
  if v["rope_scaling"] == "llama3":
    _check_llama3_scaling(v)
  if v["rope_scaling"] == "yarn":
    _check_yarn_scaling(v)
  if v["norm_epsilon"] <= 0:
    raise _fail("norm_epsilon", v["norm_epsilon"], "must be > 0")
  _one_of(v, "weight_dtype", choices.DTYPES)
  _one_of(v, "compute_dtype", choices.DTYPES)
  _check_attention(v)
  _one_of(v, "remat_policy", choices.REMAT_POLICIES)
  _at_least(v, "loss_chunk_size", 0)
  _one_of(v, "logits_dtype", choices.LOGITS_DTYPES)
  _at_least(v, "mlp_chunks", 1)
  _check_mla(v)
  _check_moe(v)


def _check_data(v) -> None:
  """The data set's kind and the fields it needs (its files: preflight)."""
  _one_of(v, "dataset_type", choices.DATASET_TYPES)
  if v["dataset_type"] in ("tokens_file", "chat", "megatron"):
    for key in ("train_data_path", "eval_data_path"):
      if not v[key]:
        raise _fail(
            key, v[key], f"is required when dataset_type={v['dataset_type']!r}"
        )
  if v["dataset_type"] == "chat" and not (
      v["tokenizer_path"] or v["load_parameters_path"]
  ):
    raise _fail(
        "tokenizer_path",
        v["tokenizer_path"],
        "dataset_type='chat' needs a chat template: set tokenizer_path, or "
        "load_parameters_path to an imported checkpoint with its tokenizer "
        "files",
    )
  _at_least(v, "grain_worker_count", 0)
  _at_least(v, "megatron_eval_samples", 0)
  batches = v["eval_steps"] * v["eval_batch_size"]
  if v["megatron_eval_samples"] and v["megatron_eval_samples"] != batches:
    raise _fail(
        "megatron_eval_samples",
        v["megatron_eval_samples"],
        f"every evaluation reads the whole eval set: eval_steps * "
        f"eval_batch_size is {batches}",
    )


def _check_batch(v) -> None:
  """The batch, its micro-batches and the step budget."""
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


def _check_optimizer(v) -> None:
  """The learning-rate schedule and AdamW (maxtext/config/optimizer.py)."""
  optimizer.OptimizerConfig.from_config(v)


def _check_monitoring(v) -> None:
  """Evaluation, logging, profiling and the non-finite policy."""
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
  if v["deferred_eval"] and not v["enable_mllog"]:
    raise _fail(
        "deferred_eval",
        v["deferred_eval"],
        "needs enable_mllog=True: the deferred evaluation dates its result"
        " from the points the MLPerf log records",
    )
  _at_least(v, "log_period", 1)
  if not v["progress_interval_s"] > 0:
    raise _fail("progress_interval_s", v["progress_interval_s"], "must be > 0")
  _at_least(v, "profiler_steps", 0)
  _at_least(v, "profiler_start_step", 0)
  _at_least(v, "max_consecutive_skipped_steps", 1)


def _check_mesh(v) -> None:
  """The mesh axes (their product against the devices: maxtext.runtime.mesh)."""
  mesh.MeshConfig.from_config(v)


def _check_distribution(v) -> None:
  """Processes, the coordinator and storage every process shares."""
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


def _check_runtime(v) -> None:
  """The hardware and the warm-up (the MLPerf log's fields:
  maxtext.mllog.mlperf_config, checked by the pre-flight)."""
  _one_of(v, "hardware", choices.HARDWARE)
  _at_least(v, "warmup_steps_before_run_start", -1)


def _check_gcs(v) -> None:
  """The GCS mirror's and the run lock's intervals and timeouts."""
  _at_least(v, "gcs_sync_interval_seconds", 0)
  for key in (
      "gcs_request_timeout_seconds",
      "gcs_final_timeout_seconds",
      "gcs_startup_timeout_seconds",
      "run_lock_refresh_interval_seconds",
  ):
    if v[key] <= 0:
      raise _fail(key, v[key], "must be > 0")


def _check_grpo(v) -> None:
  """GRPO post-training fields, each on its own (maxtext/grpo/).

  Every config has them, so only their own ranges are checked here; how
  they relate to the batch and the model is `validate_grpo`'s, which a GRPO
  run calls, and the reward names' imports are `maxtext.grpo.rewards.rewards`'.
  """
  _at_least(v, "grpo_num_generations", 2)
  _at_least(v, "grpo_num_iterations", 1)
  _one_of(v, "grpo_advantage_estimator", choices.GRPO_ADVANTAGE_ESTIMATORS)
  _one_of(v, "grpo_kl_estimator", choices.GRPO_KL_ESTIMATORS)
  _one_of(v, "grpo_loss_aggregation", choices.GRPO_LOSS_AGGREGATIONS)
  if v["grpo_advantage_eps"] < 0:
    raise _fail("grpo_advantage_eps", v["grpo_advantage_eps"], "must be >= 0")
  if v["grpo_epsilon"] <= 0:
    raise _fail("grpo_epsilon", v["grpo_epsilon"], "must be > 0")
  if v["grpo_epsilon_high"] < 0:
    raise _fail(
        "grpo_epsilon_high",
        v["grpo_epsilon_high"],
        "must be >= 0 (0 = grpo_epsilon)",
    )
  if v["grpo_beta"] < 0:
    raise _fail("grpo_beta", v["grpo_beta"], "must be >= 0")
  # A text task's verifier may be the whole reward (maxtext/env/).
  if not v["grpo_reward_functions"].strip() and not v["grpo_task"]:
    raise _fail(
        "grpo_reward_functions",
        v["grpo_reward_functions"],
        "name at least one reward function as module:function",
    )
  _at_least(v, "grpo_max_turns", 1)
  _at_least(v, "grpo_max_turn_tokens", 0)
  _one_of(v, "grpo_tool_executor", choices.GRPO_TOOL_EXECUTORS)
  _at_least(v, "grpo_ray_actors", 1)
  for key in (
      "grpo_episode_timeout_seconds",
      "grpo_tool_timeout_seconds",
      "grpo_ray_call_timeout_seconds",
  ):
    if not v[key] > 0:
      raise _fail(key, v[key], "must be > 0")
  if not v["grpo_reward_timeout_seconds"] > 0:
    raise _fail(
        "grpo_reward_timeout_seconds",
        v["grpo_reward_timeout_seconds"],
        "must be > 0",
    )
  _check_grpo_sampling(v)
  _check_grpo_eval_and_gates(v)


def _check_grpo_sampling(v) -> None:
  """GRPO's generation fields: lengths, sampling, decoder, devices, pages."""
  _at_least(v, "grpo_max_completion_length", 1)
  _at_least(v, "grpo_prompt_length", 1)
  if v["grpo_temperature"] <= 0:
    raise _fail("grpo_temperature", v["grpo_temperature"], "must be > 0")
  if v["grpo_eval_temperature"] < 0:
    raise _fail(
        "grpo_eval_temperature",
        v["grpo_eval_temperature"],
        "must be >= 0 (0 = greedy)",
    )
  for key in ("grpo_top_p", "grpo_eval_top_p"):
    if not 0.0 < v[key] <= 1.0:
      raise _fail(key, v[key], "must be in (0, 1]")
  _at_least(v, "grpo_top_k", 0)
  if v["grpo_top_k"] > v["vocab_size"]:
    raise _fail(
        "grpo_top_k",
        v["grpo_top_k"],
        f"must be <= vocab_size={v['vocab_size']}",
    )
  _one_of(v, "grpo_decoder", choices.GRPO_DECODERS)
  # One rollout ahead at most: 0 synchronous, 1 drawn while the update
  # before runs (maxtext/grpo/grpo_workload.py).
  _one_of(v, "grpo_max_age", (0, 1))
  _at_least(v, "grpo_generation_devices", 0)
  _at_least(v, "grpo_generation_replicas", 1)
  generating = v["grpo_generation_devices"]
  if generating and generating % v["grpo_generation_replicas"]:
    raise _fail(
        "grpo_generation_replicas",
        v["grpo_generation_replicas"],
        f"must divide grpo_generation_devices={generating}",
    )
  _at_least(v, "grpo_decode_slots", 0)
  size = v["grpo_decode_page_size"]
  if not isinstance(size, int) or size < 1 or size & (size - 1):
    raise _fail("grpo_decode_page_size", size, "must be a power of two")


def _check_grpo_eval_and_gates(v) -> None:
  """GRPO's eval fields, its importance-sampling and log-prob gates, its
  target and stop ids."""
  _at_least(v, "grpo_eval_prompts", 1)
  _at_least(v, "grpo_eval_samples_per_prompt", 0)
  metric = v["grpo_eval_target_metric"]
  if not (
      metric.startswith("pass@")
      and metric[5:].isdigit()
      and int(metric[5:]) >= 1
  ):
    raise _fail(
        "grpo_eval_target_metric", metric, 'must be "pass@1" or "pass@<k>"'
    )
  low, high = v["grpo_tis_ratio_min"], v["grpo_tis_ratio_max"]
  if high == 0.0 and low != 0.0:
    raise _fail(
        "grpo_tis_ratio_min",
        low,
        "needs grpo_tis_ratio_max (0 = truncated importance sampling off)",
    )
  if high != 0.0 and not 0.0 <= low <= 1.0 <= high:
    raise _fail(
        "grpo_tis_ratio_min",
        low,
        f"with grpo_tis_ratio_max={high}: need 0 <= min <= 1 <= max "
        "(max 0 = off)",
    )
  threshold = v["grpo_logprob_error_threshold"]
  if threshold != 0.0 and not threshold > 1.0:
    raise _fail(
        "grpo_logprob_error_threshold",
        threshold,
        "must be 0 (off) or > 1 (the error exp(|difference|) is >= 1)",
    )
  if not 0.0 <= v["grpo_target_pass_rate"] <= 1.0:
    raise _fail(
        "grpo_target_pass_rate",
        v["grpo_target_pass_rate"],
        "must be in [0, 1] (0 = no target)",
    )
  stop_ids(v)


def largest_decode_page(v) -> int:
  """The largest page the paged decoder may have: the model's length
  rounded up to a power of two (a larger page is never filled)."""
  return 1 << max(0, (v["max_sequence_length"] - 1).bit_length())


def decoded_rows(v) -> int:
  """The most sequences one decode of a GRPO run holds: a rollout's
  (global_batch_size) or the eval's (grpo_eval_prompts x samples)."""
  return max(
      v["global_batch_size"],
      v["grpo_eval_prompts"] * eval_samples_per_prompt(v),
  )


def _check_decode_sizes(v) -> None:
  """The paged decoder's page size and slots, bounded by what a rollout
  can use: a page at most the model's length (rounded up to a power of
  two), slots at most the sequences a rollout or the eval decodes."""
  length = v["max_sequence_length"]
  largest_page = largest_decode_page(v)
  if v["grpo_decode_page_size"] > largest_page:
    raise _fail(
        "grpo_decode_page_size",
        v["grpo_decode_page_size"],
        f"must be <= {largest_page} (max_sequence_length={length}, rounded "
        "up to a power of two: a larger page is never filled)",
    )
  rows = decoded_rows(v)
  if v["grpo_decode_slots"] > rows:
    raise _fail(
        "grpo_decode_slots",
        v["grpo_decode_slots"],
        f"must be <= {rows}, the most sequences a rollout (global_batch_size) "
        "or the eval (grpo_eval_prompts x samples) decodes: more slots are "
        "never used, and each holds its pages",
    )


def validate_grpo(config) -> None:
  """Checks what a GRPO run needs beyond `validate` (which it follows).

  Args:
    config: a validated run configuration.

  Raises:
    ValueError: one line naming the field: a batch that is not whole groups,
      a prompt and completion longer than the model's sequence, or a step
      count, eval interval or checkpoint period that is not a multiple of
      grpo_num_iterations, or a router bias update (not done by GRPO), or
      a decode page larger than the model's length or more decode slots
      than sequences.
  """
  v = dict(config.items())
  passes = v["grpo_num_iterations"]
  for key in ("steps", "eval_interval", "checkpoint_period"):
    if v[key] % passes:
      raise _fail(
          key,
          v[key],
          f"must be a multiple of grpo_num_iterations={passes} (it counts "
          "optimizer updates, and each rollout feeds that many)",
      )
  g = v["grpo_num_generations"]
  if v["global_batch_size"] % g:
    raise _fail(
        "global_batch_size",
        v["global_batch_size"],
        f"must be divisible by grpo_num_generations={g} "
        "(prompts x generations)",
    )
  if v["grpo_prompt_length"] + v["grpo_max_completion_length"] > (
      v["max_sequence_length"]
  ):
    raise _fail(
        "grpo_max_completion_length",
        v["grpo_max_completion_length"],
        f"plus grpo_prompt_length={v['grpo_prompt_length']} must be <= "
        f"max_sequence_length={v['max_sequence_length']}",
    )
  _check_grpo_one_update(v)
  _check_grpo_eval(v)
  _check_decode_sizes(v)
  if v["router_bias_update_rate"] > 0:
    raise _fail(
        "router_bias_update_rate",
        v["router_bias_update_rate"],
        "must be 0 in a GRPO run (its loss reports no expert loads; the "
        "bias is held as loaded)",
    )


def _check_grpo_one_update(v) -> None:
  """The choices that need the trained policy's log-probabilities to be
  the rollout's (one update a rollout), and what they need beside."""
  passes = v["grpo_num_iterations"]
  one_update = (
      "grpo_force_on_policy_ratio",
      "grpo_logprob_error_threshold",
      "grpo_tis_ratio_max",
  )
  for key in one_update:
    if v[key] and passes != 1:
      raise _fail(
          key,
          v[key],
          f"needs grpo_num_iterations=1, got {passes} (the trained "
          "policy's log-probabilities must be those at the rollout)",
      )
  if v["grpo_tis_ratio_max"] and not v["grpo_force_on_policy_ratio"]:
    raise _fail(
        "grpo_tis_ratio_max",
        v["grpo_tis_ratio_max"],
        "needs grpo_force_on_policy_ratio=True (the importance weights it "
        "truncates)",
    )
  if v["grpo_overlong_filtering"] and not stop_ids(v):
    raise _fail(
        "grpo_overlong_filtering",
        True,
        "needs grpo_stop_ids: without a stop id every completion reaches "
        "grpo_max_completion_length and would train nothing",
    )


def _check_grpo_eval(v) -> None:
  """The eval's target metric against its samples per prompt."""
  samples = eval_samples_per_prompt(v)
  metric = v["grpo_eval_target_metric"]
  if int(metric[5:]) not in (1, samples):
    raise _fail(
        "grpo_eval_target_metric",
        metric,
        f"the eval draws {samples} sample(s) per prompt "
        "(grpo_eval_samples_per_prompt): name pass@1"
        + (f" or pass@{samples}" if samples > 1 else ""),
    )
  if samples > 1 and v["grpo_eval_temperature"] == 0:
    raise _fail(
        "grpo_eval_samples_per_prompt",
        samples,
        "a greedy eval (grpo_eval_temperature=0) draws one sample per prompt",
    )


def eval_samples_per_prompt(v) -> int:
  """The held-out eval's samples per prompt, k (grpo_eval_samples_per_prompt;
  0 = 1 when greedy, else grpo_num_generations).

  Args:
    v: the config (a ConfigDict or its items as a dict).
  """
  if v["grpo_eval_samples_per_prompt"]:
    return v["grpo_eval_samples_per_prompt"]
  return 1 if v["grpo_eval_temperature"] == 0 else v["grpo_num_generations"]


def stop_ids(v) -> tuple[int, ...]:
  """config.grpo_stop_ids as ids; raises naming the field on a bad one.

  Args:
    v: the config (a ConfigDict or its items as a dict).
  """
  text = v["grpo_stop_ids"].strip()
  ids = []
  for part in text.split(",") if text else ():
    part = part.strip()
    if not part.isdigit() or int(part) >= v["vocab_size"]:
      raise _fail(
          "grpo_stop_ids",
          v["grpo_stop_ids"],
          f"{part!r} is not an id in [0, vocab_size={v['vocab_size']})",
      )
    ids.append(int(part))
  return tuple(ids)


# The sections of a config, checked in this order after the types.
_SECTIONS = (
    _check_run,
    _check_model,
    _check_data,
    _check_batch,
    _check_optimizer,
    _check_monitoring,
    _check_mesh,
    _check_distribution,
    _check_runtime,
    _check_gcs,
    _check_grpo,
)


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks every field; raises on the first problem found.

  Types, ranges and relations between fields only: no file is read (paths,
  data files and the MLPerf rules are `maxtext.run.preflight`'s).

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
  for check in _SECTIONS:
    check(values)


def micro_batch_size(config) -> int:
  """Sequences per micro-batch over all processes: global batch / K."""
  return config.global_batch_size // config.gradient_accumulation_steps


def base_with(fields: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """base.py's config with `fields` set, validated (`validate`).

  Raises:
    TypeError, ValueError: as `validate`.
  """
  config = base.get_config()
  for key, value in fields.items():
    config[key] = value
  validate(config)
  return config


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


def with_values(
    config: ml_collections.ConfigDict, values: dict[str, Any]
) -> ml_collections.ConfigDict:
  """A copy of `config` with the fields of `values` set; `config` itself
  when `values` is empty. The original is left alone, and the copy keeps its
  lock (a misspelt field stays an error)."""
  if not values:
    return config
  copy = config.copy_and_resolve_references()
  copy.update(values)
  return copy


def with_seed(
    config: ml_collections.ConfigDict, seed: int
) -> ml_collections.ConfigDict:
  """A copy of `config` with its resolved `seed` (`run_record.resolve_seed`)."""
  return with_values(config, {"seed": checks.check_int("seed", seed, 0)})


def load_config_file(
    path: str, argument: str = ""
) -> ml_collections.ConfigDict:
  """Loads a config file (a module with `get_config()`) by path.

  Args:
    path: path of a Python file defining `get_config() -> ConfigDict`.
    argument: the text after `:` in `--config=FILE:ARGUMENT`, passed to
      `get_config` as its one argument when not empty (as ml_collections'
      config flags do).

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
  # pylint: disable-next=not-callable
  config = get_config(argument) if argument else get_config()
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(
        f"get_config() of {path!r} returned "
        f"{type(config).__name__}, not a ConfigDict"
    )
  return config
