"""A task's demonstrations as an SFT data directory.

`write(task, directory, num_train)` writes what `dataset_type="chat"` reads
(`maxtext/data/chat_dataset.py`), so a model can be fine-tuned on worked
solutions before GRPO:

  train.jsonl   `num_train` demonstrations of training records (steps 0, 1,
                ... of `task.train_records`, 16 per step), one
                {"messages": [...]} per line: the demonstration played in
                the record's environment (its first messages, the
                assistant's turns, the tools' real answers), with "tools":
                the environment's tools (their JSON schemas) when it has
                any, so a fine-tuned model sees what an episode shows it
  eval.jsonl    the demonstrations of the held-out records
  tokenizer.json, tokenizer_config.json
                the byte-level ChatML tokenizer (`maxtext/text/byte_chat.py`)
                the GRPO configs of the built-in tasks use

Playing a repair task's demonstrations runs their tools in the sandbox (about
5 minutes for 2,056 records): `write` reports the records played of all
and the tool runs to a `progress.Reporter`.
"""

import json
import os
from typing import Any

from maxtext.core import progress as progress_lib
from maxtext.env import sandbox
from maxtext.env import tasks
from maxtext.text import byte_chat

_PER_STEP = 16
# The tools run as in a run's episodes: in the sandbox, under its limits.
_SETTINGS = tasks.ToolSettings(sandbox.Limits(wall_seconds=60), True, 60.0)


def _write_jsonl(path: str, examples) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for example in examples:
      f.write(json.dumps(example) + "\n")


def _example(
    task: tasks.Task, record: dict[str, Any]
) -> tuple[dict[str, Any], int]:
  """The record's demonstration played in its environment, and the number
  of tool runs it took (the environment's "tool" messages).

  The demonstration's assistant turns go to the environment one by one and
  the environment's answers (the tools' real output) take the place of the
  demonstration's own, so a fine-tuned model sees what an episode shows it;
  the environment's tools go with the messages.

  Raises:
    ValueError: the played demonstration does not earn the verifier's full
      mark (one line naming the record).
  """
  env = task.make_environment(record, _SETTINGS)
  tool_runs = 0
  try:
    messages = env.start()
    for message in task.demonstration(record):
      if message["role"] != "assistant":
        continue
      messages.append(message)
      reply = env.step(message["content"])
      tool_runs += sum(m.get("role") == "tool" for m in reply.messages)
      if reply.done:
        break
      messages += reply.messages
    reward = env.reward()
    tools = list(env.tools or [])
  finally:
    env.close()
  if reward is not None and reward < 1.0:
    name = record.get("instance_id", record.get("id", "?"))
    raise ValueError(
        f"task {task.kind!r}: the demonstration of record {name} earns "
        f"{reward:g}, not 1, when played"
    )
  example = {"messages": messages}
  if tools:
    example["tools"] = tools
  return example, tool_runs


class _Playing:
  """Plays demonstrations, reporting the records played and tool runs."""

  def __init__(self, task: tasks.Task, job: progress_lib.Progress):
    self._task = task
    self._job = job
    self._tool_runs = 0

  def play(self, record: dict[str, Any]) -> dict[str, Any]:
    example, tool_runs = _example(self._task, record)
    self._tool_runs += tool_runs
    self._job.advance(1, f"tool runs {self._tool_runs:,}")
    return example


def write(
    task: tasks.Task,
    directory: str,
    num_train: int,
    progress: progress_lib.Reporter = progress_lib.SILENT,
) -> dict[str, int]:
  """Writes the data directory (module docstring); `progress` hears of the
  records played (of `num_train` and the held-out ones) and the tool runs.

  Returns:
    {"train": examples, "eval": examples}.

  Raises:
    ValueError: num_train < 1, a task that writes no demonstrations, or a
      task whose tools need the sandbox where bubblewrap cannot run (before
      any demonstration is played).
  """
  if num_train < 1:
    raise ValueError(f"num_train={num_train}: must be >= 1")
  if task.demonstration(task.train_records(0, 1)[0]) is None:
    raise ValueError(f"task {task.kind!r} writes no demonstrations")
  if getattr(task, "uses_sandbox", False):
    try:
      sandbox.check_available()
    except sandbox.SandboxUnavailable as e:
      raise ValueError(f"task {task.kind!r}: {e}") from None
  os.makedirs(directory, exist_ok=True)
  byte_chat.write(directory)
  eval_records = task.eval_records()
  train = []
  step = 0
  with progress.start(
      "write_demonstrations", num_train + len(eval_records), "records"
  ) as job:
    playing = _Playing(task, job)
    while len(train) < num_train:
      for record in task.train_records(step, _PER_STEP)[
          : num_train - len(train)
      ]:
        train.append(playing.play(record))
      step += 1
    held_out = [playing.play(r) for r in eval_records]
  _write_jsonl(os.path.join(directory, "train.jsonl"), train)
  _write_jsonl(os.path.join(directory, "eval.jsonl"), held_out)
  return {"train": len(train), "eval": len(held_out)}
