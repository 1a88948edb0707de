"""Compiles and warms up a run's step before its timed region starts.

MLPerf times a run from `run_start`; compilation belongs to the untimed
initialisation before it. `warm_up` runs whole training steps (K micro-
batches, the update with its metrics flush) and one eval batch on
placeholder batches of the real shapes, through the engine's own calls, so
every program the timed steps run is compiled and its dispatch path warm (an
ahead-of-time `.lower().compile()` alone leaves the dispatch caches cold).
Each step's last micro-batch runs with `discard=True`: the program computes
the update and keeps the state, so a donating engine needs no second copy.
Its results are thrown away: afterwards parameters, optimizer state, step
counter and recorder are exactly those of a run without warm-up, and the
data set was never read (batches are a function of the step, so the data
position is untouched too).
"""

import time

import jax

from maxtext.data import builtin_datasets
from maxtext.runtime import mesh as mesh_lib


def warm_up(state, steps: int) -> float:
  """Runs `steps` throw-away training steps and one eval batch.

  Args:
    state: the run's `RunState` (engine between steps).
    steps: how many training steps (>= 1; 0 does nothing).

  Returns:
    The seconds it took, device work included.
  """
  if steps <= 0:
    return 0.0
  start = time.monotonic()
  settings = state.settings
  train, evaluation = builtin_datasets.placeholder_batches(
      settings.data, jax.process_index(), jax.process_count()
  )
  micro_batches = [
      mesh_lib.global_batch(micro, state.setup.batch_sharding)
      for micro in builtin_datasets.split_micro_batches(
          train, settings.gradient_accumulation_steps
      )
  ]
  discarded_steps(state.engine, micro_batches, steps)
  metrics = state.engine.eval_step(
      mesh_lib.global_batch(evaluation, state.setup.batch_sharding)
  )
  jax.block_until_ready(metrics)
  return time.monotonic() - start


def discarded_steps(engine, micro_batches, steps: int) -> None:
  """Runs `steps` training steps on `micro_batches` whose updates are
  discarded, and waits for them.

  Every program of a real step runs, but parameters and optimizer state
  keep their values (each micro-step runs with `discard=True`: the last one
  computes the update and keeps the state, in place when it is donated);
  the step counter, which the updates advance, is set back at the end. The
  recorder's step buffers are released by each update.
  """
  step = engine.step
  for _ in range(steps):
    for micro in micro_batches:
      engine.fwd_bwd(micro, discard=True)
    engine.update(release=True)
  jax.block_until_ready((engine.params, engine.opt_state))
  engine.set_state(
      {"params": engine.params, "opt_state": engine.opt_state, "step": step}
  )
