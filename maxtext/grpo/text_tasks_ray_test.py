"""GRPO on the repair task with its tools on Ray actors, end to end.

The run's config asks for the ray tool executor with no address, so the
executor starts a Ray instance on this host; two actor processes hold the
episodes' sandboxes. The step's records are those of a run whose tools
answered (no executor errors, the verifier's reward reported).
"""

import os

from absl.testing import absltest

# pylint: disable-next=import-error  # In the @pypi_ray lock, not lint's.
import ray

from maxtext import workloads
from maxtext.configs import grpo_repair_tiny
from maxtext.metrics import jsonl
from testing import tiny_configs


class TextTasksRayTest(absltest.TestCase):

  def tearDown(self):
    ray.shutdown()
    super().tearDown()

  def test_repair_with_its_tools_on_ray_actors(self):
    config = grpo_repair_tiny.get_config()
    config.base_output_directory = self.create_tempdir().full_path
    config.jax_compilation_cache_dir = tiny_configs.compilation_cache_dir()
    config.cache_clear_command = "sync"
    overrides = dict(
        emb_dim=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
        mlp_dim=64, steps=1, eval_interval=1, checkpoint_period=1,
        global_batch_size=4, grpo_num_generations=2, grpo_eval_prompts=1,
        grpo_eval_samples_per_prompt=2, grpo_eval_target_metric="pass@2",
        grpo_max_turns=2, grpo_max_turn_tokens=24,
        grpo_max_completion_length=96, max_sequence_length=640,
        grpo_tool_executor="ray", grpo_ray_actors=2,
        grpo_ray_call_timeout_seconds=120.0,
    )  # fmt: skip
    for key, value in overrides.items():
      config[key] = value
    result = workloads.run(config)
    self.assertEqual(result.final_step, 1)
    (train,) = [
        r
        for r in jsonl.read_jsonl(
            os.path.join(result.run_dir, jsonl.METRICS_FILENAME)
        )
        if r["kind"] == "train"
    ]
    self.assertEqual(train["episode/executor_errors"], 0.0)
    self.assertGreaterEqual(train["episode/turns"], 1.0)
    self.assertIn("rewards/verifier", train)
    # The executor started Ray here, with one CPU per actor.
    self.assertEqual(ray.cluster_resources()["CPU"], 2.0)


if __name__ == "__main__":
  absltest.main()
