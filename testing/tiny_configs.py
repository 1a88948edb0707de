"""Tiny run configs for end-to-end tests: the default config, shrunk.

`tiny_config(output_dir)` keeps the shape of `maxtext/configs/default.py`
(synthetic data, gradient accumulation, periodic eval, MLPerf log on) and makes
everything small enough that a run compiles and trains in seconds on a 2-core
CPU: a 1-layer model of width 32 on 16-token sequences, a few steps.

`model_config(*presets, **overrides)` is `maxtext/configs/base.py` with the
two-block TINY_MODEL that the model and layer tests share; the presets
TINY_MLA and TINY_MOE turn its attention into multi-head latent attention and
its second block's MLP into a mixture of experts.

Tests that run several trainings share a persistent JAX compilation cache:
JAX_COMPILATION_CACHE_DIR when the environment names one (`.ci/run` and
`.bazelrc` may set it), else a directory under the test's temp dir.
"""

import os
import tempfile
from typing import Optional

from absl.testing import absltest
import ml_collections

from maxtext.configs import base
from maxtext.configs import default

COMPILATION_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def compilation_cache_dir(environ=os.environ) -> str:
  """The persistent compilation cache directory that tests share.

  JAX_COMPILATION_CACHE_DIR when set; otherwise a directory under the test's
  temp dir (TEST_TMPDIR under Bazel), shared by the runs of one test target.
  """
  path = environ.get(COMPILATION_CACHE_ENV, "")
  if not path:
    path = os.path.join(
        environ.get("TEST_TMPDIR") or tempfile.gettempdir(),
        "maxtext_test_jax_cache",
    )
  return os.path.abspath(os.path.expanduser(path))


def fresh_output_dir(prefix: str) -> str:
  """A new, empty directory under the test's temp dir, for a test class's runs.

  Outside Bazel the default test temp dir outlives the test, and a run
  directory left there by an earlier invocation would be resumed; a fresh
  directory per test class keeps every invocation's runs its own.
  """
  tmp = absltest.get_default_test_tmpdir()
  os.makedirs(tmp, exist_ok=True)
  return tempfile.mkdtemp(prefix=prefix, dir=tmp)


def tiny_config(
    output_dir: str, *, run_name: str = "tiny", steps: int = 6, **overrides
) -> ml_collections.ConfigDict:
  """The default config shrunk for tests, writing under `output_dir`.

  Args:
    output_dir: the base_output_directory (a test's temp dir).
    run_name: the run directory's name.
    steps: the step budget.
    **overrides: further config fields to set (each must exist in base.py).

  Returns:
    An unlocked ConfigDict; `overrides` are applied last.

  Raises:
    KeyError: an override names a field the config does not have.
  """
  config = default.get_config()
  config.base_output_directory = os.fspath(output_dir)
  config.run_name = run_name
  config.jax_compilation_cache_dir = compilation_cache_dir()
  # Test logs are no submissions and need no cold page cache: the default
  # flush would drop the whole (shared) machine's cache at every run.
  config.cache_clear_command = "sync"

  # One block of width 32, two query heads sharing one key/value head (keeps
  # grouped-query attention exercised), 16-token sequences over 32 tokens.
  config.vocab_size = 32
  config.emb_dim = 32
  config.num_layers = 1
  config.num_heads = 2
  config.num_kv_heads = 1
  config.head_dim = 16
  config.mlp_dim = 64
  config.max_sequence_length = 16

  # 8 sequences per step in 2 micro-batches of 4.
  config.global_batch_size = 8
  config.gradient_accumulation_steps = 2
  config.steps = steps
  # A high rate suits the tiny model: the eval loss falls below 1.0 nats per
  # token in under 20 steps (ln 32 = 3.47 at initialisation).
  config.learning_rate = 3e-2
  config.warmup_steps = 3

  # Eval every 3 steps over one batch; no target unless a test sets one.
  config.eval_interval = 3
  config.eval_steps = 1
  config.eval_batch_size = 8
  config.target_eval_loss = 0.0

  config.checkpoint_period = 3
  config.max_checkpoints_to_keep = 0
  config.log_period = 1

  _override(config, overrides, "tiny_config")
  return config


def _override(config, values, caller: str) -> None:
  """Sets `values` in `config`; a field `config` lacks is a KeyError."""
  for key, value in values.items():
    if key not in config:
      raise KeyError(f"{caller}: unknown config field {key!r}")
    config[key] = value


# The tiny model the model tests share: two blocks of width 32, four query
# heads sharing two key/value heads of 8 (grouped-query attention), a SwiGLU
# MLP of 64, 16-token sequences over 32 tokens, 8 sequences per batch. One
# training step compiles and runs in about a second on a CPU.
TINY_MODEL = dict(
    vocab_size=32,
    emb_dim=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_sequence_length=16,
    global_batch_size=8,
    eval_batch_size=8,
)

# Multi-head latent attention at TINY_MODEL's scale (it then ignores
# num_kv_heads and head_dim). The two ranks and three head widths differ from
# each other, so a count or a reshape that confuses two of them changes a
# shape or a number.
TINY_MLA = dict(
    attention_type="mla",
    q_lora_rank=16,
    kv_lora_rank=12,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
)

# Mixture of experts in TINY_MODEL: block 0 stays dense, block 1 routes each
# token to 2 of 4 experts beside one shared expert, so both parameter stacks
# and both kinds of expert exist. Experts a quarter of mlp_dim wide.
TINY_MOE = dict(
    num_experts=4,
    num_experts_per_token=2,
    num_shared_experts=1,
    num_dense_layers=1,
    moe_mlp_dim=16,
)

# Qwen3 at TINY_MODEL's scale: an RMSNorm over each query and key head, a
# head width (12) apart from emb_dim / num_heads (8).
TINY_QWEN3 = dict(qk_norm=True, head_dim=12)

# Qwen3-MoE at TINY_MODEL's scale: TINY_QWEN3 with every block a
# mixture-of-experts block, softmax top-2 of 4, renormalised, no shared expert.
TINY_QWEN3_MOE = dict(
    **TINY_QWEN3,
    num_experts=4,
    num_experts_per_token=2,
    router_norm_topk=True,
    moe_mlp_dim=16,
)

# Qwen3.5-MoE at TINY_MODEL's scale: 4 layers, full attention every 2nd
# (two groups of one Gated DeltaNet and one attention layer), every layer
# top-2 of 4 experts with a gated shared expert, zero-centred norms, gated
# attention, rotary on half of each head.
TINY_QWEN35 = dict(
    **TINY_QWEN3_MOE,
    num_layers=4,
    full_attention_interval=2,
    norm_zero_centered=True,
    attention_output_gate=True,
    partial_rotary_factor=0.5,
    num_shared_experts=1,
    shared_expert_mlp_dim=24,
    shared_expert_gate=True,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_conv_kernel_dim=4,
    linear_chunk_size=4,
)

# GRPO on the tiny model: 4 completions of each prompt of 3 progression terms,
# 4 terms asked for, 8 held-out prompts, a KL term, both built-in rewards.
TINY_GRPO = dict(
    workload="grpo",
    grpo_num_generations=4,
    grpo_prompt_length=3,
    grpo_max_completion_length=4,
    grpo_eval_prompts=8,
    grpo_beta=0.04,
    grpo_reward_functions=(
        "maxtext.grpo.tasks.progression_task:exact_match,"
        "maxtext.grpo.tasks.progression_task:prefix_match=0.5"
    ),
)


def model_config(*presets: dict, **overrides) -> ml_collections.ConfigDict:
  """base.py's config with TINY_MODEL, then `presets`, then `overrides`.

  Args:
    *presets: dicts of config fields applied in order after TINY_MODEL (e.g.
      TINY_MLA, TINY_MOE).
    **overrides: further config fields, applied last.

  Returns:
    An unlocked ConfigDict.

  Raises:
    KeyError: a preset or override names a field the config does not have.
  """
  config = base.get_config()
  for values in (TINY_MODEL, *presets, overrides):
    _override(config, values, "model_config")
  return config


# A tiny shape whose eval loss falls below 1.0 nats per token within about 25
# steps, as the open-division MLPerf rules need of a passing log (vocab 16, one
# block of TINY_MODEL's width, grouped-query attention). Tests that check MLPerf
# logs pass it to `tiny_config` with their own step budget, target and
# checkpoints.
MLPERF_SHAPE = {
    **TINY_MODEL,
    "vocab_size": 16,
    "num_layers": 1,
    "gradient_accumulation_steps": 2,
    "eval_steps": 1,
    "eval_interval": 5,
    "learning_rate": 1e-2,
    "warmup_steps": 3,
    "lr_schedule_steps": 40,
    "max_checkpoints_to_keep": 3,
    "log_period": 10,
}


def tiny_flags(
    output_dir: str,
    *,
    run_name: str = "tiny",
    steps: int = 6,
    extra: Optional[dict] = None,
) -> list[str]:
  """`--config.key=value` flags giving `train_main` the tiny config.

  Args:
    output_dir: the base_output_directory.
    run_name: the run directory's name.
    steps: the step budget.
    extra: further fields to override.

  Returns:
    The flags, one per field that differs from the default config.
  """
  reference = default.get_config()
  config = tiny_config(
      output_dir, run_name=run_name, steps=steps, **(extra or {})
  )
  return [
      f"--config.{key}={value}"
      for key, value in sorted(config.items())
      if reference[key] != value or (extra and key in extra)
  ]
