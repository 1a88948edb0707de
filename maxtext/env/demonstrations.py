"""A task's demonstrations as an SFT data directory.

`write(task, directory, num_train)` writes what `dataset_type="chat"` reads
(`maxtext/data/chat_dataset.py`), so a model can be fine-tuned on worked
solutions before GRPO:

  train.jsonl   `num_train` demonstrations of training records (steps 0, 1,
                ... of `task.train_records`, 16 per step), one
                {"messages": [...]} per line
  eval.jsonl    the demonstrations of the held-out records
  tokenizer.json, tokenizer_config.json
                the byte-level ChatML tokenizer (`maxtext/text/byte_chat.py`)
                the GRPO configs of the built-in tasks use
"""

import json
import os

from maxtext.env import tasks
from maxtext.text import byte_chat

_PER_STEP = 16


def _write_jsonl(path: str, examples) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for messages in examples:
      f.write(json.dumps({"messages": messages}) + "\n")


def write(task: tasks.Task, directory: str, num_train: int) -> dict[str, int]:
  """Writes the data directory (module docstring).

  Returns:
    {"train": examples, "eval": examples}.

  Raises:
    ValueError: num_train < 1, or a task that writes no demonstrations.
  """
  if num_train < 1:
    raise ValueError(f"num_train={num_train}: must be >= 1")
  if task.demonstration(task.train_records(0, 1)[0]) is None:
    raise ValueError(f"task {task.kind!r} writes no demonstrations")
  os.makedirs(directory, exist_ok=True)
  byte_chat.write(directory)
  train = []
  step = 0
  while len(train) < num_train:
    for record in task.train_records(step, _PER_STEP):
      train.append(task.demonstration(record))
    step += 1
  train = train[:num_train]
  held_out = [task.demonstration(r) for r in task.eval_records()]
  _write_jsonl(os.path.join(directory, "train.jsonl"), train)
  _write_jsonl(os.path.join(directory, "eval.jsonl"), held_out)
  return {"train": len(train), "eval": len(held_out)}
