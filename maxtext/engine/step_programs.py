"""The compiled programs of a training step, their shardings and donation.

`StepPrograms` jits (lazily: JAX compiles on first call or on `.lower`) the
programs the engine (`maxtext/engine/engine.py`) runs, and runs them for it:

* "allocate" (K > 1 only): the gradient accumulator (float32 or wider copies
  of the parameters' shapes, sharded like them), made once on the devices.
* "micro_step": one program for every micro-batch of a step.
  `jax.value_and_grad(loss_fn)` of the micro-batch, the gradients added
  into the accumulator, which is donated so XLA adds in place (`first`, a
  traced flag, makes a step's first gradients replace its contents: a
  select, so a skipped step's NaN does not survive). On the step's last
  micro-batch (`last`, traced) a `cond` takes the step's update (`finish`
  below); on the others it passes parameters and optimizer state through.
  Parameters and optimizer state are donated when `donate_state`, so the
  update is in place and a passed-through state is not copied. It returns
  the micro-batch's metrics packed (`maxtext/engine/metric_packing.py`)
  and the update's, `metric_packing.UPDATE_NAMES` (zeros before the last).
* With K = 1 the micro-step ("single_micro_step") takes no accumulator,
  no flags and no optimizer state: its gradients are its output, as XLA
  computes them, and "update" (its own program, dispatched with the
  micro-step) takes the step's update from them, parameters and optimizer
  state donated when `donate_state`. It also takes the micro-step's packed
  metrics and returns them with the update's appended: the step's one
  packed array, which the recorder flushes with no device op (so a K = 1
  step is 2 device operations, as K > 1 is K + 1). One program for both
  would hold, on the TPU compiler of the lock (libtpu 0.0.42.1), about
  two gradients' size more temporaries than the two programs' larger one,
  while with K > 1 the fused last micro-step costs nothing over a plain
  one (docs/PERFORMANCE.md, "The update in the step's last micro-step").
* With a compute copy (`StepSpec.compute_copy`, e.g. the layers' matrices
  in bfloat16: `transformer.gradient_copy`) the loss is differentiated in
  the copy, so those gradients are computed in its dtype: the accumulator
  (K > 1) adds them in float32, the K = 1 micro-step returns them as they
  are (a bfloat16 gradient is half a float32 one's bytes to write, and for
  the update to read), and the update widens them.
* The step's update (`finish`, in either program): the mean gradient's
  global norm, whether it is finite, the learning rate, and, only when the
  norm is finite (and `commit`: a warm-up computes the update and keeps
  the state), the optimizer step of the mean gradient clipped to
  `grad_clip_norm` with that norm (a `cond`: a skipped step runs no
  optimizer and leaves a donated state in place).
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
slots sum the loss's statistics, the update leaves them out of the norm and
the optimizer and replaces them by their rules.
"""

from __future__ import annotations

import dataclasses
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
  if k == 1:
    return ("micro_step", "update", "eval")
  return ("allocate", "micro_step", "eval")


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


class _StepFunctions:
  """The step's functions before jit, over one `StepSpec`.

  Each method is one program's body (the module docstring says what each
  computes); `_jit` jits them with their shardings and donation.
  """

  def __init__(self, spec: step_spec.StepSpec, acc_shapes, grad_dtypes):
    """Args: the step's spec; the accumulator's `ShapeDtypeStruct`s; the
    dtypes of the K = 1 micro-step's gradients (`_gradient_dtypes`)."""
    self._spec = spec
    self._k = spec.k
    self._slots = spec.statistics
    self._acc_shapes = acc_shapes
    self._grad_dtypes = grad_dtypes

  def allocate(self):
    """The accumulator, zeros never read: a step's first micro-batch
    replaces them."""
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), self._acc_shapes)

  def gradients(self, params, micro_batch):
    """The micro-batch's gradients (statistics in their slots) and metrics."""
    copy = self._spec.compute_copy
    (loss, aux), grads = jax.value_and_grad(self._spec.loss_fn, has_aux=True)(
        params if copy is None else copy(params), micro_batch
    )
    packed, weighted = metric_packing.pack(loss, aux)
    return self._slots.with_statistics(grads, aux), packed, weighted

  def optimizer_step(self, params, opt_state, grads, grad_norm):
    """The optimizer's step of the mean gradient, clipped with `grad_norm`."""
    spec, slots = self._spec, self._slots
    # `grads`: the step's mean gradient, in the parameters' dtypes from
    # here: cast inside the update's branch, so that the compiler reads a
    # narrower gradient where the optimizer does, not from a widened copy.
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    # The step's mean statistics; the optimizer sees zeros in their slots.
    statistics = slots.only(grads)
    grads = slots.map(grads, lambda _, g: jnp.zeros_like(g))
    if spec.clip > 0:
      # Global-norm clipping as optax.clip_by_global_norm does it, with the
      # norm the step's metrics report instead of a second pass.
      keep = grad_norm < spec.clip
      grads = jax.tree.map(
          lambda g: jnp.where(
              keep, g, (g / grad_norm.astype(g.dtype)) * spec.clip
          ),
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

  def finish(self, params, opt_state, grad_sum, step, commit):
    """The step's update from the sum of its K micro-batches' gradients.

    The mean gradient's global norm (the statistics' slots are not
    gradients), whether it is finite, and the optimizer step only when it
    is (and `commit`: a warm-up step computes everything and keeps the
    state). A cond, not a select: a skipped step runs no optimizer and,
    with the state donated, leaves it in place.
    """
    mean = jax.tree.map(lambda a: a / self._k, grad_sum)
    # Summed in float32 or wider, whatever dtype a gradient came in.
    grad_norm = optax.tree.norm(
        [_widened(g) for g in self._slots.gradients_only(mean)]
    ).astype(jnp.float32)
    finite = jnp.isfinite(grad_norm)
    params, opt_state = jax.lax.cond(
        jnp.logical_and(finite, commit),
        lambda: self.optimizer_step(params, opt_state, mean, grad_norm),
        lambda: (params, opt_state),
    )
    update_packed = jnp.stack(
        [
            jnp.asarray(self._spec.lr_fn(step), jnp.float32),
            grad_norm,
            jnp.where(finite, 0.0, 1.0).astype(jnp.float32),
        ]
    )
    return params, opt_state, update_packed

  def micro_step(
      self, params, opt_state, grad_acc, step, first, last, commit, micro_batch
  ):
    """K > 1: one micro-batch into the accumulator; the update on the last."""
    grads, packed, weighted = self.gradients(params, micro_batch)
    # A select, not a product with 0: a step's first sum is exactly its
    # first gradients, whatever the accumulator held (a skipped step's
    # NaN included).
    grad_acc = jax.tree.map(
        lambda a, g: jnp.where(first, g.astype(a.dtype), a + g.astype(a.dtype)),
        grad_acc,
        grads,
    )
    # Only the step's last micro-batch updates; the others pass the state
    # through (in place when it is donated).
    params, opt_state, update_packed = jax.lax.cond(
        last,
        lambda: self.finish(params, opt_state, grad_acc, step, commit),
        lambda: (
            params,
            opt_state,
            jnp.zeros((len(metric_packing.UPDATE_NAMES),), jnp.float32),
        ),
    )
    step = step + last.astype(step.dtype)
    return params, opt_state, grad_acc, step, packed, weighted, update_packed

  def single_micro_step(self, params, micro_batch):
    """K = 1: the micro-batch's gradients are the step's sum.

    Taking no accumulator lets them be the output as XLA computes them;
    adding into a donated one would cost a gradient-sized temporary. They
    leave in `_gradient_dtypes`: a compute copy's narrower leaves as
    computed, the others in the accumulator's dtype.
    """
    grads, packed, weighted = self.gradients(params, micro_batch)
    grads = jax.tree.map(lambda g, d: g.astype(d), grads, self._grad_dtypes)
    return grads, packed, weighted

  def update(self, params, opt_state, grad_sum, step, commit, packed_values):
    """K = 1: the step's update after its one micro-step.

    The micro-step's packed metrics come back with the update's appended,
    one array for the step, which the recorder's flush takes without a
    concatenation of its own.
    """
    params, opt_state, update_packed = self.finish(
        params, opt_state, grad_sum, step, commit
    )
    values = jnp.concatenate(
        [packed_values, update_packed.astype(packed_values.dtype)]
    )
    return params, opt_state, step + 1, values

  def eval_metrics_of(self, params, batch):
    """The eval function's metrics of `batch`, checked against their names."""
    return _checked_eval_metrics(
        self._spec.eval_fn(params, batch), self._spec.eval_directions
    )


def _accumulator_shapes(params, param_shardings):
  """The accumulator's `ShapeDtypeStruct`s.

  Float32 (or wider) copies of the parameters' shapes, sharded like them
  (unsharded without `param_shardings`).
  """
  return jax.tree.map(
      lambda p, s: jax.ShapeDtypeStruct(
          p.shape, jnp.promote_types(p.dtype, jnp.float32), sharding=s
      ),
      params,
      (
          param_shardings
          if param_shardings is not None
          else jax.tree.map(lambda _: None, params)
      ),
  )


def _widened(x: jax.Array) -> jax.Array:
  """`x` in float32, or as it is where wider."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _gradient_dtypes(spec: step_spec.StepSpec, params, acc_shapes):
  """The dtypes the K = 1 micro-step returns its gradients in: the
  accumulator's, but where `spec.compute_copy` casts a parameter to
  another dtype, that dtype (the loss's gradient of the copy as computed)."""
  acc = jax.tree.map(lambda s: s.dtype, acc_shapes)
  if spec.compute_copy is None:
    return acc
  copy = jax.eval_shape(spec.compute_copy, params)
  return jax.tree.map(
      lambda c, p, a: c.dtype if c.dtype != p.dtype else a, copy, params, acc
  )


def _program_table(
    fns: _StepFunctions, k: int, donate: bool, ps, bs, rep, opt_shardings
) -> dict[str, tuple]:
  """name -> (function, jit's keyword arguments, in_shardings, out_shardings).

  The programs of a step of `k` micro-batches. Parameters and optimizer
  state are donated to the program that updates them when `donate` (with
  K > 1 every micro-step, which passes them through in place before the
  last); the accumulator and the step counter always are. `ps`, `bs`,
  `rep`, `opt_shardings`: the shardings of the parameters, the batch,
  scalars and the optimizer state (all None without explicit shardings).
  """
  state = (0, 1) if donate else ()
  update_program = None
  if k == 1:
    micro = (fns.single_micro_step, {}, (ps, bs), (ps, rep, rep))
    update_program = (
        fns.update,
        {"donate_argnums": state + (3,)},
        (ps, opt_shardings, ps, rep, rep, rep),
        (ps, opt_shardings, rep, rep),
    )
  else:
    micro = (
        fns.micro_step,
        {"donate_argnums": state + (2, 3)},
        (ps, opt_shardings, ps, rep, rep, rep, rep, bs),
        (ps, opt_shardings, ps, rep, rep, rep, rep),
    )
  jits = {
      "allocate": (fns.allocate, {}, None, ps),
      "micro_step": micro,
      "eval": (fns.eval_metrics_of, {}, (ps, bs), rep),
  }
  if update_program is not None:
    jits["update"] = update_program
  return jits


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
  opt_shardings = rep = None
  if explicit:
    # Scalars and packed metrics are replicated over the params' mesh.
    rep = _replicated(ps)
    opt_shardings = jax.tree.map(lambda x: x.sharding, opt_state)
  acc_shapes = _accumulator_shapes(params, ps)
  fns = _StepFunctions(
      spec, acc_shapes, _gradient_dtypes(spec, params, acc_shapes)
  )
  jits = _program_table(fns, spec.k, spec.donate, ps, bs, rep, opt_shardings)
  jitted = {}
  for name, (fn, kwargs, in_shardings, out_shardings) in jits.items():
    if explicit:
      if in_shardings is not None:
        kwargs = {**kwargs, "in_shardings": in_shardings}
      kwargs = {**kwargs, "out_shardings": out_shardings}
    jitted[name] = jax.jit(fn, **kwargs)
  return jitted, acc_shapes, opt_shardings


@dataclasses.dataclass(frozen=True)
class MicroStepResult:
  """What one micro-batch's programs return (on the devices, not fetched).

  Attributes:
    params: the parameters after the micro-step: the step's new ones after
      its last micro-batch (the old ones when the step was skipped or
      discarded), the same values before.
    opt_state: the optimizer state, likewise.
    packed: the micro-batch's metrics, packed (`metric_packing`).
    weighted: name -> WeightedMetric of the micro-batch.
    update_packed: with K > 1, after the step's last micro-batch, the
      step's `metric_packing.UPDATE_NAMES` packed; None before, and with K
      = 1, whose `packed` holds them after the micro-batch's.
  """

  params: Any
  opt_state: Any
  packed: metric_packing.PackedMetrics
  weighted: Mapping[str, Any]
  update_packed: Optional[jax.Array]


class StepPrograms:
  """A step's programs and the device values they carry between calls.

  The accumulator is the gradient sum of the running step (K > 1 only):
  allocated once, then donated to every micro-step; it stays allocated
  between steps, as the next step's first micro-batch replaces its contents
  (allocating it anew would cost a device op per step). With K = 1 the
  micro-step's gradients go straight to the update and are dropped, so
  between steps (eval, checkpoints) the devices hold the training state
  alone. The step counter
  (the learning rate's argument) and the micro-step's flags live on the
  devices too, so that no call transfers them.

  Attributes:
    k: the micro-batches per step.
    jitted: name -> the jitted function (what
      `maxtext/engine/step_lowering.py` lowers), for every name of
      `program_names(k)` and "allocate".
    compiled: every program was given compiled (`executables`) and runs in
      place of its jitted function.
    acc_shapes: the accumulator's `ShapeDtypeStruct`s (with shardings).
    opt_shardings: the optimizer state's shardings (None without
      `param_shardings`).
    grad_acc: the accumulator (None until the first micro-step; always
      None with K = 1).
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
    self._update = run.get("update")
    self.eval = run["eval"]
    self._scalar_sharding = (
        None if param_shardings is None else _replicated(param_shardings)
    )
    self.grad_acc = None
    self._flags = None  # True and False, on the devices.
    # (the step it holds, the device counter) or None.
    self._counter: Optional[tuple[int, jax.Array]] = None

  def check_concrete(self, what: str) -> None:
    """Raises RuntimeError naming `what` if the programs were made for
    abstract parameters: they can then only be lowered."""
    if self._abstract:
      raise RuntimeError(
          f"{what}() on an engine built on abstract parameters "
          "(ShapeDtypeStructs); such an engine can only lower its programs"
      )

  def _place(self, value) -> jax.Array:
    """A scalar on the devices, placed as the programs' scalars are."""
    return jax.device_put(value, self._scalar_sharding)

  def micro_step(
      self,
      params,
      opt_state,
      micro_batch,
      *,
      step: int,
      first: bool,
      last: bool,
      commit: bool,
  ) -> MicroStepResult:
    """Runs one micro-batch: one dispatch with K > 1 (the first call also
    allocates the accumulator, once per engine; the last one takes the
    update), two with K = 1 (the micro-step, then the update).

    Args:
      params: the parameters (donated when the spec says so).
      opt_state: the optimizer state, likewise.
      micro_batch: the loss_fn's batch pytree.
      step: the optimizer step this micro-batch belongs to (the learning
        rate's argument).
      first: the step's first micro-batch: its gradients replace the
        accumulator's contents.
      last: the step's last micro-batch: the step's update is taken
        (always true with K = 1).
      commit: with `last`, keep the update (False: compute it, keep the
        state, as a warm-up does).

    Returns:
      The micro-batch's results (with `last`, the update's).
    """
    if self._flags is None:
      self._flags = (self._place(np.bool_(False)), self._place(np.bool_(True)))
    if self._counter is None or self._counter[0] != step:
      self._counter = (step, self._place(np.int32(step)))
    counter = self._counter[1]
    if self.k == 1:
      grads, packed, weighted = self._micro_step(params, micro_batch)
      params, opt_state, counter, values = self._update(
          params, opt_state, grads, counter, self._flags[commit], packed.values
      )
      # The micro-batch's metrics and the update's, in one array.
      packed = metric_packing.PackedMetrics(
          values, packed.names + metric_packing.UPDATE_NAMES, packed.sums
      )
      update_packed = None
    else:
      if self.grad_acc is None:
        self.grad_acc = self._allocate()
      flags = self._flags
      (
          params,
          opt_state,
          self.grad_acc,
          counter,
          packed,
          weighted,
          update_packed,
      ) = self._micro_step(
          params,
          opt_state,
          self.grad_acc,
          counter,
          flags[first],
          flags[last],
          flags[commit],
          micro_batch,
      )
    self._counter = (step + 1 if last else step, counter)
    return MicroStepResult(
        params, opt_state, packed, weighted, update_packed if last else None
    )

  def release(self) -> None:
    """Drops the accumulator and the values kept on the devices."""
    self.grad_acc = None
    self._flags = None
    self._counter = None


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
