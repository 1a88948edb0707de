"""GRPO on tiny inputs in the MLPerf benchmark's formats (CodeAct tools).

The benchmark's task loader (maxtext/env/benchmark_task.py) on five tiny
tasks (maxtext/env/tiny_benchmark_inputs.py): a curriculum of three and a
validation set of two, each task a bash "repository" with one bug at
/testbed in its own root filesystem, which the sandbox binds as `/`
(bubblewrap; the run refuses to start without it). Write the inputs, then
run:

  tools/bazel run //tools:write_benchmark_inputs -- \\
      --output_dir=/tmp/benchmark_tiny
  tools/bazel run //maxtext:train_main -- \\
      --config=maxtext/configs/grpo_benchmark_tasks_tiny.py

With the benchmark's own files, keep this shape and point the grpo_task_*
fields at them (docs/grpo.md, "The benchmark's inputs").
"""

import os
import tempfile

import ml_collections

from maxtext.configs import grpo_repair_tiny

# Where //tools:write_benchmark_inputs writes by the command above.
INPUTS = os.path.join(tempfile.gettempdir(), "benchmark_tiny")
# The tiny files' SHA-256 digests (the writer's bytes are the same on every
# run; grpo_benchmark_tasks_tiny_test checks these against them).
CURRICULUM_SHA256 = (
    "84abb47c1585f013c5b5a8c966a735d1aa6f16b34be870d6f59d051df56e1ca7"
)
VALIDATION_SHA256 = (
    "404ddbaf0264dd28e3da6e0a428f6e66b238eb08cd0dbf24cab6da2516697aca"
)


def get_config() -> ml_collections.ConfigDict:
  """grpo_repair_tiny.py's model and episodes; the benchmark's task."""
  config = grpo_repair_tiny.get_config()
  config.run_name = "grpo_benchmark_tasks_tiny"
  config.grpo_task = "maxtext.env.benchmark_task:make_task"
  config.grpo_task_curriculum_path = os.path.join(INPUTS, "curriculum.jsonl")
  config.grpo_task_curriculum_sha256 = CURRICULUM_SHA256
  config.grpo_task_validation_path = os.path.join(INPUTS, "validation.jsonl")
  config.grpo_task_validation_sha256 = VALIDATION_SHA256
  config.grpo_task_rootfs_dir = os.path.join(INPUTS, "rootfs")
  # The first prompt (the template, the three tools' schemas, the issue).
  config.grpo_prompt_length = 1024
  config.max_sequence_length = 2560
  # 2 tasks x 4 episodes per step; the validation set's 2 tasks held out.
  config.grpo_eval_prompts = 2
  config.steps = 20
  config.eval_interval = 10
  config.checkpoint_period = 10
  return config
