"""One process of a two-process job that scores completions.

Run by `//maxtext/grpo:rewards_multiprocess_test` as `python -m
testing.rewards_child --output=DIR` with `--config.num_processes`,
`--config.process_id` and `--config.coordinator_address` (as
`testing.multiprocess.launch` gives them): it joins the jax.distributed
job, scores the same completions with a reward whose value depends on the
process that calls it, then with one that fails on process 0 only, and
writes what it got to DIR/process_<index>.json.
"""

import json
import os
import sys

import jax

from maxtext.grpo import rewards
from testing import hostile_rewards


def _flags(argv: list[str]) -> dict[str, str]:
  out = {}
  for arg in argv[1:]:
    name, _, value = arg.lstrip("-").partition("=")
    out[name] = value
  return out


def main(argv: list[str]) -> None:
  flags = _flags(argv)
  jax.distributed.initialize(
      coordinator_address=flags["config.coordinator_address"],
      num_processes=int(flags["config.num_processes"]),
      process_id=int(flags["config.process_id"]),
      initialization_timeout=120,
  )
  prompts = [(1, 2), (3,)]
  completions = [(4,), (5, 6), (7, 8, 9), ()]
  scored = rewards.score(
      rewards.load("testing.hostile_rewards:where_called=2"),
      prompts,
      completions,
      2,
  )
  try:
    rewards.score(
        rewards.load("testing.hostile_rewards:fails_on_process_0"),
        prompts,
        completions,
        2,
    )
    failure = None
  except rewards.RewardError as e:
    failure = str(e)
  result = {
      "process": jax.process_index(),
      "total": scored.total.tolist(),
      "per_function": {k: v.tolist() for k, v in scored.per_function.items()},
      "calls": hostile_rewards.calls("where_called"),
      "failure": failure,
  }
  path = os.path.join(flags["output"], f"process_{jax.process_index()}.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(result, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv)
