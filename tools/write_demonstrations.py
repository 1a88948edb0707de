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

While it plays the demonstrations (their tools run in the sandbox), stderr
says how far it is: on a terminal one line redrawn, otherwise a line every
--progress_interval_s seconds, then the last line, e.g.

  write_demonstrations: 1,024 of 2,056 records (50%), 6.9 records/s,
      2m 28s elapsed, ETA 2m 29s; tool runs 4,096
  write_demonstrations: done, 2,056 records in 4m 58s (6.9 records/s);
      tool runs 8,224

(each one line; the figures are illustrative).
"""

from absl import app
from absl import flags

from maxtext.core import caller_paths
from maxtext.core import progress
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
_PROGRESS_S = flags.DEFINE_float(
    "progress_interval_s",
    10.0,
    "Seconds between progress lines on stderr when it is not a terminal.",
)


def main(argv: list[str]) -> None:
  command_line.check(argv, _TASK, _OUTPUT_DIR)
  with command_line.user_errors("write_demonstrations"):
    reporter = progress.Reporter(progress.stderr(), _PROGRESS_S.value)
    task = tasks.load(_TASK.value, _NUM_EVAL.value, _SEED.value)
    directory = caller_paths.resolve_local_path(_OUTPUT_DIR.value)
    counts = demonstrations.write(task, directory, _NUM_TRAIN.value, reporter)
    print(
        f"write_demonstrations: {counts['train']} training and "
        f"{counts['eval']} held-out demonstrations in {directory}",
        flush=True,
    )


if __name__ == "__main__":
  app.run(main)
