"""One process of a two-process job that plays episodes (share_test).

Run by `//maxtext/env:share_test` as every process of a job
(`multiprocess.run_children`, `job_child`): it plays two episodes whose
environment answers and scores with this process's own index and pid, and
shares a value of its own through `share.from_lead`, and hands what it
holds afterwards to the test. Process 0's results on every process is what
the test checks.
"""

import dataclasses
import os
import sys
import tempfile

import jax

from maxtext.env import environment
from maxtext.env import episodes
from maxtext.env import share
from maxtext.generation import sampling
from maxtext.text import byte_chat
from maxtext.text import chat
from testing import job_child

_CALL = "<tool_call>\n<function=where>\n</function>\n</tool_call>"


class Local(environment.ToolEnvironment):
  """Answers `where` with the process that runs it; rewards its index."""

  def __init__(self, task):
    super().__init__("local")
    self._prompt = task["prompt"]
    self.add_tool("where", self.where, "Names the process.")

  def where(self) -> str:
    return f"process {jax.process_index()} pid {os.getpid()}"

  def start(self):
    return [{"role": "user", "content": self._prompt}]

  def reward(self) -> float:
    return 0.25 + jax.process_index()


def main(argv: list[str]) -> None:
  flags = job_child.join(argv)
  with tempfile.TemporaryDirectory() as directory:
    tokenizer = chat.ChatTokenizer.load(byte_chat.write(directory))
  made = []

  def make(task):
    made.append(Local(task))
    return made[-1]

  def generate(contexts, options, budgets):
    del options  # The turns are fixed; each is cut at its budget.
    # The same turns on every process: a call, then an answer.
    out = []
    for context, budget in zip(contexts, budgets):
      text = tokenizer.tokenizer.decode(context, skip_special_tokens=False)
      turn = text.count("<|im_start|>assistant") - 1
      text = _CALL if turn == 0 else "done"
      ids = tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
      ids = (ids + [tokenizer.end_of_turn_id])[:budget]
      out.append(episodes.Completion(ids, [-0.5] * len(ids)))
    return out

  played = episodes.run(
      [{"prompt": "Where do you run?"}, {"prompt": "And this one?"}],
      make,
      tokenizer,
      generate,
      sampling.SamplingOptions(
          max_new_tokens=64,
          temperature=1.0,
          seed=0,
          stop_ids=tokenizer.stop_ids,
      ),
      episodes.Limits(max_turns=3, max_tokens=400, max_turn_tokens=64),
  )
  # A value of this process's own, large and not ASCII; the others pass
  # None, as the episode runner does.
  own = {
      "process": jax.process_index(),
      "pid": os.getpid(),
      "text": "é" * 70000,
  }
  shared = share.from_lead(own if share.is_lead() else None)
  result = {
      "process": jax.process_index(),
      "pid": os.getpid(),
      "environments_made": len(made),
      "episodes": [dataclasses.asdict(e) for e in played],
      "texts": [tokenizer.decode(e.ids) for e in played],
      "shared": shared,
  }
  job_child.finish(flags, result)


if __name__ == "__main__":
  main(sys.argv)
