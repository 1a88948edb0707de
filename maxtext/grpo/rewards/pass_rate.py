"""pass@k: the chance that at least one of k samples is right.

With n samples of a prompt of which c are right, the unbiased estimate of
pass@k (Chen et al., 2021) is 1 - C(n - c, k) / C(n, k); pass@1 is c / n.
The eval's number is its mean over the prompts.
"""

import math
from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased pass@k of one prompt with c right out of n samples.

  Raises:
    ValueError: unless 0 <= c <= n and 1 <= k <= n.
  """
  if not 0 <= c <= n or not 1 <= k <= n:
    raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): need 0<=c<=n, 1<=k<=n")
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
  """The mean over prompts of pass@k; `correct[p]` holds prompt p's samples."""
  if not correct:
    raise ValueError("mean_pass_at_k: no prompts")
  return sum(pass_at_k(len(c), sum(map(bool, c)), k) for c in correct) / len(
      correct
  )
