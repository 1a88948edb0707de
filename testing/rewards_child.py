"""One process of a two-process job that scores completions.

Run by `//maxtext/grpo/rewards:rewards_multiprocess_test` as every process
of a job (`multiprocess.run_children`, `job_child`): it scores the same
completions with a reward whose value depends on the process that calls it,
then with one that fails on process 0 only, and hands what it got to the
test.
"""

import sys

import jax

from maxtext.grpo.rewards import rewards
from testing import hostile_rewards
from testing import job_child


def main(argv: list[str]) -> None:
  flags = job_child.join(argv)
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
  job_child.finish(flags, result)


if __name__ == "__main__":
  main(sys.argv)
