"""Random draws for layer tests: the `normal(shape, fan_in)` layers init with.

`mla.init_params` and `moe.init_params` take a `normal(shape, fan_in)` that the
model builds from its seed (a truncated normal in the weight dtype). Layer
tests compare a layer with a reference written out by hand, so they want
plain float32 normal draws that any seed reproduces:

  normal = random_init.scaled_normal(seed=0, count=8)
  params = moe.init_params(config, 1, normal)
"""

import math
from typing import Callable, Sequence

import jax


def scaled_normal(
    seed: int, count: int
) -> Callable[[Sequence[int], int], jax.Array]:
  """`normal(shape, fan_in)`: standard normal draws over sqrt(fan_in).

  Args:
    seed: the seed of the PRNG key that the draws' keys are split from.
    count: how many draws `normal` may make (the keys split up front).

  Returns:
    `normal(shape, fan_in)`, each call drawing a float32 array of `shape`
    with the next of the `count` keys; it raises StopIteration once they
    are spent.
  """
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), count))

  def normal(shape, fan_in):
    return jax.random.normal(next(keys), shape) / math.sqrt(fan_in)

  return normal
