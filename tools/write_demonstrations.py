"""Writes a GRPO task's demonstrations as an SFT data directory.

Run:

  tools/bazel run //tools:write_demonstrations -- \
      --task=maxtext.env.math_task:make_task --output_dir=/tmp/demos/math

then fine-tune on them (`maxtext/configs/sft_math_tiny.py` reads that
directory) and start GRPO from the fine-tuned checkpoint (docs/grpo.md). The
directory holds train.jsonl (demonstrations of training records), eval.jsonl
(of the held-out records) and the byte-level ChatML tokenizer. A bad input is
a one-line error (exit status 2). Relative paths resolve against the
directory `bazel run` was started from.
"""

from absl import app
from absl import flags

from maxtext.core import caller_paths
from maxtext.env import demonstrations
from maxtext.env import tasks
from tools import command_line

_TASK = flags.DEFINE_string(
    "task", None, "The task, module:factory (as config.grpo_task)."
)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Directory to write.")
_NUM_TRAIN = flags.DEFINE_integer(
    "num_train", 2048, "Training demonstrations to write."
)
_NUM_EVAL = flags.DEFINE_integer(
    "num_eval", 64, "Held-out records (as config.grpo_eval_prompts)."
)
_SEED = flags.DEFINE_integer("seed", 0, "The task's seed (as config.seed).")


def main(argv: list[str]) -> None:
  command_line.check(argv, _TASK, _OUTPUT_DIR)
  with command_line.user_errors("write_demonstrations"):
    task = tasks.load(_TASK.value, _NUM_EVAL.value, _SEED.value)
    directory = caller_paths.resolve_local_path(_OUTPUT_DIR.value)
    counts = demonstrations.write(task, directory, _NUM_TRAIN.value)
    print(
        f"write_demonstrations: {counts['train']} training and "
        f"{counts['eval']} held-out demonstrations in {directory}",
        flush=True,
    )


if __name__ == "__main__":
  app.run(main)
