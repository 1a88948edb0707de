"""Tests for config_lib and the config files in maxtext/configs."""

import glob
import json
import os
import re
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections
import numpy as np

from maxtext.core import choices
from maxtext.config import config_lib
from maxtext.configs import base

_CONFIG_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"
)


def _config_files():
  """The config files beside base.py (their tests are not config files)."""
  return sorted(
      path
      for path in glob.glob(os.path.join(_CONFIG_DIR, "*.py"))
      if not path.endswith("_test.py")
  )


def _load(name):
  return config_lib.load_config_file(os.path.join(_CONFIG_DIR, name + ".py"))


def _with(config, **overrides):
  """A plain copy of `config` with fields replaced, bypassing type locking."""
  values = config.to_dict()
  values.update(overrides)
  return ml_collections.ConfigDict(values)


class ConfigFilesTest(parameterized.TestCase):

  def test_config_dir_has_the_promised_files(self):
    names = {os.path.basename(p) for p in _config_files()}
    self.assertContainsSubset({"base.py", "default.py", "llama31_8b.py"}, names)

  def test_every_config_file_loads_and_validates(self):
    for path in _config_files():
      with self.subTest(path=os.path.basename(path)):
        config = config_lib.load_config_file(path)
        config_lib.validate(config)
        self.assertEqual(set(config.keys()), set(config_lib.FIELD_TYPES))

  def test_every_base_field_is_commented(self):
    with open(os.path.join(_CONFIG_DIR, "base.py"), encoding="utf-8") as f:
      lines = f.read().splitlines()
    assigned = re.compile(r"^\s+config\.(\w+) = ")
    seen = set()
    for i, line in enumerate(lines):
      match = assigned.match(line)
      if not match:
        continue
      seen.add(match.group(1))
      previous = lines[i - 1].strip()
      with self.subTest(field=match.group(1)):
        self.assertTrue(
            "#" in line or previous.startswith("#"),
            f"base.py field {match.group(1)} has no comment",
        )
    self.assertEqual(seen, set(config_lib.FIELD_TYPES))

  def test_base_and_default_follow_the_design(self):
    base_config = _load("base")
    default = _load("default")
    self.assertFalse(base_config.enable_mllog)
    self.assertTrue(default.enable_mllog)
    self.assertEqual(base_config.weight_dtype, "float32")
    self.assertEqual(default.hardware, "auto")
    self.assertEqual(default.dataset_type, "synthetic")
    self.assertGreater(default.target_eval_loss, 0.0)
    self.assertLess(default.target_eval_loss, 1.0)
    self.assertTrue(os.path.isabs(default.base_output_directory))

  def test_llama31_8b_is_an_accelerator_config(self):
    config = _load("llama31_8b")
    self.assertEqual(config.compute_dtype, "bfloat16")
    self.assertEqual(config.hardware, "tpu")
    self.assertEqual(config.dataset_type, "tokens_file")
    self.assertEqual(config.submission_division, "closed")
    self.assertEqual(config.num_heads % config.num_kv_heads, 0)


class ValidateTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.config = _load("base")

  @parameterized.named_parameters(
      ("steps_zero", {"steps": 0}, "steps"),
      (
          "start_over_with_resume",
          {"start_over": True, "resume": True},
          "start_over.*contradicts resume=True",
      ),
      (
          "accumulation_zero",
          {"gradient_accumulation_steps": 0},
          "gradient_accumulation_steps",
      ),
      (
          "batch_not_divisible",
          {"global_batch_size": 10, "gradient_accumulation_steps": 4},
          "global_batch_size=10.*gradient_accumulation_steps=4",
      ),
      (
          "warmup_past_steps",
          {"warmup_steps": 11, "steps": 10},
          "warmup_steps=11.*10",
      ),
      (
          "warmup_past_schedule",
          {"warmup_steps": 6, "lr_schedule_steps": 5},
          "warmup_steps=6",
      ),
      ("weight_dtype", {"weight_dtype": "float64"}, "weight_dtype='float64'"),
      ("compute_dtype", {"compute_dtype": "int8"}, "compute_dtype='int8'"),
      ("dataset_type", {"dataset_type": "csv"}, "dataset_type='csv'"),
      (
          "tokens_file_without_train_path",
          {"dataset_type": "tokens_file", "eval_data_path": "/x.npy"},
          "train_data_path",
      ),
      (
          "tokens_file_without_eval_path",
          {"dataset_type": "tokens_file", "train_data_path": "/x.npy"},
          "eval_data_path",
      ),
      ("seed_below_minus_one", {"seed": -2}, "seed=-2"),
      (
          "data_shuffle_seed_minus_one",
          {"data_shuffle_seed": -1},
          "data_shuffle_seed=-1",
      ),
      ("eval_interval_zero", {"eval_interval": 0}, "eval_interval=0"),
      ("eval_steps_zero", {"eval_steps": 0}, "eval_steps=0"),
      ("run_name_slash", {"run_name": "a/b"}, "run_name='a/b'"),
      ("run_name_dotdot", {"run_name": ".."}, "run_name='..'"),
      ("run_name_absolute", {"run_name": "/tmp/x"}, "run_name='/tmp/x'"),
      ("run_name_home", {"run_name": "~"}, "run_name='~'"),
      (
          "run_name_newline",
          {"run_name": "bad\nname"},
          r"run_name='bad\\nname': holds a control character \('\\n'\)",
      ),
      (
          "run_name_escape",
          {"run_name": "a\x1bb"},
          r"run_name='a\\x1bb': holds a control character",
      ),
      ("data_parallelism_zero", {"data_parallelism": 0}, "data_parallelism=0"),
      ("fsdp_minus_two", {"fsdp_parallelism": -2}, "fsdp_parallelism=-2"),
      (
          "both_minus_one",
          {"data_parallelism": -1, "fsdp_parallelism": -1},
          "only one",
      ),
      ("kv_heads", {"num_heads": 4, "num_kv_heads": 3}, "num_kv_heads=3"),
      ("odd_head_dim", {"head_dim": 7}, "head_dim=7"),
      ("learning_rate", {"learning_rate": 0.0}, "learning_rate=0.0"),
      ("lr_end_fraction", {"lr_end_fraction": 1.5}, "lr_end_fraction=1.5"),
      ("adam_b2", {"adam_b2": 1.0}, "adam_b2=1.0"),
      ("grad_clip", {"grad_clip_norm": -1.0}, "grad_clip_norm=-1.0"),
      ("lr_schedule", {"lr_schedule": "linear"}, "lr_schedule='linear'"),
      ("hardware", {"hardware": "npu"}, "hardware='npu'"),
      (
          "multi_process_without_coordinator",
          {"num_processes": 2, "process_id": 0},
          "coordinator_address",
      ),
      (
          "process_id_out_of_range",
          {
              "num_processes": 2,
              "process_id": 2,
              "coordinator_address": "10.0.0.1:1234",
          },
          "process_id=2",
      ),
      (
          "gs_without_bucket",
          {"base_output_directory": "gs://"},
          "base_output_directory",
      ),
      ("empty_output", {"base_output_directory": ""}, "base_output_directory"),
      ("nan_learning_rate", {"learning_rate": float("nan")}, "learning_rate"),
      (
          "skipped_steps_zero",
          {"max_consecutive_skipped_steps": 0},
          "max_consecutive_skipped_steps=0",
      ),
      (
          "gcs_sync_negative",
          {"gcs_sync_interval_seconds": -1.0},
          "gcs_sync_interval_seconds=-1.0",
      ),
      (
          "progress_interval_zero",
          {"progress_interval_s": 0.0},
          "progress_interval_s=0.0",
      ),
      (
          "gcs_timeout_zero",
          {"gcs_request_timeout_seconds": 0.0},
          "gcs_request_timeout_seconds=0.0",
      ),
      ("unknown_attention_type", {"attention_type": "mqa"}, "attention_type"),
      (
          "mla_without_latent_rank",
          {
              "attention_type": "mla",
              "qk_nope_head_dim": 16,
              "qk_rope_head_dim": 8,
              "v_head_dim": 16,
          },
          "kv_lora_rank=0",
      ),
      (
          "mla_odd_rope_width",
          {
              "attention_type": "mla",
              "kv_lora_rank": 32,
              "qk_nope_head_dim": 16,
              "qk_rope_head_dim": 7,
              "v_head_dim": 16,
          },
          "qk_rope_head_dim=7: must be even",
      ),
      (
          "llama3_scaling_below_one",
          {"rope_scaling": "llama3", "rope_scaling_factor": 0.5},
          "rope_scaling_factor=0.5: must be >= 1",
      ),
      (
          "llama3_bands_crossed",
          {
              "rope_scaling": "llama3",
              "rope_low_freq_factor": 4.0,
              "rope_high_freq_factor": 1.0,
          },
          "rope_high_freq_factor=1.0: must be > rope_low_freq_factor=4.0",
      ),
      (
          "yarn_scaling_below_one",
          {"rope_scaling": "yarn", "rope_scaling_factor": 0.5},
          "rope_scaling_factor=0.5: must be >= 1",
      ),
      (
          "yarn_betas_crossed",
          {
              "rope_scaling": "yarn",
              "rope_yarn_beta_fast": 1.0,
              "rope_yarn_beta_slow": 32.0,
          },
          "rope_yarn_beta_fast=1.0: must be > rope_yarn_beta_slow=32.0 > 0",
      ),
      (
          "no_mlp_chunk",
          {"mlp_chunks": 0},
          "mlp_chunks=0: must be >= 1",
      ),
      (
          "yarn_negative_mscale",
          {"rope_scaling": "yarn", "rope_yarn_mscale_all_dim": -1.0},
          "rope_yarn_mscale_all_dim=-1.0: must be >= 0",
      ),
      (
          "llama3_no_original_context",
          {"rope_scaling": "llama3", "rope_original_max_position": 0},
          "rope_original_max_position=0",
      ),
      (
          "first_eval_off_the_batch",
          {"first_eval_samples": 20},
          "first_eval_samples=20: must be a multiple of global_batch_size",
      ),
      (
          "grpo_generations",
          {"grpo_num_generations": 1},
          "grpo_num_generations=1",
      ),
      ("grpo_iterations", {"grpo_num_iterations": 0}, "grpo_num_iterations=0"),
      (
          "deferred_eval_without_log",
          {"deferred_eval": True, "enable_mllog": False},
          "deferred_eval=True: needs enable_mllog=True",
      ),
      ("grpo_epsilon", {"grpo_epsilon": 0.0}, "grpo_epsilon=0.0"),
      ("grpo_epsilon_high", {"grpo_epsilon_high": -0.1}, "grpo_epsilon_high"),
      ("grpo_beta", {"grpo_beta": -1.0}, "grpo_beta=-1.0"),
      ("grpo_adv_eps", {"grpo_advantage_eps": -1.0}, "grpo_advantage_eps"),
      ("grpo_no_reward", {"grpo_reward_functions": " "}, "grpo_reward_funct"),
      ("grpo_top_p_zero", {"grpo_top_p": 0.0}, r"grpo_top_p=0.0: must be in"),
      ("grpo_top_p_big", {"grpo_top_p": 1.5}, r"grpo_top_p=1.5: must be in"),
      ("grpo_eval_top_p", {"grpo_eval_top_p": 0.0}, "grpo_eval_top_p=0.0"),
      ("grpo_top_k", {"grpo_top_k": -1}, "grpo_top_k=-1"),
      ("grpo_top_k_vocab", {"grpo_top_k": 100000}, "grpo_top_k=100000"),
      ("grpo_decoder", {"grpo_decoder": "vllm"}, "grpo_decoder='vllm'"),
      ("grpo_executor", {"grpo_tool_executor": "dask"}, "grpo_tool_exec"),
      ("grpo_ray_actors", {"grpo_ray_actors": 0}, "grpo_ray_actors=0"),
      ("grpo_ray_call", {"grpo_ray_call_timeout_seconds": 0}, "grpo_ray_call"),
      ("grpo_slots", {"grpo_decode_slots": -1}, "grpo_decode_slots=-1"),
      ("grpo_replicas", {"grpo_generation_replicas": 0}, "grpo_generation_r"),
      (
          "grpo_replicas_divide",
          {"grpo_generation_devices": 4, "grpo_generation_replicas": 3},
          r"^config.grpo_generation_replicas=3: must divide "
          r"grpo_generation_devices=4$",
      ),
      ("grpo_max_age", {"grpo_max_age": 2}, r"grpo_max_age=2: must be one"),
      ("grpo_page", {"grpo_decode_page_size": 12}, "grpo_decode_page_size=12"),
      ("grpo_temperature", {"grpo_temperature": 0.0}, "grpo_temperature=0.0"),
      ("grpo_eval_temp", {"grpo_eval_temperature": -1.0}, "grpo_eval_temp"),
      ("grpo_length", {"grpo_max_completion_length": 0}, "grpo_max_compl"),
      ("grpo_prompts", {"grpo_eval_prompts": 0}, "grpo_eval_prompts=0"),
      ("grpo_target", {"grpo_target_pass_rate": 1.5}, "grpo_target_pass_"),
      ("grpo_stop_ids", {"grpo_stop_ids": "1,x"}, r"grpo_stop_ids='1,x': 'x'"),
      (
          "grpo_eval_samples",
          {"grpo_eval_samples_per_prompt": -1},
          "grpo_eval_samples_per_prompt=-1",
      ),
      (
          "grpo_eval_metric",
          {"grpo_eval_target_metric": "accuracy"},
          "grpo_eval_target_metric='accuracy'",
      ),
      (
          "grpo_tis_bounds",
          {"grpo_tis_ratio_min": 1.001, "grpo_tis_ratio_max": 1.002},
          "grpo_tis_ratio_min=1.001: with grpo_tis_ratio_max=1.002",
      ),
      (
          "grpo_tis_min_alone",
          {"grpo_tis_ratio_min": 0.999},
          "grpo_tis_ratio_min=0.999: needs grpo_tis_ratio_max",
      ),
      (
          "grpo_logprob_error",
          {"grpo_logprob_error_threshold": 0.5},
          "grpo_logprob_error_threshold=0.5",
      ),
      ("grpo_stop_big", {"grpo_stop_ids": "99999"}, "grpo_stop_ids='99999'"),
      (
          "bias_rate_negative",
          {"router_bias_update_rate": -0.1},
          "router_bias_update_rate=-0.1: must be >= 0",
      ),
      (
          "bias_rate_without_bias",
          {"num_experts": 4, "router_bias_update_rate": 0.01},
          "router_bias_update_rate=0.01: needs num_experts > 0 and router_bias",
      ),
      (
          "qk_norm_with_mla",
          {
              "attention_type": "mla",
              "kv_lora_rank": 8,
              "qk_nope_head_dim": 8,
              "qk_rope_head_dim": 4,
              "v_head_dim": 8,
              "qk_norm": True,
          },
          "qk_norm=True: needs attention_type='gqa'",
      ),
      (
          "norm_topk_with_sigmoid",
          {"router_score": "sigmoid", "router_norm_topk": True},
          "router_norm_topk=True: needs router_score='softmax'",
      ),
      (
          "multi_process_gcs_without_shared_checkpoints",
          {
              "num_processes": 2,
              "process_id": 0,
              "coordinator_address": "h:1",
              "base_output_directory": "gs://b/runs",
          },
          "checkpoint_directory=''",
      ),
  )
  def test_bad_value_raises_value_error_naming_it(self, overrides, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      config_lib.validate(_with(self.config, **overrides))

  @parameterized.named_parameters(
      ("str_for_int", "steps", "10"),
      ("float_for_int", "global_batch_size", 16.0),
      ("bool_for_int", "steps", True),
      ("int_for_bool", "resume", 1),
      ("str_for_float", "learning_rate", "1e-3"),
      ("int_for_str", "run_name", 3),
      ("numpy_int_for_int", "steps", np.int64(10)),
      ("bool_for_float", "learning_rate", False),
  )
  def test_wrong_type_raises_type_error_naming_it(self, key, value):
    with self.assertRaisesRegex(TypeError, f"config.{key}="):
      config_lib.validate(_with(self.config, **{key: value}))

  def test_field_types_are_the_types_of_the_base_defaults(self):
    defaults = base.get_config()
    self.assertEqual(set(config_lib.FIELD_TYPES), set(defaults.keys()))
    for key, expected in config_lib.FIELD_TYPES.items():
      with self.subTest(field=key):
        self.assertIn(expected, (str, int, float, bool))
        self.assertIs(type(defaults[key]), expected)
    # Spot checks: a float field written as an int literal in base.py would
    # turn into an int field and refuse the float values users give it.
    for key in (
        "learning_rate",
        "rope_theta",
        "target_eval_loss",
        "gcs_sync_interval_seconds",
        "grad_clip_norm",
    ):
      self.assertIs(config_lib.FIELD_TYPES[key], float, key)
    self.assertIs(config_lib.FIELD_TYPES["steps"], int)
    self.assertIs(config_lib.FIELD_TYPES["resume"], bool)
    self.assertIs(config_lib.FIELD_TYPES["run_name"], str)

  def test_int_is_accepted_for_float_fields(self):
    config_lib.validate(_with(self.config, learning_rate=1, rope_theta=10000))

  def test_missing_and_unknown_fields_are_errors(self):
    values = self.config.to_dict()
    del values["steps"]
    with self.assertRaisesRegex(ValueError, "missing.*steps"):
      config_lib.validate(ml_collections.ConfigDict(values))
    with self.assertRaisesRegex(ValueError, "unknown.*stpes"):
      config_lib.validate(_with(self.config, stpes=10))

  def test_valid_variants_pass(self):
    config_lib.validate(_with(self.config, run_name="my_run-1.2"))
    config_lib.validate(
        _with(
            self.config,
            num_processes=2,
            process_id=1,
            coordinator_address="10.0.0.1:8476",
        )
    )
    config_lib.validate(_with(self.config, num_processes=0))
    config_lib.validate(
        _with(self.config, data_parallelism=2, fsdp_parallelism=-1)
    )
    config_lib.validate(_with(self.config, warmup_steps=10, steps=10))
    config_lib.validate(_with(self.config, seed=-1))  # Drawn at the start.
    config_lib.validate(
        _with(
            self.config,
            attention_type="mla",
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
        )
    )
    config_lib.validate(
        _with(self.config, first_eval_samples=3 * self.config.global_batch_size)
    )
    config_lib.validate(
        _with(self.config, base_output_directory="gs://bucket/prefix")
    )

  def test_reads_no_files(self):
    # Data files and MLPerf rules are the pre-flight's
    # (maxtext/run/preflight.py).
    config_lib.validate(
        _with(
            self.config,
            dataset_type="grain",
            train_data_path="/nonexistent/data",
        )
    )

  @parameterized.named_parameters(
      ("attention", "attention", choices.ATTENTION_IMPLEMENTATIONS),
      ("attention_type", "attention_type", choices.ATTENTION_TYPES),
      ("remat_policy", "remat_policy", choices.REMAT_POLICIES),
      ("router_score", "router_score", choices.ROUTER_SCORES),
      ("rope_scaling", "rope_scaling", choices.ROPE_SCALINGS),
      ("load_balance_loss", "load_balance_loss", choices.LOAD_BALANCE_LOSSES),
      ("weight_dtype", "weight_dtype", choices.DTYPES),
      ("compute_dtype", "compute_dtype", choices.DTYPES),
      ("dataset_type", "dataset_type", choices.DATASET_TYPES),
      ("hardware", "hardware", choices.HARDWARE),
      ("lr_schedule", "lr_schedule", choices.LR_SCHEDULES),
      (
          "grpo_advantage_estimator",
          "grpo_advantage_estimator",
          choices.GRPO_ADVANTAGE_ESTIMATORS,
      ),
      ("grpo_kl_estimator", "grpo_kl_estimator", choices.GRPO_KL_ESTIMATORS),
      (
          "grpo_loss_aggregation",
          "grpo_loss_aggregation",
          choices.GRPO_LOSS_AGGREGATIONS,
      ),
  )
  def test_choice_fields_take_their_choices(self, key, names):
    self.assertIn(self.config[key], names)
    with self.assertRaisesRegex(
        ValueError, rf"config\.{key}='nope': must be one of"
    ):
      config_lib.validate(_with(self.config, **{key: "nope"}))

  def test_locked_config_rejects_a_misspelt_override(self):
    config = _load("default")
    config.lock()
    with self.assertRaises(AttributeError):
      config.stpes = 10


class HelpersTest(absltest.TestCase):

  def test_with_seed_copies_and_keeps_the_lock(self):
    config = base.get_config()
    config.seed = -1
    config.lock()
    copy = config_lib.with_seed(config, 42)
    self.assertEqual((config.seed, copy.seed), (-1, 42))
    with self.assertRaises(AttributeError):
      copy.sede = 1
    with self.assertRaisesRegex(ValueError, "seed"):
      config_lib.with_seed(config, -1)

  def test_with_values_sets_fields_of_a_copy(self):
    config = base.get_config()
    config.lock()
    self.assertIs(config_lib.with_values(config, {}), config)
    copy = config_lib.with_values(config, {"tokenizer_path": "/t"})
    self.assertEqual((config.tokenizer_path, copy.tokenizer_path), ("", "/t"))
    self.assertTrue(copy.is_locked)
    with self.assertRaisesRegex(KeyError, "tokenizer_pth"):
      config_lib.with_values(config, {"tokenizer_pth": "/t"})

  def test_validate_grpo_relations(self):
    config = _load("default")
    config_lib.validate_grpo(config)
    with self.assertRaisesRegex(
        ValueError, r"global_batch_size=18: must be divisible by grpo_num_gen"
    ):
      config_lib.validate_grpo(_with(config, global_batch_size=18))
    with self.assertRaisesRegex(
        ValueError, r"grpo_max_completion_length=61: plus grpo_prompt_length"
    ):
      config_lib.validate_grpo(_with(config, grpo_max_completion_length=61))
    with self.assertRaisesRegex(
        ValueError, r"eval_interval=10: must be a multiple of grpo_num_iter"
    ):
      config_lib.validate_grpo(
          _with(config, grpo_num_iterations=4, steps=200, checkpoint_period=100)
      )
    with self.assertRaisesRegex(
        ValueError, r"router_bias_update_rate=0.01: must be 0 in a GRPO run"
    ):
      config_lib.validate_grpo(_with(config, router_bias_update_rate=0.01))
    length = config.max_sequence_length
    largest = 1 << (length - 1).bit_length()
    config_lib.validate_grpo(_with(config, grpo_decode_page_size=largest))
    with self.assertRaisesRegex(
        ValueError,
        rf"^config.grpo_decode_page_size={2 * largest}: must be <= {largest} "
        rf"\(max_sequence_length={length},",
    ):
      config_lib.validate_grpo(_with(config, grpo_decode_page_size=2 * largest))
    with self.assertRaisesRegex(
        ValueError, r"^config.grpo_decode_slots=1000000000: must be <= \d+, "
    ):
      config_lib.validate_grpo(_with(config, grpo_decode_slots=10**9))
    with self.assertRaisesRegex(
        ValueError, r"grpo_force_on_policy_ratio=True: needs grpo_num_iter"
    ):
      config_lib.validate_grpo(
          _with(
              config,
              grpo_force_on_policy_ratio=True,
              grpo_num_iterations=2,
              steps=200,
              eval_interval=20,
              checkpoint_period=100,
          )
      )
    with self.assertRaisesRegex(
        ValueError, r"grpo_tis_ratio_max=1.002: needs grpo_force_on_policy"
    ):
      config_lib.validate_grpo(
          _with(config, grpo_tis_ratio_min=0.999, grpo_tis_ratio_max=1.002)
      )
    with self.assertRaisesRegex(
        ValueError, r"grpo_eval_target_metric='pass@4': the eval draws 1 "
    ):
      config_lib.validate_grpo(_with(config, grpo_eval_target_metric="pass@4"))
    with self.assertRaisesRegex(
        ValueError, r"grpo_overlong_filtering=True: needs grpo_stop_ids"
    ):
      config_lib.validate_grpo(_with(config, grpo_overlong_filtering=True))
    config_lib.validate_grpo(
        _with(config, grpo_overlong_filtering=True, grpo_stop_ids="3")
    )
    sampled = _with(
        config,
        grpo_eval_temperature=0.1,
        grpo_eval_samples_per_prompt=4,
        grpo_eval_target_metric="pass@4",
    )
    config_lib.validate_grpo(sampled)
    self.assertEqual(config_lib.eval_samples_per_prompt(sampled), 4)
    with self.assertRaisesRegex(
        ValueError, r"grpo_eval_samples_per_prompt=4: a greedy eval"
    ):
      config_lib.validate_grpo(_with(sampled, grpo_eval_temperature=0.0))

  def test_stop_ids(self):
    config = _load("default")
    self.assertEqual(config_lib.stop_ids(config), ())
    self.assertEqual(
        config_lib.stop_ids(_with(config, grpo_stop_ids="3, 7")), (3, 7)
    )

  def test_micro_batch_size(self):
    config = _with(
        _load("base"), global_batch_size=12, gradient_accumulation_steps=3
    )
    self.assertEqual(config_lib.micro_batch_size(config), 4)

  def test_to_json_dict_round_trips(self):
    config = _load("default")
    values = config_lib.to_json_dict(config)
    self.assertEqual(json.loads(json.dumps(values)), config.to_dict())

  def test_to_json_dict_rejects_unserialisable_values(self):
    with self.assertRaises(TypeError):
      config_lib.to_json_dict(_with(_load("base"), run_name=object()))

  def test_load_config_file_errors(self):
    with self.assertRaisesRegex(FileNotFoundError, "nope.py"):
      config_lib.load_config_file("/nonexistent/nope.py")
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "empty_config.py")
      with open(path, "w", encoding="utf-8") as f:
        f.write("X = 1\n")
      with self.assertRaisesRegex(ValueError, "get_config"):
        config_lib.load_config_file(path)
      with open(path, "w", encoding="utf-8") as f:
        f.write("def get_config():\n  return {'a': 1}\n")
      with self.assertRaisesRegex(ValueError, "not a ConfigDict"):
        config_lib.load_config_file(path)


class MLLogFieldsTest(parameterized.TestCase):
  """The MLPerf log's fields' types (their values:
  maxtext.mllog.mlperf_config; the rules: maxtext.mllog.mlperf_preflight)."""

  def test_cache_clear_command_of_wrong_type_is_refused(self):
    with self.assertRaisesRegex(TypeError, "config.cache_clear_command=1"):
      config_lib.validate(_with(_load("default"), cache_clear_command=1))


if __name__ == "__main__":
  absltest.main()
