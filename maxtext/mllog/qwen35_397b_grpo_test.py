"""The qwen35_397b_grpo config's MLPerf header against the closed rules.

As for deepseekv3_671b: `maxtext.mllog.header_proof` writes the config's real
header (the hyperparameters the MLPerf listener logs for a GRPO run) and run
events marked `"synthetic": true` at the evaluations the GRPO run's schedule
makes, and the official checker judges it with the closed
qwen35_397b_grpo rules of 6.1.0 (the only ruleset that has the benchmark).
The tiny GRPO config is refused in the closed division before any device
work, naming a key.
"""

import json
import math
import os

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from maxtext.config import config_lib
from maxtext.configs import grpo_tiny
from maxtext.configs import qwen35_397b_grpo
from maxtext.run import trainer
from maxtext.grpo import grpo_config
from maxtext.grpo import grpo_workload
from maxtext import workloads
from maxtext.env import benchmark_task
from maxtext.env import episodes
from maxtext.env import tiny_benchmark_inputs
from maxtext.mllog import header_proof
from maxtext.mllog import hyperparameters
from maxtext.mllog import mlperf_preflight
from maxtext.mllog import rules
from maxtext.text import byte_chat
from maxtext.text import chat
from maxtext.mllog import mlperf_config


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


def _grpo(config):
  """The GRPO run's part of its MLPerf log (its workload's)."""
  return _workload(config).mlperf_header()


def _workload(config) -> grpo_workload.GrpoWorkload:
  """The GRPO run's workload, with its settings as the top builds them."""
  return grpo_workload.GrpoWorkload(grpo_config.GrpoConfig.from_config(config))


_RULESET = "6.1.0"
_BENCHMARK = "qwen35_397b_grpo"


def _config(batch="", **overrides):
  values = qwen35_397b_grpo.get_config(batch).to_dict()
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def _benchmark_inputs(directory):
  """The config's input fields on tiny files in the benchmark's formats,
  with a validation set of the rules' size (the tiny tasks' held-out
  records repeated under new ids), and `load_parameters_path` a
  checkpoint directory with a tokenizer imported beside it."""
  files = tiny_benchmark_inputs.write(os.path.join(directory, "inputs"))
  with open(files["validation_path"], encoding="utf-8") as f:
    held_out = [json.loads(line) for line in f if line.strip()]
  with open(files["validation_path"], "w", encoding="utf-8") as f:
    for i in range(qwen35_397b_grpo.EVAL_TASKS):
      record = dict(held_out[i % len(held_out)], instance_id=f"held-out-{i}")
      f.write(json.dumps(record) + "\n")
  files["validation_sha256"] = benchmark_task.sha256_of(
      files["validation_path"]
  )
  checkpoint = os.path.join(directory, "warm_start")
  os.makedirs(os.path.join(checkpoint, "0"))
  byte_chat.write(checkpoint)
  fields = {f"grpo_task_{key}": value for key, value in files.items()}
  fields["load_parameters_path"] = checkpoint
  return fields


def _header(config):
  return header_proof.fresh_run_header(
      _mlperf(config), "qwen35_397b_grpo.py", _grpo(config)
  )


def _prove(config):
  return header_proof.prove(_mlperf(config), _header(config), _grpo(config))


class Qwen35GrpoMllogTest(parameterized.TestCase):

  def test_config_is_a_closed_grpo_submission(self):
    config = qwen35_397b_grpo.get_config()
    self.assertEqual(config.submission_division, "closed")
    self.assertEqual(config.submission_benchmark, _BENCHMARK)
    self.assertIn(_BENCHMARK, rules.benchmarks(_RULESET))
    self.assertTrue(hyperparameters.is_grpo_benchmark(_mlperf(config)))
    self.assertEqual(rules.reference_mismatches(_mlperf(config)), [])
    # Every check a GRPO run makes before device work (grpo_main's), on
    # the benchmark's inputs.
    inputs = _benchmark_inputs(self.create_tempdir().full_path)
    workloads.check(_config(**inputs))
    # A pretraining run cannot log a GRPO benchmark.
    with self.assertRaisesRegex(
        ValueError, "submission_benchmark='qwen35_397b_grpo': a GRPO benchmark"
    ):
      mlperf_preflight.check(_mlperf(config))

  def test_a_run_without_its_inputs_is_refused_in_one_line(self):
    inputs = _benchmark_inputs(self.create_tempdir().full_path)
    # Without the checkpoint (and so its tokenizer and chat template).
    with self.assertRaisesRegex(
        trainer.ConfigError,
        r"^config.grpo_tokenizer_path='': a text task needs the policy's "
        r"tokenizer and chat template: [^\n]*$",
    ):
      workloads.check(qwen35_397b_grpo.get_config())
    # With it, every task input is named at once.
    with self.assertRaisesRegex(
        trainer.ConfigError,
        r"^config.grpo_task_curriculum_path, grpo_task_curriculum_sha256, "
        r"grpo_task_validation_path, grpo_task_validation_sha256, "
        r"grpo_task_rootfs_dir: empty; [^\n]*$",
    ):
      workloads.check(
          _config(load_parameters_path=inputs["load_parameters_path"])
      )

  def test_config_makes_the_reference_choices(self):
    # docs/grpo.md's table: each reference setting, the field, its value.
    config = qwen35_397b_grpo.get_config()
    want = {
        "grpo_advantage_estimator": "rloo_normalized",
        "grpo_advantage_eps": 1e-6,
        "grpo_loss_aggregation": "token_mean",
        "grpo_epsilon": 0.2,
        "grpo_epsilon_high": 0.28,
        "grpo_force_on_policy_ratio": True,
        "grpo_tis_ratio_min": 0.999,
        "grpo_tis_ratio_max": 1.002,
        "grpo_logprob_error_threshold": 2.0,
        "grpo_overlong_filtering": True,
        "grpo_freeze_router": True,
        "grpo_beta": 0.0,
        "grpo_num_iterations": 1,
        "grpo_max_age": 1,
        "grpo_eval_samples_per_prompt": 4,
        "grpo_eval_target_metric": "pass@4",
        "grpo_eval_prompts": 251,
        "grpo_eval_temperature": 0.1,
        "grpo_eval_top_p": 0.95,
        "grpo_temperature": 1.0,
        "grpo_top_p": 1.0,
        "weight_decay": 0.0,
        # The benchmark's episodes (the recipe's agent_max_turns,
        # swebench_agent_timeout and max_total_sequence_length).
        "grpo_task": "maxtext.env.benchmark_task:make_task",
        "grpo_max_turns": 30,
        "grpo_max_turn_tokens": 0,
        "grpo_episode_timeout_seconds": 1800.0,
        "grpo_allow_unisolated_tools": False,
        "grpo_tokenizer_path": "",
        "grpo_reward_functions": "",
    }
    self.assertEqual({key: config[key] for key in want}, want)
    # The loss those fields build (the run's, through loss_options).
    options = grpo_workload.loss_options(
        grpo_config.GrpoConfig.from_config(config)
    )
    self.assertTrue(options.force_on_policy_ratio)
    self.assertEqual(
        (options.tis_ratio_min, options.tis_ratio_max), (0.999, 1.002)
    )
    self.assertEqual(options.logprob_error_threshold, 2.0)
    self.assertEqual(options.temperature, 1.0)
    self.assertEqual(
        grpo_workload.eval_options(
            grpo_config.GrpoConfig.from_config(config)
        ).num_samples,
        4,
    )
    # The run is accepted with rollouts drawn one step ahead, and plays the
    # benchmark's episodes: 65,536 tokens in all, the first prompt counted,
    # a turn taking what is left, with the checkpoint's chat template.
    inputs = _benchmark_inputs(self.create_tempdir().full_path)
    benchmark = _config(**inputs)
    workload = _workload(benchmark)
    workload.check()
    self.assertTrue(workload.reads_ahead)
    # The workload's episode setup, as its rollouts receive it.
    setup = workload._episodes  # pylint: disable=protected-access
    self.assertEqual(setup.task.kind, "swe")
    self.assertEqual(setup.task.eval_records()[-1]["instance_id"],
                     f"held-out-{qwen35_397b_grpo.EVAL_TASKS - 1}")  # fmt: skip
    columns = qwen35_397b_grpo.SEQUENCE - qwen35_397b_grpo.PROMPT_LENGTH
    self.assertEqual(
        setup.limits,
        episodes.Limits(
            max_turns=30,
            max_tokens=columns,
            max_turn_tokens=columns,
            episode_seconds=1800.0,
            max_length=65536,
        ),
    )
    self.assertEqual(
        setup.chat.fingerprint,
        chat.ChatTokenizer.load(inputs["load_parameters_path"]).fingerprint,
    )
    self.assertTrue(setup.tools.isolated)
    # A lower bound of 0 is a bound (the upper one turns TIS on).
    low = grpo_workload.loss_options(
        grpo_config.GrpoConfig.from_config(_config(grpo_tis_ratio_min=0.0))
    )
    self.assertEqual((low.tis_ratio_min, low.tis_ratio_max), (0.0, 1.002))

  @parameterized.parameters("256", "384", "512", "1024")
  def test_header_satisfies_the_closed_rules(self, batch):
    config = _config(batch)
    config_lib.validate(config)
    config_lib.validate_grpo(config)
    mlperf_preflight.check(_mlperf(config), _grpo(config))
    hparams = _header(config)
    gbs = int(batch)
    # The values the run uses, from the fields that drive it.
    self.assertEqual(hparams["global_batch_size"], gbs)
    self.assertEqual(hparams["num_prompts_per_step"] * 16, gbs)
    self.assertEqual(
        hparams["max_sequence_length"],
        config.grpo_prompt_length + config.grpo_max_completion_length,
    )
    self.assertEqual(hparams["eval_samples"], config.grpo_eval_prompts)
    self.assertEqual(hparams["opt_learning_rate_decay_schedule"], "constant")
    self.assertAlmostEqual(
        hparams["opt_base_learning_rate"], 1e-6 * math.sqrt(gbs / 256)
    )
    self.assertEqual(
        hparams["generation_validation_rollout_temperature"],
        config.grpo_eval_temperature,
    )
    # Every key the benchmark's rules name is in the header.
    rule_header_keys = (
        header_proof.rule_keys(_RULESET, "closed", _BENCHMARK)
        - header_proof.RUN_KEYS
    )
    self.assertEqual(
        {k for k in rule_header_keys if not k.startswith("submission_")}
        - set(hparams),
        set(),
    )
    # The first evaluation at the rule's samples, the next one step later.
    points = header_proof.eval_points(_mlperf(config), _grpo(config))
    self.assertEqual(
        [
            header_proof.samples_after(_mlperf(config), p, _grpo(config))
            for p in points
        ],
        [
            gbs * math.ceil(2.5 + 3840 / gbs),
            gbs * math.ceil(2.5 + 3840 / gbs) + gbs,
        ],
    )
    verdict = _prove(config)
    self.assertTrue(verdict.passed, verdict)

  def test_two_passes_per_rollout_keep_the_sample_counts(self):
    # Two updates per rollout: the evaluations fall after every rollout,
    # at the same samples_count (a rollout's samples count once).
    config = _config(grpo_num_iterations=2, eval_interval=2, steps=200)
    points = header_proof.eval_points(_mlperf(config), _grpo(config))
    self.assertEqual(points, (2 * 18, 2 * 19))
    self.assertEqual(
        [
            header_proof.samples_after(_mlperf(config), p, _grpo(config))
            for p in points
        ],
        [256 * 18, 256 * 19],
    )
    self.assertTrue(_prove(config).passed)

  def test_first_eval_a_step_late_fails(self):
    config = _config()
    config.first_eval_samples += config.global_batch_size
    self.assertEqual(
        [f.key for f in _prove(config).failures], ["eval_accuracy"]
    )

  @parameterized.named_parameters(
      ("learning_rate", "learning_rate", 2e-6, "opt_base_learning_rate"),
      ("clip", "grad_clip_norm", 1.0, "opt_gradient_clip_norm"),
      ("generations", "grpo_num_generations", 8, "num_generations_per_prompt"),
      ("rollout_t", "grpo_temperature", 0.7, "generation_training_rollout_"),
      ("eval_top_p", "grpo_eval_top_p", 1.0, "generation_validation_rollout"),
      ("eval_prompts", "grpo_eval_prompts", 250, "eval_samples"),
      ("completion", "grpo_max_completion_length", 1000, "max_sequence_len"),
      ("beta2", "adam_b2", 0.95, "opt_adamw_beta_2"),
  )
  def test_checker_names_a_wrong_hyperparameter(self, field, value, key):
    verdict = _prove(_config(**{field: value}))
    keys = {f.key for f in verdict.config_failures()}
    self.assertTrue(any(k.startswith(key) for k in keys), keys)

  def test_target_at_the_rules_threshold_fails(self):
    # The run would stop at pass@1 0.69, which the rules do not accept.
    verdict = _prove(_config(grpo_target_pass_rate=0.69))
    self.assertEqual([f.key for f in verdict.failures], ["eval_accuracy"])
    self.assertIn("> s['target_accuracy']", verdict.failures[0].failed_test)

  def test_tiny_config_is_refused_in_the_closed_division(self):
    config = grpo_tiny.get_config()
    config.submission_division = "closed"
    with self.assertRaises(trainer.ConfigError) as caught:
      workloads.check(config)
    message = str(caught.exception)
    self.assertNotIn("\n", message)
    self.assertIn(
        f"config.global_batch_size={config.global_batch_size}", message
    )
    # At a reference batch size the header proof names the keys off the
    # rules, with the field that sets each.
    config.global_batch_size = 256
    config.gradient_accumulation_steps = 8
    config.learning_rate = 1e-6
    with self.assertRaises(trainer.ConfigError) as caught:
      workloads.check(config)
    message = str(caught.exception)
    self.assertNotIn("\n", message)
    self.assertIn(
        "max_sequence_length=8 (config.grpo_prompt_length + "
        "grpo_max_completion_length) fails",
        message,
    )
    self.assertIn(
        f"eval_samples={config.grpo_eval_prompts} (config.grpo_eval_prompts)",
        message,
    )

  def test_grpo_run_logs_only_a_grpo_benchmark(self):
    config = grpo_tiny.get_config()
    config.submission_benchmark = "llama31_8b"
    with self.assertRaisesRegex(
        trainer.ConfigError,
        r"^config.submission_benchmark='llama31_8b': a GRPO run's MLPerf log "
        r"is for a GRPO benchmark of ruleset 6.1.0 \(\['qwen35_397b_grpo'\]\)$",
    ):
      workloads.check(config)
    # Without a log there is nothing to refuse.
    config.enable_mllog = False
    workloads.check(config)

  def test_batch_argument_is_checked(self):
    with self.assertRaisesRegex(ValueError, "260 is not a positive multiple"):
      qwen35_397b_grpo.get_config("260")
    with self.assertRaisesRegex(ValueError, "must be an integer, got 'x'"):
      qwen35_397b_grpo.get_config("x")


if __name__ == "__main__":
  absltest.main()
