"""A frozen reference policy: the starting parameters, never trained.

A workload whose loss keeps the policy near where it started (GRPO's KL
term; DPO's reference log-probabilities) needs those starting parameters
beside the trained ones: `load` reads them again as the run's engine first
did (`load_parameters_path`, or the seed), on the run's mesh, and never
saves them. Since the path is read again at every start, the first attempt
pins what it read (`reference_pin`) and every later attempt of the run
must read the same reference, or be allowed to read another.
"""

from typing import Any, Callable

from absl import logging
import jax

from maxtext.run import reference_pin
from maxtext.run import workload


def load(
    state,
    init_params: Callable[[Any], Any],
    *,
    source: str,
    allow_change: bool,
) -> Any:
  """The run's frozen reference parameters, pinned in its run directory.

  Args:
    state: the run state (its model setup and run directory).
    init_params: `setup -> parameters`: the starting parameters as the
      run's engine first read them, on the setup's mesh (the workload's
      `model_setup.init_params` of the attempt's config).
    source: where they come from (`load_parameters_path`; "" = the seed).
    allow_change: a resume may read another reference than the one the
      run pinned (logged, and recorded as the new pin).

  Returns:
    The reference's parameters, sharded as the engine's.

  Raises:
    workload.RefusedStart: the reference is not the one the run pinned
      (one line).
  """
  params = init_params(state.setup)
  try:
    allowed = reference_pin.check_and_record(
        state.paths.run_dir,
        reference_pin.pin_of(source, params),
        allow_change=allow_change,
        write=jax.process_index() == 0,
    )
  except ValueError as e:
    raise workload.RefusedStart(str(e)) from e
  if allowed:
    logging.warning("%s", allowed)
  return params
