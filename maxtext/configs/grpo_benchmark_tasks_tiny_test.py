"""grpo_benchmark_tasks_tiny.py: its digests are the tiny inputs', a shrunk
run plays episodes in the tasks' own root filesystems (bubblewrap) through
the one loop, and a curriculum that is not the pinned one is refused before
the run starts."""

import json
import os

from absl.testing import absltest

from maxtext import workloads
from maxtext.configs import grpo_benchmark_tasks_tiny
from maxtext.env import benchmark_task
from maxtext.env import tiny_benchmark_inputs
from maxtext.metrics import jsonl
from maxtext.run import trainer
from testing import tiny_configs

_SMALL_MODEL = dict(emb_dim=32, num_layers=1, num_heads=2, num_kv_heads=1,
                    head_dim=16, mlp_dim=64)  # fmt: skip


class GrpoBenchmarkTasksTinyTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.inputs = tiny_benchmark_inputs.write(
        os.path.join(self.create_tempdir().full_path, "inputs")
    )
    self.out = self.create_tempdir().full_path

  def _config(self, **overrides):
    config = grpo_benchmark_tasks_tiny.get_config()
    config.base_output_directory = self.out
    config.jax_compilation_cache_dir = tiny_configs.compilation_cache_dir()
    config.cache_clear_command = "sync"
    for key, value in self.inputs.items():
      config[f"grpo_task_{key}"] = value
    for key, value in dict(_SMALL_MODEL, **overrides).items():
      config[key] = value
    return config

  def test_the_digests_are_the_tiny_inputs(self):
    config = grpo_benchmark_tasks_tiny.get_config()
    self.assertEqual(
        config.grpo_task_curriculum_sha256, self.inputs["curriculum_sha256"]
    )
    self.assertEqual(
        config.grpo_task_validation_sha256, self.inputs["validation_sha256"]
    )
    for key in ("curriculum_path", "validation_path", "rootfs_dir"):
      self.assertEqual(
          os.path.relpath(config[f"grpo_task_{key}"],
                          grpo_benchmark_tasks_tiny.INPUTS),
          os.path.relpath(self.inputs[key],
                          os.path.dirname(self.inputs["rootfs_dir"])),
      )  # fmt: skip

  def test_episodes_in_the_task_images_through_the_loop(self):
    shrunk = dict(
        eval_interval=1, checkpoint_period=1, global_batch_size=4,
        grpo_num_generations=2, grpo_eval_prompts=1,
        grpo_eval_samples_per_prompt=2, grpo_eval_target_metric="pass@2",
        grpo_max_turns=2, grpo_max_turn_tokens=24,
        grpo_max_completion_length=96, lr_schedule_steps=1,
    )  # fmt: skip
    config = self._config(steps=1, **shrunk)
    result = workloads.run(config)
    self.assertEqual(result.final_step, 1)
    records = jsonl.read_jsonl(
        os.path.join(result.run_dir, jsonl.METRICS_FILENAME)
    )
    (train,) = [r for r in records if r["kind"] == "train"]
    for name in ("episode/turns", "episode/tool_calls", "rewards/kind/swe",
                 "rewards/verifier", "episode/env_tokens"):  # fmt: skip
      self.assertIn(name, train)
    # A random model's turns call no tool: the verifier ran the hidden
    # tests on the unfixed repositories.
    self.assertEqual(train["rewards/kind/swe"], 0.0)
    (evaluation,) = [r for r in records if r["kind"] == "eval"]
    self.assertIn("eval_pass@2", evaluation)
    with open(
        os.path.join(result.run_dir, "config.json"), encoding="utf-8"
    ) as f:
      recorded = json.dumps(json.load(f))
    self.assertIn(self.inputs["curriculum_sha256"], recorded)
    # A resume on another curriculum (the same tasks in another order, with
    # its own digest, so the loader takes it) is refused: the run trained
    # on the recorded one.
    path = self.inputs["curriculum_path"]
    with open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(reversed(lines)) + "\n")
    config = self._config(steps=2, **shrunk)
    digest = benchmark_task.sha256_of(path)
    config.grpo_task_curriculum_sha256 = digest
    with self.assertRaisesRegex(
        trainer.ConfigError,
        r"Refusing to resume run 'grpo_benchmark_tasks_tiny': 1 field\(s\) "
        rf"(.|\n)*grpo_task_curriculum_sha256: "
        rf"'{self.inputs['curriculum_sha256']}' -> '{digest}'",
    ):
      workloads.run(config)

  def test_another_curriculum_is_refused_before_the_run(self):
    with open(self.inputs["curriculum_path"], "a", encoding="utf-8") as f:
      f.write("\n")
    config = self._config()
    with self.assertRaisesRegex(
        trainer.ConfigError,
        rf"^{self.inputs['curriculum_path']}: SHA-256 [0-9a-f]{{64}}, "
        rf"expected {self.inputs['curriculum_sha256']} ",
    ):
      workloads.run(config)
    self.assertFalse(os.path.exists(os.path.join(self.out, config.run_name)))


if __name__ == "__main__":
  absltest.main()
