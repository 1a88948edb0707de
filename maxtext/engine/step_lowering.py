"""The engine's programs lowered ahead of time, run nowhere.

`Engine.lower` and `Engine.lower_programs` come here: they lower the step's
jitted programs (`maxtext/engine/step_programs.py`) on the shapes, dtypes and
shardings of the engine's state and of a given micro-batch, reading no
value. `tools/benchmarks/memory_bench` and `train_compile` compile what they
return for their memory and cost figures (an engine built on abstract
parameters allocates nothing); compiled, `lower_programs`' result is what
`maxtext/engine/saved_step.py` saves and what the engine's `executables`
argument takes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from maxtext.engine import step_programs


def abstract(tree, sharded: bool = True):
  """`tree`'s shapes and dtypes (and shardings, if `sharded`)."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(
          x.shape,
          x.dtype,
          sharding=getattr(x, "sharding", None) if sharded else None,
      ),
      tree,
  )


def lower_step(
    programs: step_programs.StepPrograms, params, opt_state, micro_batch
) -> dict[str, jax.stages.Lowered]:
  """Lowers the programs one training step runs (see `Engine.lower`).

  Args:
    programs: the engine's programs.
    params: the parameters (arrays or `ShapeDtypeStruct`s).
    opt_state: the optimizer state, likewise.
    micro_batch: a micro-batch pytree of arrays or `ShapeDtypeStruct`s.

  Returns:
    {"micro_step": `jax.stages.Lowered`}, and with K = 1 "update" too
    (`step_programs.program_names`): forward and backward of one
    micro-batch, run K times, adding into the donated accumulator (K > 1)
    and taking the step's update on the last (the gradient norm, the skip
    decision, the clipping and the optimizer step), parameters and
    optimizer state donated when `donate_state`; with K = 1 the update is
    the second program. `.compile()` gives their `memory_analysis()` and
    `cost_analysis()`. The step's one other program is the recorder's
    concatenation of the packed metrics.
  """
  params, opt_state = abstract(params), abstract(opt_state)
  flag = jax.ShapeDtypeStruct((), jnp.bool_)
  step = jax.ShapeDtypeStruct((), jnp.int32)
  batch = abstract(micro_batch, sharded=False)
  jitted, acc = programs.jitted, programs.acc_shapes
  if programs.k > 1:
    args = (params, opt_state, acc, step, flag, flag, flag, batch)
    return {"micro_step": jitted["micro_step"].lower(*args)}
  micro_step = jitted["micro_step"].lower(params, batch)
  # The update takes the micro-step's gradients (in the dtypes it returns
  # them in, sharded as the accumulator would be) and packed metrics.
  grads = jax.tree.map(
      lambda out, a: jax.ShapeDtypeStruct(
          a.shape, out.dtype, sharding=a.sharding
      ),
      micro_step.out_info[0],
      acc,
  )
  packed = micro_step.out_info[1].values
  packed = jax.ShapeDtypeStruct(packed.shape, packed.dtype)
  return {
      "micro_step": micro_step,
      "update": jitted["update"].lower(
          params, opt_state, grads, step, flag, packed
      ),
  }


def lower_programs(
    programs: step_programs.StepPrograms,
    params,
    opt_state,
    micro_batch,
    eval_batch,
) -> dict[str, jax.stages.Lowered]:
  """Lowers every program of `step_programs.program_names(programs.k)`.

  `lower_step`'s programs, the accumulator's allocation (with K > 1) and the
  eval of `eval_batch` (shapes as for `micro_batch`), in that order.
  """
  lowered = lower_step(programs, params, opt_state, micro_batch)
  if programs.k > 1:
    lowered["allocate"] = programs.jitted["allocate"].lower()
  lowered["eval"] = programs.jitted["eval"].lower(
      abstract(params), abstract(eval_batch, sharded=False)
  )
  names = step_programs.program_names(programs.k)
  return {name: lowered[name] for name in names}
