"""The compiled programs of a training step, their shardings and donation.

`StepPrograms` jits (lazily: JAX compiles on first call or on `.lower`) the
programs the engine (`maxtext/engine/engine.py`) runs, and runs them for it:

* "allocate" (K > 1 only): the gradient accumulator (float32 or wider copies
  of the parameters' shapes, sharded like them) and the two values of the
  micro-step's `first` flag, made once on the devices.
* "micro_step": `jax.value_and_grad(loss_fn)` of one micro-batch, the
  gradients added into the accumulator, which is donated so XLA adds in
  place; `first`, a traced flag, makes a step's first gradients replace the
  accumulator's contents (a select, so a skipped step's NaN does not
  survive). With K = 1 the micro-step takes no accumulator: its gradients
  become it, as XLA computes them (adding into a donated buffer costs a
  gradient-sized temporary). Both return the step's metrics packed
  (`maxtext/engine/metric_packing.py`).
* "measure": reads the accumulator: the mean gradient's global norm, whether
  it is finite, and the learning rate, packed as `metric_packing.UPDATE_NAMES`.
* "apply": the optimizer update of the mean gradient, clipped to
  `grad_clip_norm` with the norm `measure` took; it donates parameters and
  optimizer state when `donate_state` (see the engine's docstring for when
  it runs).
* "eval": the eval function's metrics of one batch, checked against their
  declared names.

With `param_shardings` every program has explicit shardings: parameters,
accumulator and optimizer state as given (the optimizer state's copies of
the parameter tree take the parameters' shardings, its other leaves are
replicated), the batch as `batch_sharding`, and scalars and packed metrics
replicated over the parameters' mesh.

What the programs compute comes from a `step_spec.StepSpec`. Parameters that
statistics of the forward pass move (`step_spec.StatisticSlots`,
`maxtext/model/param_statistics.py`) ride these programs: their accumulator
slots sum the loss's statistics, `measure` leaves them out of the norm and
`apply` replaces them by their rules.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.core import eval_metrics
from maxtext.engine import metric_packing
from maxtext.engine import step_spec


def program_names(k: int) -> tuple[str, ...]:
  """The programs an engine with K = `k` runs, in the order a run needs them."""
  first = () if k == 1 else ("allocate",)
  return first + ("micro_step", "measure", "apply", "eval")


def _checked_eval_metrics(
    values, directions: Mapping[str, eval_metrics.Direction]
) -> dict[str, jax.Array]:
  """The eval function's output, checked against its declared names."""
  if not isinstance(values, Mapping) or set(values) != set(directions):
    got = sorted(values) if isinstance(values, Mapping) else values
    raise ValueError(
        f"the eval function returned {got!r}; it declares the metrics "
        f"{sorted(directions)}"
    )
  for name, value in values.items():
    if jnp.shape(value) != ():
      raise TypeError(
          f"eval metric {name!r}: must be a scalar; got shape "
          f"{jnp.shape(value)}"
      )
  return {name: values[name] for name in directions}


def is_abstract(params) -> bool:
  """Whether `params` are `ShapeDtypeStruct`s (shapes only, no values)."""
  return all(
      isinstance(x, jax.ShapeDtypeStruct)
      for x in jax.tree_util.tree_leaves(params)
  )


def place_state(
    params, optimizer: optax.GradientTransformation, param_shardings
):
  """The parameters on their devices and the optimizer state made for them.

  Args:
    params: the parameter pytree: arrays, or `ShapeDtypeStruct`s (then
      nothing is allocated, and the results are `ShapeDtypeStruct`s with the
      shardings they would have).
    optimizer: the optax transformation.
    param_shardings: None, or a pytree of `NamedSharding` like `params`.

  Returns:
    (params, opt_state).
  """
  abstract = is_abstract(params)

  def init(fn, *args):
    return jax.eval_shape(fn, *args) if abstract else fn(*args)

  if param_shardings is None:
    return params, init(jax.jit(optimizer.init), params)
  if abstract:
    params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        params,
        param_shardings,
    )
  else:
    params = jax.device_put(params, param_shardings)
  # The optimizer state's copies of the parameter tree (e.g. Adam's moments)
  # take the parameters' shardings; its other leaves (step counts) are
  # replicated over the same mesh.
  opt_shardings = optax.tree_map_params(
      optimizer,
      lambda _, sharding: sharding,
      jax.eval_shape(optimizer.init, params),
      param_shardings,
      transform_non_params=lambda _: _replicated(param_shardings),
  )
  opt_state = init(jax.jit(optimizer.init, out_shardings=opt_shardings), params)
  return params, opt_state


def _replicated(param_shardings) -> jax.sharding.NamedSharding:
  """Replicated over the parameters' mesh."""
  mesh = jax.tree_util.tree_leaves(param_shardings)[0].mesh
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def _jit(
    spec: step_spec.StepSpec, params, opt_state, param_shardings, batch_sharding
) -> tuple[dict[str, Any], Any, Any]:
  """Jits the step's programs for `params`' and `opt_state`'s shapes.

  Returns:
    (name -> jitted function, the accumulator's `ShapeDtypeStruct`s, the
    optimizer state's shardings or None).
  """
  ps, bs = param_shardings, batch_sharding
  explicit = ps is not None
  k, slots = spec.k, spec.statistics
  opt_shardings = rep = None
  if explicit:
    # Scalars and packed metrics are replicated over the params' mesh.
    rep = _replicated(ps)
    opt_shardings = jax.tree.map(lambda x: x.sharding, opt_state)
  # The accumulator: float32 (or wider) copies of the parameters' shapes,
  # sharded like them.
  acc_shapes = jax.tree.map(
      lambda p, s: jax.ShapeDtypeStruct(
          p.shape, jnp.promote_types(p.dtype, jnp.float32), sharding=s
      ),
      params,
      ps if explicit else jax.tree.map(lambda _: None, params),
  )

  def allocate():
    # The accumulator (its zeros are never read: a step's first
    # micro-batch replaces them) and the two values of micro_step's
    # `first` flag, made once on the devices so that no call transfers
    # them.
    grad_acc = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), acc_shapes)
    return grad_acc, jnp.asarray(True), jnp.asarray(False)

  def micro_step(params, grad_acc, first, micro_batch):
    (loss, aux), grads = jax.value_and_grad(spec.loss_fn, has_aux=True)(
        params, micro_batch
    )
    grads = slots.with_statistics(grads, aux)
    # A select, not a product with 0: a step's first sum is exactly its
    # first gradients, whatever the accumulator held (a skipped step's
    # NaN included).
    grad_acc = jax.tree.map(
        lambda a, g: jnp.where(first, g.astype(a.dtype), a + g.astype(a.dtype)),
        grad_acc,
        grads,
    )
    packed, weighted = metric_packing.pack(loss, aux)
    return grad_acc, packed, weighted

  def single_micro_step(params, micro_batch):
    # K = 1: the micro-batch's gradients are the step's sum. Taking no
    # accumulator lets them be the output as XLA computes them; adding
    # into a donated one would cost a gradient-sized temporary.
    (loss, aux), grads = jax.value_and_grad(spec.loss_fn, has_aux=True)(
        params, micro_batch
    )
    grad_acc = jax.tree.map(
        lambda g, s: g.astype(s.dtype),
        slots.with_statistics(grads, aux),
        acc_shapes,
    )
    packed, weighted = metric_packing.pack(loss, aux)
    return grad_acc, packed, weighted

  def measure(grad_acc, step):
    # The update's metrics, known (and flushed) before the optimizer's
    # result is kept or its state donated: the mean gradient's global norm
    # (which the apply's clipping uses too), whether it is finite, and the
    # learning rate. The statistics' slots are not gradients.
    grad_norm = optax.tree.norm(
        slots.gradients_only(jax.tree.map(lambda a: a / k, grad_acc))
    )
    finite = jnp.isfinite(grad_norm)
    lr = jnp.asarray(spec.lr_fn(step), jnp.float32)
    return jnp.stack(
        [
            lr,
            grad_norm.astype(jnp.float32),
            jnp.where(finite, 0.0, 1.0).astype(jnp.float32),
        ]
    )

  def apply(params, opt_state, grad_acc, update_packed):
    grads = jax.tree.map(lambda a, p: (a / k).astype(p.dtype), grad_acc, params)
    # The step's mean statistics; the optimizer sees zeros in their slots.
    statistics = slots.only(grads)
    grads = slots.map(grads, lambda _, g: jnp.zeros_like(g))
    if spec.clip > 0:
      # Global-norm clipping as optax.clip_by_global_norm does it, with the
      # norm of the mean gradient that `measure` took
      # (update_packed[1]) instead of a second pass over the gradients.
      norm = update_packed[1]
      keep = norm < spec.clip
      grads = jax.tree.map(
          lambda g: jnp.where(keep, g, (g / norm.astype(g.dtype)) * spec.clip),
          grads,
      )
    updates, new_opt = spec.optimizer.update(grads, opt_state, params)
    # A statistic-moved parameter takes its rule's value; the optimizer's
    # update of it is discarded.
    old = slots.only(params)
    new_params = slots.map(
        optax.apply_updates(params, updates),
        lambda path, _: slots.rules[path](old[path], statistics[path]),
    )
    return new_params, new_opt

  def eval_metrics_of(params, batch):
    return _checked_eval_metrics(
        spec.eval_fn(params, batch), spec.eval_directions
    )

  # Without donation, parameters and optimizer state stay valid until the
  # flush that follows the apply's dispatch has succeeded.
  donate = (0, 1) if spec.donate else ()
  # The accumulator is donated to each micro-step, which adds into it in
  # place; the measure and the apply only read it.
  if k == 1:
    micro = (single_micro_step, {}, (ps, bs))
  else:
    micro = (micro_step, {"donate_argnums": (1,)}, (ps, ps, rep, bs))
  jits = {
      # name: (function, jit's keyword arguments, in_shardings, out_shardings)
      "allocate": (allocate, {}, None, (ps, rep, rep)),
      "micro_step": micro + ((ps, rep, rep),),
      "measure": (measure, {}, (ps, rep), rep),
      "apply": (
          apply,
          {"donate_argnums": donate},
          (ps, opt_shardings, ps, rep),
          (ps, opt_shardings),
      ),
      "eval": (eval_metrics_of, {}, (ps, bs), rep),
  }
  jitted = {}
  for name, (fn, kwargs, in_shardings, out_shardings) in jits.items():
    if explicit:
      if in_shardings is not None:
        kwargs = {**kwargs, "in_shardings": in_shardings}
      kwargs = {**kwargs, "out_shardings": out_shardings}
    jitted[name] = jax.jit(fn, **kwargs)
  return jitted, acc_shapes, opt_shardings


class StepPrograms:
  """A step's programs and the gradient accumulator they share.

  The accumulator is the gradient sum of the running step (between steps,
  the last step's): allocated by the first micro-step, then donated to every
  micro-step. With K > 1 it stays allocated between steps, as the next
  step's first micro-batch replaces its contents (allocating it anew would
  cost a device op per step); with K = 1 `end_step` frees it.

  Attributes:
    k: the micro-batches per step.
    jitted: name -> the jitted function (what `maxtext/engine/step_lowering.py`
      lowers), for every name of `program_names(k)` and "allocate".
    compiled: every program was given compiled (`executables`) and runs in
      place of its jitted function.
    acc_shapes: the accumulator's `ShapeDtypeStruct`s (with shardings).
    opt_shardings: the optimizer state's shardings (None without
      `param_shardings`).
    grad_acc: the accumulator (None until the first micro-step).
  """

  def __init__(
      self,
      spec: step_spec.StepSpec,
      params,
      opt_state,
      param_shardings,
      batch_sharding,
      executables: Optional[Mapping[str, Any]] = None,
  ):
    """Jits the programs for `params`' and `opt_state`'s shapes.

    Args:
      spec: what the programs compute.
      params: the parameters (arrays or `ShapeDtypeStruct`s), placed as
        `place_state` places them.
      opt_state: the optimizer state, likewise.
      param_shardings: None, or the parameters' shardings.
      batch_sharding: None (when `param_shardings` is), or the micro-batch's
        sharding (a sharding or a pytree prefix of the micro-batch).
      executables: None, or every program of `program_names(spec.k)`
        compiled, to run in place of the jitted ones.

    Raises:
      TypeError/ValueError: `executables` names other programs, or one that
        is not callable.
    """
    self.k = spec.k
    self._abstract = is_abstract(params)
    self.jitted, self.acc_shapes, self.opt_shardings = _jit(
        spec, params, opt_state, param_shardings, batch_sharding
    )
    run = dict(self.jitted)
    self.compiled = executables is not None
    if self.compiled:
      run.update(check_executables(executables, spec.k))
    self._allocate, self._micro_step = run["allocate"], run["micro_step"]
    self._measure, self._apply = run["measure"], run["apply"]
    self.eval = run["eval"]
    self.grad_acc = None
    self._first_flags = None  # micro_step's `first` values, on the devices.

  def check_concrete(self, what: str) -> None:
    """Raises RuntimeError naming `what` if the programs were made for
    abstract parameters: they can then only be lowered."""
    if self._abstract:
      raise RuntimeError(
          f"{what}() on an engine built on abstract parameters "
          "(ShapeDtypeStructs); such an engine can only lower its programs"
      )

  def micro_step(self, params, micro_batch, first: bool):
    """Runs one micro-batch into the accumulator (one dispatch; with K > 1
    the step's first also allocates the accumulator, once per engine).

    Args:
      params: the parameters.
      micro_batch: the loss_fn's batch pytree.
      first: the step's first micro-batch: its gradients replace the
        accumulator's contents.

    Returns:
      (packed, weighted): the micro-batch's metrics, on the devices.
    """
    if self.k == 1:
      # end_step() freed the last step's sum.
      self.grad_acc, packed, weighted = self._micro_step(params, micro_batch)
      return packed, weighted
    if self.grad_acc is None:
      self.grad_acc, *flags = self._allocate()
      self._first_flags = tuple(flags)  # (True, False)
    flag = self._first_flags[0 if first else 1]
    self.grad_acc, packed, weighted = self._micro_step(
        params, self.grad_acc, flag, micro_batch
    )
    return packed, weighted

  def measure(self, step: int) -> jax.Array:
    """The step's `metric_packing.UPDATE_NAMES`, packed (one dispatch)."""
    return self._measure(self.grad_acc, np.int32(step))

  def apply(self, params, opt_state, update_packed):
    """The optimizer's new (params, opt_state), donating the old ones when
    the spec says so (one dispatch)."""
    return self._apply(params, opt_state, self.grad_acc, update_packed)

  def compile_apply(self, params, opt_state, update_packed) -> None:
    """Compiles the apply for these arguments without running it, into the
    cache its next call hits (a given executable is compiled already)."""
    if not self.compiled:
      self._apply.lower(
          params, opt_state, self.grad_acc, update_packed
      ).compile()

  def end_step(self) -> None:
    """Called once a step's apply is dispatched (or skipped)."""
    if self.k == 1:
      # Nothing reads it again: between steps (eval, checkpoints) the
      # device holds the state alone.
      self.grad_acc = None

  def release(self) -> None:
    """Drops the accumulator."""
    self.grad_acc = None


def check_executables(executables: Mapping[str, Any], k: int) -> dict[str, Any]:
  """`executables` checked to be every program of `program_names(k)`.

  Raises:
    ValueError: other names.
    TypeError: a program that is not callable.
  """
  names = program_names(k)
  if not isinstance(executables, Mapping) or set(executables) != set(names):
    got = sorted(executables) if isinstance(executables, Mapping) else None
    raise ValueError(
        f"executables must name the programs {list(names)}; got {got!r}"
    )
  for name, program in executables.items():
    if not callable(program):
      raise TypeError(f"executables[{name!r}] is not callable: {program!r}")
  return dict(executables)
