"""GRPO on the built-in text tasks end to end through the one loop: the math
task (one turn) and the repair task (tools in the sandbox), from their
config files, shrunk; and the refusals when bubblewrap cannot run or the
ray tool executor has no Ray."""

import json
import os

from absl.testing import absltest

from maxtext import workloads
from maxtext.configs import grpo_math_tiny
from maxtext.configs import grpo_repair_tiny
from maxtext.metrics import jsonl
from maxtext.run import trainer
from testing import tiny_configs

_SMALL_MODEL = dict(emb_dim=32, num_layers=1, num_heads=2, num_kv_heads=1,
                    head_dim=16, mlp_dim=64)  # fmt: skip


def _records(run_dir, kind):
  return [
      r
      for r in jsonl.read_jsonl(os.path.join(run_dir, jsonl.METRICS_FILENAME))
      if r["kind"] == kind
  ]


def _shrunk(config, out, **overrides):
  config.base_output_directory = out
  config.jax_compilation_cache_dir = tiny_configs.compilation_cache_dir()
  config.cache_clear_command = "sync"
  for key, value in dict(_SMALL_MODEL, **overrides).items():
    config[key] = value
  return config


class TextTasksTest(absltest.TestCase):

  def test_math(self):
    out = self.create_tempdir().full_path
    # The held-out eval draws a step's prompts x samples (2 x 4): it runs
    # the rollout's compiled generation programs, not a set of its own.
    config = _shrunk(
        grpo_math_tiny.get_config(), out, steps=2, eval_interval=2,
        checkpoint_period=2, global_batch_size=8, grpo_num_generations=4,
        grpo_eval_prompts=2, grpo_eval_samples_per_prompt=4,
        grpo_eval_target_metric="pass@4", grpo_max_completion_length=8,
    )  # fmt: skip
    result = workloads.run(config)
    self.assertEqual(result.final_step, 2)
    train = _records(result.run_dir, "train")
    self.assertLen(train, 2)
    for name in (
        "rewards/correct", "rewards/kind/math", "episode/turns",
        "episode/timeouts", "episode/model_tokens", "episode/env_tokens",
        "loss",
    ):  # fmt: skip
      self.assertIn(name, train[0])
    self.assertEqual(train[0]["episode/turns"], 1.0)
    self.assertEqual(train[0]["episode/env_tokens"], 0.0)
    (evaluation,) = _records(result.run_dir, "eval")
    self.assertIn("eval_pass@4", evaluation)
    with open(
        os.path.join(result.run_dir, "config.json"), encoding="utf-8"
    ) as f:
      recorded = json.load(f)
    self.assertIn("maxtext.env.math_task:make_task", json.dumps(recorded))

  def test_repair_runs_tools_in_the_sandbox(self):
    out = self.create_tempdir().full_path
    # The eval, as in test_math, a step's prompts x samples (2 x 2).
    config = _shrunk(
        grpo_repair_tiny.get_config(), out, steps=1, eval_interval=1,
        checkpoint_period=1, global_batch_size=4, grpo_num_generations=2,
        grpo_eval_prompts=2, grpo_eval_samples_per_prompt=2,
        grpo_eval_target_metric="pass@2", grpo_max_turns=2,
        grpo_max_turn_tokens=24, grpo_max_completion_length=96,
        max_sequence_length=640,
    )  # fmt: skip
    result = workloads.run(config)
    self.assertEqual(result.final_step, 1)
    (train,) = _records(result.run_dir, "train")
    for name in (
        "episode/turns", "episode/tool_calls", "episode/tool_errors",
        "episode/truncated", "episode/turn_limit", "episode/timeouts",
        "rewards/kind/repair", "rewards/verifier",
    ):  # fmt: skip
      self.assertIn(name, train)
    self.assertGreaterEqual(train["episode/turns"], 1.0)

  def test_refuses_to_start_without_bubblewrap(self):
    out = self.create_tempdir().full_path
    config = _shrunk(grpo_repair_tiny.get_config(), out)
    path = os.environ["PATH"]
    os.environ["PATH"] = self.create_tempdir().full_path
    try:
      with self.assertRaisesRegex(
          trainer.ConfigError,
          r"^config.grpo_task='maxtext.env.repair_task:make_task': bwrap "
          r"\(Debian's bubblewrap\) is not installed: .* \(trusted tools "
          r"may run unisolated: config.grpo_allow_unisolated_tools=True\)$",
      ):
        workloads.run(config)
    finally:
      os.environ["PATH"] = path
    self.assertFalse(os.path.exists(os.path.join(out, "grpo_repair_tiny")))

  def test_refuses_the_ray_executor_without_ray(self):
    # This target carries no Ray (its own lock): the run stops in one line
    # naming the field and the install, and writes nothing.
    out = self.create_tempdir().full_path
    config = _shrunk(grpo_repair_tiny.get_config(), out)
    config.grpo_tool_executor = "ray"
    with self.assertRaisesRegex(
        trainer.ConfigError,
        r"^config.grpo_tool_executor='ray': .*requirements_ray_lock.txt",
    ):
      workloads.run(config)
    self.assertFalse(os.path.exists(os.path.join(out, "grpo_repair_tiny")))


if __name__ == "__main__":
  absltest.main()
