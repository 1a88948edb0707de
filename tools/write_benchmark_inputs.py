"""Writes tiny inputs in the MLPerf benchmark's formats for GRPO on the CPU.

Run:

  tools/bazel run //tools:write_benchmark_inputs -- \
      --output_dir=/tmp/benchmark_tiny

It writes curriculum.jsonl (three tasks, in order), validation.jsonl (two)
and rootfs/ (one root filesystem per task image: bash and a few programs
copied from the host, a bash repository with one bug at /testbed), and
prints the grpo_task_* config fields that name them, digests included
(`maxtext/configs/grpo_benchmark_tasks_tiny.py` holds them for
/tmp/benchmark_tiny). The directory must not exist yet. Relative paths
resolve against the directory `bazel run` was started from.
"""

import os

from absl import app
from absl import flags

from maxtext.core import caller_paths
from maxtext.env import tiny_benchmark_inputs
from tools import command_line

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Directory to write.")


def main(argv: list[str]) -> None:
  command_line.check(argv, _OUTPUT_DIR)
  with command_line.user_errors("write_benchmark_inputs"):
    directory = caller_paths.resolve_local_path(_OUTPUT_DIR.value)
    if os.path.exists(directory):
      raise ValueError(f"--output_dir={directory}: already exists")
    try:
      os.makedirs(directory)
    except OSError as e:
      raise ValueError(
          f"--output_dir={directory}: cannot be created: {e.strerror}"
      ) from None
    written = tiny_benchmark_inputs.write(directory)
    for key, value in written.items():
      print(f"--config.grpo_task_{key}={value}", flush=True)


if __name__ == "__main__":
  app.run(main)
