"""Demonstrations as an SFT data directory, read by the chat data set."""

import json
import os
from unittest import mock

from absl.testing import absltest

from maxtext.core import progress
from maxtext.data import chat_dataset
from maxtext.data import data_config
from maxtext.env import demonstrations
from maxtext.env import math_task
from maxtext.env import repair_task
from maxtext.env import tasks
from maxtext.text import chat
from testing import tiny_configs


class DemonstrationsTest(absltest.TestCase):

  def test_math_and_repair_directories_read_as_chat_data(self):
    for task, seq in (
        (math_task.make_task(num_eval=4), 160),
        (repair_task.make_task(num_eval=2), 2048),
    ):
      directory = self.create_tempdir().full_path
      counts = demonstrations.write(task, directory, 20)
      self.assertEqual(counts, {"train": 20, "eval": len(task.eval_records())})
      with open(os.path.join(directory, "train.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
      self.assertLen(lines, 20)
      with open(os.path.join(directory, "eval.jsonl"), encoding="utf-8") as f:
        held_out = {json.dumps(json.loads(line)["messages"]) for line in f}
      self.assertLen(held_out, len(task.eval_records()))
      self.assertEmpty(held_out & {json.dumps(l["messages"]) for l in lines})
      config = tiny_configs.model_config(
          vocab_size=320,
          max_sequence_length=seq,
          dataset_type="chat",
          tokenizer_path=directory,
          train_data_path=os.path.join(directory, "train.jsonl"),
          eval_data_path=os.path.join(directory, "eval.jsonl"),
      )
      tokenizer = chat.ChatTokenizer.load(directory)
      examples = chat_dataset.load_examples(
          data_config.DataConfig.from_config(config),
          "train_data_path",
          tokenizer,
      )
      self.assertGreater(examples.assistant_tokens, 0)
      self.assertLess(examples.assistant_tokens, examples.tokens)

  def test_repair_demonstrations_show_what_an_episode_shows(self):
    # The tools' real answers (the test run's own output), the environment's
    # tools beside the messages, and a fine-tuning row that begins with the
    # very ids an episode's first prompt has.
    task = repair_task.make_task(num_eval=1)
    directory = self.create_tempdir().full_path
    demonstrations.write(task, directory, 2)
    with open(os.path.join(directory, "train.jsonl"), encoding="utf-8") as f:
      line = json.loads(f.readline())
    record = task.train_records(0, 1)[0]
    env = task.make_environment(record, tasks.ToolSettings())
    try:
      first, tools = env.start(), env.tools
    finally:
      env.close()
    self.assertEqual(line["tools"], tools)
    self.assertEqual(line["messages"][: len(first)], first)
    answers = [m["content"] for m in line["messages"] if m["role"] == "tool"]
    self.assertEqual(answers[0], record["files"][record["fix"]["path"]])
    self.assertRegex(answers[-1], r"^tests passed\n(.|\n)*Ran 3 tests(.|\n)*OK")
    tokenizer = chat.ChatTokenizer.load(directory)
    prompt = tokenizer.encode_prompt(first, tools=tools)
    row = tokenizer.encode(line["messages"], tools=line["tools"])
    self.assertEqual(list(row.ids[: len(prompt)]), prompt)
    self.assertFalse(row.assistant_mask[: len(prompt)].any())
    with open(os.path.join(directory, "eval.jsonl"), encoding="utf-8") as f:
      self.assertIn("tools", json.loads(f.readline()))

  def test_progress_counts_records_and_tool_runs(self):
    lines = []
    ticks = iter(range(0, 1000, 10))  # Each reading of the clock 10 s on.
    reporter = progress.Reporter(
        progress.Lines(lines.append),
        interval_s=10.0,
        clock=lambda: float(next(ticks)),
    )
    task = repair_task.make_task(num_eval=1)
    demonstrations.write(task, self.create_tempdir().full_path, 2, reporter)
    # Each record's tool runs, counted from its environment's own answers
    # (the last one ends the episode and is not kept in the messages).
    runs = []
    for record in task.train_records(0, 2) + task.eval_records():
      env = task.make_environment(record, tasks.ToolSettings())
      try:
        env.start()
        count = 0
        for message in task.demonstration(record):
          if message["role"] == "assistant":
            reply = env.step(message["content"])
            count += sum(m["role"] == "tool" for m in reply.messages)
            if reply.done:
              break
      finally:
        env.close()
      runs.append(count)
    self.assertGreater(min(runs), 0)
    totals = [sum(runs[:i]) for i in (1, 2, 3)]
    # A line after each record (10 s apart), then the last line.
    self.assertEqual(
        [line.split(", ", 1)[0] for line in lines[:3]],
        [
            f"write_demonstrations: {i} of 3 records ({p}%)"
            for i, p in ((1, 33), (2, 67), (3, 100))
        ],
    )
    self.assertEqual(
        [line.rpartition("; ")[2] for line in lines],
        [f"tool runs {n}" for n in totals + totals[-1:]],
    )
    self.assertRegex(
        lines[-1],
        r"^write_demonstrations: done, 3 records in 40 s \(0.075 records/s\);",
    )

  def test_math_demonstrations_have_no_tools(self):
    directory = self.create_tempdir().full_path
    demonstrations.write(math_task.make_task(num_eval=1), directory, 2)
    with open(os.path.join(directory, "train.jsonl"), encoding="utf-8") as f:
      line = json.loads(f.readline())
    self.assertEqual(set(line), {"messages"})
    roles = [m["role"] for m in line["messages"]]
    self.assertEqual(roles, ["user", "assistant"])

  def test_a_demonstration_that_does_not_solve_its_record_is_refused(self):
    class Wrong(repair_task.RepairTask):

      def demonstration(self, record):
        messages = super().demonstration(record)
        # Views, runs the tests and submits, but never fixes the bug.
        return [m for m in messages if "edit_file" not in m["content"]]

    with self.assertRaisesRegex(
        ValueError,
        r"^task 'repair': the demonstration of record repair-\d+ earns 0, "
        "not 1, when played$",
    ):
      demonstrations.write(Wrong(1), self.create_tempdir().full_path, 1)

  def test_bad_count(self):
    with self.assertRaisesRegex(ValueError, "num_train=0"):
      demonstrations.write(
          math_task.make_task(num_eval=1), self.create_tempdir().full_path, 0
      )

  def test_a_task_without_demonstrations_is_refused_before_writing(self):
    class Plain(tasks.Task):
      kind = "plain"

      def train_records(self, step, count):
        return [{"prompt": "1 + 1?"}] * count

      def eval_records(self):
        return [{"prompt": "2 + 2?"}]

    directory = os.path.join(self.create_tempdir().full_path, "demos")
    with self.assertRaisesRegex(
        ValueError, "^task 'plain' writes no demonstrations$"
    ):
      demonstrations.write(Plain(), directory, 4)
    self.assertFalse(os.path.exists(directory))

  def test_a_sandboxed_task_without_bubblewrap_is_refused_before_writing(self):
    directory = os.path.join(self.create_tempdir().full_path, "demos")
    # A machine without bubblewrap: its program is not on the PATH.
    with mock.patch.dict(os.environ, {"PATH": self.create_tempdir().full_path}):
      with self.assertRaisesRegex(
          ValueError,
          r"^task 'repair': bwrap .* is not installed: tools cannot run "
          r"isolated \(apt-get install bubblewrap\)$",
      ):
        demonstrations.write(repair_task.make_task(num_eval=1), directory, 4)
    self.assertFalse(os.path.exists(directory))


if __name__ == "__main__":
  absltest.main()
