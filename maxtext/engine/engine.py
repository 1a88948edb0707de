"""The training engine: gradient accumulation, optimizer step, step metrics.

One training step is K = `gradient_accumulation_steps` calls of `fwd_bwd` (one
jitted dispatch each) followed by one `update()` (three dispatches: the
gradient measure, the flush's concatenation, the optimizer apply), whatever K
and the number of metrics:

* `fwd_bwd(micro_batch)` runs `jax.value_and_grad(loss_fn)` and adds the
  gradients into the engine's accumulator, a device buffer allocated by the
  first micro-batch that lives from then on and is donated to every
  micro-step, so XLA adds in place. One compiled program serves every
  micro-batch: its `first` argument, a traced flag, makes a step's first
  gradients replace the accumulator's contents (the previous step's sum, or
  a skipped step's non-finite one) instead of adding to them. With K = 1
  there is nothing to add to: the micro-step takes no accumulator and its
  gradients become it, as XLA computes them (adding into a donated buffer
  costs a gradient-sized temporary, which K > 1 pays). It returns the
  loss and the scalar aux metrics packed in one array; their names are
  static data of the output's pytree structure, so every call of the
  compiled program, traced now or found in a cache, hands them back. The
  engine buffers the array with `MetricsRecorder.buffer_packed` (host lists,
  no device op). Weighted aux metrics go through the per-name path; a
  `SummedMetric` is packed and declared to the recorder as a sum, so the
  step's value of a count is its sum over the micro-batches.
* `update()` dispatches `measure`, a small program reading the accumulator:
  the mean gradient's global norm, whether it is finite, and the learning
  rate (`grad_norm`, `step_skipped`, `learning_rate`, buffered packed like
  the micro-batch metrics). It then flushes the recorder (one concatenation
  and one transfer for the whole step) and dispatches the optimizer apply
  (which clips the mean gradient to `grad_clip_norm` with the norm already
  measured). A value that cannot be fetched raises with parameters,
  optimizer state, step counter and accumulator unchanged, and a non-finite
  step keeps the old state. `update()` advances `step` and returns the
  step's flushed `MetricsBuffer` without waiting for the apply, so the host
  prepares the next step while the device runs it.

Two ways to keep that contract (`donate_state`):

* True (the default): one copy of the training state. The flush runs first
  and decides: only once it has succeeded, and says the gradients were
  finite, is the apply dispatched, with parameters and optimizer state
  donated, so XLA updates them in place (a skipped step runs no apply). The
  device waits for the host's flush between the measure and the apply.
  (Selecting the old values inside a donating apply instead would cost XLA
  temporaries of the size of the optimizer's moments.)
* False: the apply is dispatched before the flush, without donation, and its
  result is kept only once the flush has succeeded and says the gradients
  were finite. The device runs the apply while the host sorts the metrics,
  but both versions of the state exist until the flush has decided: one
  more copy of parameters and optimizer state at every update.

With K > 1 the accumulator stays allocated between steps: every program of a
step has it as an argument or output, so no program's peak grows, but work
between steps (eval, checkpoints) runs beside it. With K = 1 it is freed at
the end of `update()`.

`lower(micro_batch)` lowers the engine's own programs for ahead-of-time
compilation: "micro_step", "measure" and "apply", the programs a step runs
besides the recorder's concatenation. An engine built on abstract parameters
(`ShapeDtypeStruct`s) allocates nothing and can only be lowered
(`tools/benchmarks/memory_bench`).
`lower_programs` lowers every program the engine runs (`program_names()`:
those three, the accumulator's allocation with K > 1, and the eval); an
engine given them compiled (`executables`, e.g. from `saved_step.load`) runs
them in place of its jitted functions and compiles none, with the same
dispatches and the same flush-before-apply contract.

Parameters that statistics of the forward pass move instead of gradients
(`statistic_rules`; DeepSeek-V3's router bias) ride the same programs: the
loss returns their statistics in its aux, the accumulator's slot of such a
parameter sums them, and the apply replaces the parameter by its rule
(`maxtext/model/param_statistics.py`). No dispatch is added.

Metric names follow `record_metrics`: nested dicts become `name/sub`; None
values, the keys `intermediate_outputs` and `param_statistics` and
tuple/list values are skipped. The loss is recorded as `loss`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.core import checks
from maxtext.core import eval_metrics
from maxtext.model import param_statistics
from maxtext.metrics import recorder as metrics_recorder

LossFn = Callable[[Any, Any], tuple[jax.Array, Any]]
# (params, batch) -> {eval metric name: scalar}.
EvalFn = Callable[[Any, Any], Mapping[str, jax.Array]]

_SKIPPED_KEYS = ("intermediate_outputs", param_statistics.KEY)
_UPDATE_NAMES = ("learning_rate", "grad_norm", "step_skipped")


def flatten_metrics(name: str, value) -> list[tuple[str, Any]]:
  """Walks `value` as `record_metrics` does; returns [(name, leaf), ...].

  Args:
    name: the prefix ("" for none).
    value: a leaf or a (nested) mapping of leaves.

  Returns:
    (full name, leaf) pairs in the mapping's iteration order; None values, the
    keys `intermediate_outputs` and `param_statistics` and tuple/list values
    are left out.
  """
  out = []

  def walk(prefix, v):
    if v is None or isinstance(v, (tuple, list)):
      return
    if isinstance(v, Mapping):
      for key, sub in v.items():
        if key in _SKIPPED_KEYS:
          continue
        walk(f"{prefix}/{key}" if prefix else str(key), sub)
      return
    out.append((prefix, v))

  walk(name, value)
  return out


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["values"],
    meta_fields=["names", "sums"],
)
@dataclasses.dataclass(frozen=True)
class _PackedMetrics:
  """A micro-batch's scalar metrics, packed in one array.

  `names` and `sums` are static fields: part of the pytree structure of a
  jitted program's output, which JAX keeps with the compiled program, so
  every call returns them with its values.

  Attributes:
    values: shape (len(names),), one value per name.
    names: the metric names, in packing order.
    sums: those of `names` declared `SummedMetric` (reduced by their sum).
  """

  values: jax.Array
  names: tuple[str, ...]
  sums: tuple[str, ...]


@functools.lru_cache(maxsize=64)
def _sum_declarations(sums: tuple[str, ...]) -> Optional[dict]:
  """`buffer_packed`'s aggregation_fns for the summed names (None if none)."""
  return {name: metrics_recorder.sum_values for name in sums} or None


def _eval_program(
    loss_fn: LossFn,
    eval_fn: Optional[EvalFn],
    directions: Optional[Mapping[str, eval_metrics.Direction]],
) -> tuple[EvalFn, Mapping[str, eval_metrics.Direction]]:
  """The eval function and its metrics' directions (see `Engine`)."""
  if (eval_fn is None) != (directions is None):
    raise ValueError(
        "eval_fn and eval_directions must be given together (or neither)"
    )
  if eval_fn is None:
    return (
        lambda params, batch: {eval_metrics.LOSS: loss_fn(params, batch)[0]},
        eval_metrics.LOSS_DIRECTIONS,
    )
  if not callable(eval_fn):
    raise TypeError(f"eval_fn must be callable; got {eval_fn!r}")
  if not directions or not all(
      isinstance(name, str) and isinstance(d, eval_metrics.Direction)
      for name, d in directions.items()
  ):
    raise TypeError(
        "eval_directions must map each eval metric's name (a str) to an "
        f"eval_metrics.Direction; got {directions!r}"
    )
  return eval_fn, dict(directions)


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


def _abstract(tree, sharded: bool = True):
  """`tree`'s shapes and dtypes (and shardings, if `sharded`)."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(
          x.shape,
          x.dtype,
          sharding=getattr(x, "sharding", None) if sharded else None,
      ),
      tree,
  )


class Engine:
  """Runs micro-batches and optimizer steps; records the step's metrics."""

  def __init__(
      self,
      loss_fn: LossFn,
      params,
      optimizer: optax.GradientTransformation,
      learning_rate_fn: Union[Callable[[Any], Any], float],
      recorder: metrics_recorder.MetricsRecorder,
      gradient_accumulation_steps: int,
      *,
      param_shardings=None,
      batch_sharding=None,
      grad_clip_norm: float = 0.0,
      donate_state: bool = True,
      eval_fn: Optional[EvalFn] = None,
      eval_directions: Optional[Mapping[str, eval_metrics.Direction]] = None,
      executables: Optional[Mapping[str, Any]] = None,
      statistic_rules: Optional[Mapping[str, param_statistics.Rule]] = None,
  ):
    """Creates the engine and the optimizer state.

    Args:
      loss_fn: `loss_fn(params, micro_batch) -> (loss, aux)`: `loss` the mean
        loss (a scalar), `aux` None or a (nested) dict of scalar metrics; it may
        hold None, `intermediate_outputs` and tuples, which are not recorded.
      params: the parameter pytree.
      optimizer: the optax transformation.
      learning_rate_fn: the schedule (step -> learning rate), or a constant;
        only recorded, the optimizer applies its own.
      recorder: where metrics go.
      gradient_accumulation_steps: K, the micro-batches per `update()`.
      param_shardings: None, or a pytree of `jax.sharding.NamedSharding` like
        `params`; then every jitted function has explicit shardings.
      batch_sharding: None, or the micro-batch's sharding (a sharding or a
        pytree prefix of the micro-batch).
      grad_clip_norm: if > 0, the mean gradient is scaled down to this global
        norm before the optimizer sees it, using the norm `measure` took
        (one pass over the gradients for both the metric and the
        clipping); `optimizer` should then not clip again. 0 = no clipping.
      donate_state: True = one copy of parameters and optimizer state (the
        apply donates them, dispatched after the flush); False = the apply
        runs during the flush and both versions exist until it has decided
        (see the module docstring).
      eval_fn: `eval_fn(params, batch) -> {name: scalar}`, the eval metrics
        of one batch, given with `eval_directions` (name -> the direction
        each improves in; the names `eval_fn` returns). Neither: the eval
        metric is loss_fn's loss, "loss", lower is better.
      executables: None, or every program of `program_names()` already
        compiled for these shapes and shardings (name -> a
        `jax.stages.Compiled`, e.g. loaded by `saved_step.load`): the
        engine runs them and compiles none of its own.
      statistic_rules: parameter path -> rule, for the parameters that the
        loss's statistics move instead of gradients
        (`maxtext/model/param_statistics.py`); None or {} for none.

    Raises:
      TypeError/ValueError: on bad arguments.
    """
    if not callable(loss_fn):
      raise TypeError(f"loss_fn must be callable; got {loss_fn!r}")
    if not isinstance(optimizer, optax.GradientTransformation):
      raise TypeError(
          "optimizer must be an optax.GradientTransformation; got "
          f"{type(optimizer).__name__}"
      )
    if not callable(learning_rate_fn) and not isinstance(
        learning_rate_fn, (int, float)
    ):
      raise TypeError(
          "learning_rate_fn must be callable or a number; got "
          f"{learning_rate_fn!r}"
      )
    if not isinstance(recorder, metrics_recorder.MetricsRecorder):
      raise TypeError(
          "recorder must be a MetricsRecorder; got "
          f"{type(recorder).__name__}"
      )
    # These two raise ValueError for a wrong type too (bool included), as they
    # always have, so they use the predicates of `checks`, not check_int.
    if (
        not checks.is_int(gradient_accumulation_steps)
        or gradient_accumulation_steps < 1
    ):
      raise ValueError(
          "gradient_accumulation_steps must be an int >= 1; got "
          f"{gradient_accumulation_steps!r}"
      )
    if (
        not checks.is_number(grad_clip_norm)
        # `not >= 0` also refuses NaN, which `< 0` would let through.
        or not grad_clip_norm >= 0  # pylint: disable=unnecessary-negation
        or grad_clip_norm == float("inf")
    ):
      raise ValueError(
          "grad_clip_norm must be a finite number >= 0; got "
          f"{grad_clip_norm!r}"
      )
    if not isinstance(donate_state, bool):
      raise TypeError(f"donate_state must be a bool; got {donate_state!r}")
    if (param_shardings is None) != (batch_sharding is None):
      raise ValueError(
          "param_shardings and batch_sharding must be given "
          "together (or neither)"
      )
    self._eval_fn, self._eval_directions = _eval_program(
        loss_fn, eval_fn, eval_directions
    )
    self._loss_fn = loss_fn
    self._optimizer = optimizer
    self._lr_fn = (
        learning_rate_fn
        if callable(learning_rate_fn)
        else (lambda _, lr=float(learning_rate_fn): lr)
    )
    self._recorder = recorder
    self._k = int(gradient_accumulation_steps)
    self._clip = float(grad_clip_norm)
    self._donate = donate_state
    # The step's `measure` result, once update() has dispatched it.
    self._update_packed = None
    self._param_shardings = param_shardings
    self._batch_sharding = batch_sharding
    self._step = 0
    self._micro = 0

    # Abstract parameters (ShapeDtypeStructs): the engine only lowers its
    # programs (`lower`); nothing is allocated.
    self._abstract = all(
        isinstance(x, jax.ShapeDtypeStruct)
        for x in jax.tree_util.tree_leaves(params)
    )
    if param_shardings is not None:
      if self._abstract:
        params = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            params,
            param_shardings,
        )
      else:
        params = jax.device_put(params, param_shardings)
    self._params = params
    shapes = {
        param_statistics.path_name(path): leaf.shape
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    self._rules = param_statistics.check_rules(statistic_rules or {}, shapes)
    self._statistic_shapes = {path: shapes[path] for path in self._rules}

    def init(fn, *args):
      # An abstract engine (for lowering) allocates nothing.
      return jax.eval_shape(fn, *args) if self._abstract else fn(*args)

    if param_shardings is not None:
      # The optimizer state's copies of the parameter tree (e.g. Adam's moments)
      # take the parameters' shardings; its other leaves (step counts) are
      # replicated over the same mesh.
      mesh = jax.tree_util.tree_leaves(param_shardings)[0].mesh
      replicated = jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec()
      )
      opt_shardings = optax.tree_map_params(
          optimizer,
          lambda _, sharding: sharding,
          jax.eval_shape(optimizer.init, params),
          param_shardings,
          transform_non_params=lambda _: replicated,
      )
      self._opt_state = init(
          jax.jit(optimizer.init, out_shardings=opt_shardings), params
      )
    else:
      self._opt_state = init(jax.jit(optimizer.init), params)
    self._build_jitted()
    if executables is not None:
      self._use_executables(executables)
    self._executables = dict(executables or {})
    # The gradient sum of the running step (between steps, the last step's);
    # allocated by the first fwd_bwd, then donated to every micro-step.
    self._grad_acc = None
    self._first_flags = None  # micro_step's `first` values, on the devices.

  # -- jitted functions ----------------------------------------------------

  def _build_jitted(self) -> None:
    """Compiles (lazily, by jax.jit) the step's programs for these shapes."""
    ps, bs = self._param_shardings, self._batch_sharding
    explicit = ps is not None
    if explicit:
      # Scalars and packed metrics are replicated over the params' mesh.
      mesh = jax.tree_util.tree_leaves(ps)[0].mesh
      rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      opt_shardings = jax.tree.map(lambda x: x.sharding, self._opt_state)
      self._opt_shardings = opt_shardings
    # The accumulator: float32 (or wider) copies of the parameters' shapes,
    # sharded like them.
    self._acc_shapes = jax.tree.map(
        lambda p, s: jax.ShapeDtypeStruct(
            p.shape, jnp.promote_types(p.dtype, jnp.float32), sharding=s
        ),
        self._params,
        ps if explicit else jax.tree.map(lambda _: None, self._params),
    )

    def allocate():
      # The accumulator (its zeros are never read: a step's first
      # micro-batch replaces them) and the two values of micro_step's
      # `first` flag, made once on the devices so that no call transfers
      # them.
      grad_acc = jax.tree.map(
          lambda s: jnp.zeros(s.shape, s.dtype), self._acc_shapes
      )
      return grad_acc, jnp.asarray(True), jnp.asarray(False)

    def micro_step(params, grad_acc, first, micro_batch):
      (loss, aux), grads = jax.value_and_grad(self._loss_fn, has_aux=True)(
          params, micro_batch
      )
      grads = self._with_statistics(grads, aux)
      # A select, not a product with 0: a step's first sum is exactly its
      # first gradients, whatever the accumulator held (a skipped step's
      # NaN included).
      grad_acc = jax.tree.map(
          lambda a, g: jnp.where(
              first, g.astype(a.dtype), a + g.astype(a.dtype)
          ),
          grad_acc,
          grads,
      )
      packed, weighted = self._pack(loss, aux)
      return grad_acc, packed, weighted

    def single_micro_step(params, micro_batch):
      # K = 1: the micro-batch's gradients are the step's sum. Taking no
      # accumulator lets them be the output as XLA computes them; adding
      # into a donated one would cost a gradient-sized temporary.
      (loss, aux), grads = jax.value_and_grad(self._loss_fn, has_aux=True)(
          params, micro_batch
      )
      grad_acc = jax.tree.map(
          lambda g, s: g.astype(s.dtype),
          self._with_statistics(grads, aux),
          self._acc_shapes,
      )
      packed, weighted = self._pack(loss, aux)
      return grad_acc, packed, weighted

    def measure(grad_acc, step):
      # The update's metrics, known (and flushed) before the optimizer's
      # result is kept or its state donated: the mean gradient's global norm
      # (which the apply's clipping uses too), whether it is finite, and the
      # learning rate. The statistics' slots are not gradients.
      grad_norm = optax.tree.norm(
          self._gradients_only(jax.tree.map(lambda a: a / self._k, grad_acc))
      )
      finite = jnp.isfinite(grad_norm)
      lr = jnp.asarray(self._lr_fn(step), jnp.float32)
      return jnp.stack(
          [
              lr,
              grad_norm.astype(jnp.float32),
              jnp.where(finite, 0.0, 1.0).astype(jnp.float32),
          ]
      )

    def apply(params, opt_state, grad_acc, update_packed):
      grads = jax.tree.map(
          lambda a, p: (a / self._k).astype(p.dtype), grad_acc, params
      )
      # The step's mean statistics; the optimizer sees zeros in their slots.
      statistics = self._statistics_only(grads)
      grads = self._map_statistics(grads, lambda _, g: jnp.zeros_like(g))
      if self._clip > 0:
        # Global-norm clipping as optax.clip_by_global_norm does it, with the
        # norm of the mean gradient that `measure` took
        # (update_packed[1]) instead of a second pass over the gradients.
        norm = update_packed[1]
        keep = norm < self._clip
        grads = jax.tree.map(
            lambda g: jnp.where(
                keep, g, (g / norm.astype(g.dtype)) * self._clip
            ),
            grads,
        )
      updates, new_opt = self._optimizer.update(grads, opt_state, params)
      # A statistic-moved parameter takes its rule's value; the optimizer's
      # update of it is discarded.
      old = self._statistics_only(params)
      new_params = self._map_statistics(
          optax.apply_updates(params, updates),
          lambda path, _: self._rules[path](old[path], statistics[path]),
      )
      return new_params, new_opt

    def eval_metrics_of(params, batch):
      return _checked_eval_metrics(
          self._eval_fn(params, batch), self._eval_directions
      )

    # Without donation, parameters and optimizer state stay valid until the
    # flush that follows the apply's dispatch has succeeded.
    donate = (0, 1) if self._donate else ()

    # The accumulator is donated to each micro-step, which adds into it in
    # place; the measure and the apply only read it.
    if explicit:
      self._allocate = jax.jit(allocate, out_shardings=(ps, rep, rep))
      if self._k == 1:
        self._micro_step = jax.jit(
            single_micro_step,
            in_shardings=(ps, bs),
            out_shardings=(ps, rep, rep),
        )
      else:
        self._micro_step = jax.jit(
            micro_step,
            donate_argnums=(1,),
            in_shardings=(ps, ps, rep, bs),
            out_shardings=(ps, rep, rep),
        )
      self._measure = jax.jit(
          measure, in_shardings=(ps, rep), out_shardings=rep
      )
      self._apply = jax.jit(
          apply,
          in_shardings=(ps, opt_shardings, ps, rep),
          out_shardings=(ps, opt_shardings),
          donate_argnums=donate,
      )
      self._eval = jax.jit(
          eval_metrics_of, in_shardings=(ps, bs), out_shardings=rep
      )
    else:
      self._allocate = jax.jit(allocate)
      if self._k == 1:
        self._micro_step = jax.jit(single_micro_step)
      else:
        self._micro_step = jax.jit(micro_step, donate_argnums=(1,))
      self._measure = jax.jit(measure)
      self._apply = jax.jit(apply, donate_argnums=donate)
      self._eval = jax.jit(eval_metrics_of)
    # What `lower` and `lower_programs` lower, whatever the engine runs.
    self._jitted = {
        "allocate": self._allocate,
        "micro_step": self._micro_step,
        "measure": self._measure,
        "apply": self._apply,
        "eval": self._eval,
    }

  def _map_statistics(self, tree, fn):
    """`tree` with each statistic leaf replaced by fn(path, leaf), in its
    dtype; every other leaf as it is."""
    if not self._rules:
      return tree

    def one(path, leaf):
      name = param_statistics.path_name(path)
      if name not in self._rules:
        return leaf
      return jnp.asarray(fn(name, leaf)).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(one, tree)

  def _statistics_only(self, tree) -> dict:
    """path -> leaf of `tree`, for the statistic-moved parameters."""
    return {
        param_statistics.path_name(path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if param_statistics.path_name(path) in self._rules
    }

  def _gradients_only(self, tree) -> list:
    """`tree`'s leaves without the statistic-moved parameters' slots."""
    return [
        leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if param_statistics.path_name(path) not in self._rules
    ]

  def _with_statistics(self, grads, aux):
    """The micro-batch's gradients with each statistic-moved parameter's
    slot holding the loss's statistic (checked at trace time)."""
    statistics = param_statistics.statistics_of(
        aux, self._rules, self._statistic_shapes
    )
    return self._map_statistics(grads, lambda path, _: statistics[path])

  def program_names(self) -> tuple[str, ...]:
    """The programs this engine runs, as `lower_programs` names them."""
    first = () if self._k == 1 else ("allocate",)
    return first + ("micro_step", "measure", "apply", "eval")

  def _use_executables(self, executables: Mapping[str, Any]) -> None:
    """Runs the given compiled programs in place of the jitted ones."""
    if not isinstance(executables, Mapping) or set(executables) != set(
        self.program_names()
    ):
      got = sorted(executables) if isinstance(executables, Mapping) else None
      raise ValueError(
          f"executables must name the programs {list(self.program_names())}"
          f"; got {got!r}"
      )
    for name, program in executables.items():
      if not callable(program):
        raise TypeError(f"executables[{name!r}] is not callable: {program!r}")
    if self._k > 1:
      self._allocate = executables["allocate"]
    self._micro_step = executables["micro_step"]
    self._measure = executables["measure"]
    self._apply = executables["apply"]
    self._eval = executables["eval"]

  @staticmethod
  def _pack(loss, aux) -> tuple[_PackedMetrics, dict]:
    """Splits the step's metrics (at trace time) into packed and weighted.

    Returns:
      (packed, weighted): the loss and the scalar aux metrics (SummedMetric
      values included, their names in `packed.sums`), and name ->
      WeightedMetric.
    """
    if aux is not None and not isinstance(aux, Mapping):
      raise TypeError(
          "loss_fn's aux must be None or a dict of metrics; got "
          f"{type(aux).__name__}"
      )
    scalars = [("loss", loss)]
    sums = []
    weighted = {}
    for name, leaf in flatten_metrics("", aux):
      if isinstance(leaf, metrics_recorder.WeightedMetric):
        weighted[name] = leaf
        continue
      if isinstance(leaf, metrics_recorder.SummedMetric):
        leaf = leaf.value
        if isinstance(
            leaf,
            (metrics_recorder.WeightedMetric, metrics_recorder.SummedMetric),
        ):
          raise TypeError(
              f"metric {name!r}: a SummedMetric holds one scalar; got "
              f"{type(leaf).__name__}"
          )
        sums.append(name)
      scalars.append((name, leaf))
    names = tuple(n for n, _ in scalars)
    if len(set(names) | set(weighted)) != len(names) + len(weighted):
      raise ValueError(
          f"metric names collide: {sorted(names)} " f"{sorted(weighted)}"
      )
    leaves = []
    for name, leaf in scalars:
      if isinstance(leaf, (str, bytes)):
        raise TypeError(f"metric {name!r}: not a number: {leaf!r}")
      try:
        arr = jnp.asarray(leaf)
      except TypeError as exc:
        raise TypeError(f"metric {name!r}: not a number: {leaf!r}") from exc
      if arr.dtype == jnp.bool_ or jnp.issubdtype(
          arr.dtype, jnp.complexfloating
      ):
        raise TypeError(
            f"metric {name!r}: dtype {arr.dtype} is not accepted "
            "(boolean or complex)"
        )
      if not (
          jnp.issubdtype(arr.dtype, jnp.integer)
          or jnp.issubdtype(arr.dtype, jnp.floating)
      ):
        raise TypeError(f"metric {name!r}: dtype {arr.dtype} is not numeric")
      if arr.shape not in ((), (1,)):
        raise ValueError(
            f"metric {name!r}: must have shape () or (1,); got "
            f"shape {arr.shape}"
        )
      leaves.append(arr.reshape(()))
    dtype = jnp.result_type(jnp.float32, *[x.dtype for x in leaves])
    packed = jnp.stack([x.astype(dtype) for x in leaves])
    return _PackedMetrics(packed, names, tuple(sums)), weighted

  # -- training ------------------------------------------------------------

  def fwd_bwd(self, micro_batch) -> None:
    """Runs one micro-batch: gradients into the accumulator, metrics buffered.

    Args:
      micro_batch: the loss_fn's batch pytree.

    Raises:
      ValueError: if K micro-batches already ran since the last update().
    """
    self._check_concrete("fwd_bwd")
    if self._micro >= self._k:
      raise ValueError(
          f"fwd_bwd called {self._micro + 1} times in step {self._step}, but "
          f"gradient_accumulation_steps is {self._k}; call update() first"
      )
    if self._k == 1:
      # update() freed the last step's sum.
      self._grad_acc, packed, weighted = self._micro_step(
          self._params, micro_batch
      )
    else:
      if self._grad_acc is None:
        self._grad_acc, *flags = self._allocate()
        self._first_flags = tuple(flags)  # (True, False)
      first = self._first_flags[0 if self._micro == 0 else 1]
      self._grad_acc, packed, weighted = self._micro_step(
          self._params, self._grad_acc, first, micro_batch
      )
    self._micro += 1
    # The names come with the output's structure, whether this call traced
    # the program or found it compiled.
    self._recorder.buffer_packed(
        self._step,
        packed.names,
        packed.values,
        _sum_declarations(packed.sums),
    )
    for name, value in weighted.items():
      self._recorder.buffer_metrics(self._step, name, value)

  def record_metrics(self, name: str, value) -> None:
    """Buffers `value` for the current step under `name` (per-name API).

    Nested dicts are walked as `name/sub`; None values, the key
    `intermediate_outputs` and tuple/list values are skipped. Every leaf goes
    through `MetricsRecorder.buffer_metrics` (validated on the host).
    """
    if not isinstance(name, str):
      raise TypeError(f"metric name must be a str; got {name!r}")
    for full_name, leaf in flatten_metrics(name, value):
      self._recorder.buffer_metrics(self._step, full_name, leaf)

  def update(
      self, *, discard: bool = False, release: bool = False
  ) -> metrics_recorder.MetricsBuffer:
    """Measures the mean gradient, flushes the step's metrics and runs the
    optimizer; keeps its result only if the flush succeeded and the
    gradients were finite.

    Args:
      discard: keep parameters and optimizer state as they were, as for a
        step with non-finite gradients, but have every program of a real
        update compiled (the warm-up before a run's timed region): the
        donating apply is compiled, not run; the step counter advances.
      release: the returned buffer leaves the recorder (the caller keeps
        it), so a training loop's recorder history never grows.

    Returns:
      The step's flushed MetricsBuffer (micro-batch metrics plus
      `learning_rate`, `grad_norm`, `step_skipped`).

    Raises:
      ValueError: if fewer than K micro-batches ran this step.
      Whatever `MetricsRecorder.flush` raises; then parameters, optimizer
        state, step counter and accumulator are untouched, and the step's
        measure stays buffered for a retried update().
    """
    if self._micro != self._k:
      raise ValueError(
          f"update() after {self._micro} micro-batches in step {self._step}; "
          f"gradient_accumulation_steps is {self._k}"
      )
    if self._update_packed is None:
      # Once per step: an update() retried after a failed flush finds the
      # step's measure buffered already.
      self._update_packed = self._measure(self._grad_acc, np.int32(self._step))
      self._recorder.buffer_packed(
          self._step, _UPDATE_NAMES, self._update_packed
      )
    args = (self._params, self._opt_state, self._grad_acc, self._update_packed)
    # The flush's own launches are dispatched first (prefetch), so on a
    # device that runs programs in order the fetch does not wait for the
    # optimizer.
    self._recorder.prefetch()
    if self._donate:
      # The flush decides before anything is donated: a value that cannot be
      # fetched raises here with nothing changed. The apply then updates the
      # state in place, unless the step's gradients were not finite. The
      # flag comes from the global gradient norm, the same on every process,
      # so all processes run the apply or not alike.
      self._recorder.flush()
      buffer = self._recorder.get_step_metrics(self._step)
      if discard:
        # Compiled into the cache the next real update's call hits (a
        # given executable is compiled already).
        if "apply" not in self._executables:
          self._apply.lower(*args).compile()
      elif not buffer.scalar_metrics["step_skipped"][-1] > 0:
        self._params, self._opt_state = self._apply(*args)
    else:
      # The optimizer is dispatched before the flush waits for anything, so
      # the device goes from the measure straight on to the
      # optimizer while the host fetches and sorts the step's metrics. Its
      # result is kept only once the flush has succeeded and says the
      # gradients were finite: parameters and optimizer state are not
      # donated, so until then they are untouched, and so are the
      # accumulator and the step counter.
      new_params, new_opt_state = self._apply(*args)
      # A value that cannot be fetched raises here; the optimizer's result
      # is dropped with nothing changed.
      self._recorder.flush()
      buffer = self._recorder.get_step_metrics(self._step)
      # A step with non-finite gradients keeps the old parameters and
      # optimizer state. The flag comes from the global gradient norm, the
      # same on every process, so all processes keep or drop the step alike
      # (and all ran the same programs).
      if not discard and not buffer.scalar_metrics["step_skipped"][-1] > 0:
        self._params, self._opt_state = new_params, new_opt_state
    if self._k == 1:
      # Nothing reads it again: between steps (eval, checkpoints) the
      # device holds the state alone.
      self._grad_acc = None
    # Otherwise the accumulator keeps this step's sum, which the next
    # step's first micro-batch replaces: allocating it anew would cost a
    # device op per step.
    self._update_packed = None
    self._step += 1
    self._micro = 0
    if release:
      self._recorder.get_metrics_history(clear=True)
    return buffer

  def eval_step(self, batch) -> dict[str, jax.Array]:
    """The eval metrics of `batch` with the current parameters.

    One dispatch, no gradients; {name: scalar} for each name of
    `eval_directions`, on the devices (not fetched).

    Raises:
      ValueError/TypeError: (when first traced) the eval function returns
        other names than it declared, or a value that is not a scalar.
    """
    self._check_concrete("eval_step")
    return self._eval(self._params, batch)

  @property
  def eval_directions(self) -> Mapping[str, eval_metrics.Direction]:
    """Each eval metric's name and the direction it improves in."""
    return self._eval_directions

  # -- ahead-of-time compilation -------------------------------------------

  def _check_concrete(self, what: str) -> None:
    if self._abstract:
      raise RuntimeError(
          f"{what}() on an engine built on abstract parameters "
          "(ShapeDtypeStructs); such an engine can only lower "
          "its programs"
      )

  def lower(self, micro_batch) -> dict[str, jax.stages.Lowered]:
    """Lowers the programs one training step runs, without running them.

    Args:
      micro_batch: a micro-batch pytree of arrays or `jax.ShapeDtypeStruct`s
        (the shapes are what matter; nothing is read).

    Returns:
      name -> `jax.stages.Lowered`, in the order a step runs them:
      "micro_step" (forward and backward of one micro-batch, adding into the
      donated accumulator; run K times), "measure" (the mean gradient's
      norm, finiteness and the learning rate) and "apply" (the optimizer
      update, donating parameters and optimizer state when `donate_state`).
      `.compile()` on each gives its `memory_analysis()` and
      `cost_analysis()`. The step's one other program is the recorder's
      concatenation of the packed metrics.
    """
    params, opt_state = _abstract(self._params), _abstract(self._opt_state)
    grad_acc = self._acc_shapes
    first = jax.ShapeDtypeStruct((), jnp.bool_)
    step = jax.ShapeDtypeStruct((), jnp.int32)
    packed = jax.ShapeDtypeStruct((len(_UPDATE_NAMES),), jnp.float32)
    batch = _abstract(micro_batch, sharded=False)
    micro_args = (
        (params, batch) if self._k == 1 else (params, grad_acc, first, batch)
    )
    jitted = self._jitted
    return {
        "micro_step": jitted["micro_step"].lower(*micro_args),
        "measure": jitted["measure"].lower(grad_acc, step),
        "apply": jitted["apply"].lower(params, opt_state, grad_acc, packed),
    }

  def lower_programs(
      self, micro_batch, eval_batch
  ) -> dict[str, jax.stages.Lowered]:
    """Lowers every program the engine runs (`program_names()`).

    `lower`'s three, the accumulator's allocation (with K > 1) and the
    eval of `eval_batch` (shapes as for `micro_batch`): compiled, they are
    what the `executables` argument takes.
    """
    lowered = self.lower(micro_batch)
    if self._k > 1:
      lowered["allocate"] = self._jitted["allocate"].lower()
    lowered["eval"] = self._jitted["eval"].lower(
        _abstract(self._params), _abstract(eval_batch, sharded=False)
    )
    return {name: lowered[name] for name in self.program_names()}

  def close(self) -> None:
    """Drops the recorder's buffers and the gradient accumulator."""
    self._recorder.cleanup()
    self._grad_acc = None

  # -- state ---------------------------------------------------------------

  @property
  def params(self):
    return self._params

  @property
  def opt_state(self):
    return self._opt_state

  @property
  def donates_state(self) -> bool:
    """Whether the apply donates parameters and optimizer state."""
    return self._donate

  @property
  def step(self) -> int:
    """Completed optimizer steps; metrics of the running step use this."""
    return self._step

  @property
  def micro_batches_done(self) -> int:
    return self._micro

  @property
  def recorder(self) -> metrics_recorder.MetricsRecorder:
    return self._recorder

  @property
  def state(self) -> dict:
    """The checkpointable state: {"params", "opt_state", "step"}."""
    return {
        "params": self._params,
        "opt_state": self._opt_state,
        "step": np.asarray(self._step, np.int64),
    }

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores `state` (as from `state`); only between steps.

    Raises:
      ValueError: mid-step, or if the trees do not match the current ones.
    """
    if self._micro:
      raise ValueError(
          f"set_state() in the middle of step {self._step} "
          f"({self._micro} micro-batches done)"
      )
    for key in ("params", "opt_state", "step"):
      if key not in state:
        raise ValueError(f"state lacks {key!r}; has {sorted(state)}")
    for key in ("params", "opt_state"):
      want = jax.tree_util.tree_structure(getattr(self, key))
      got = jax.tree_util.tree_structure(state[key])
      if want != got:
        raise ValueError(f"state[{key!r}] has structure {got}, want {want}")
    step = int(np.asarray(state["step"]))
    if step < 0:
      raise ValueError(f"state['step'] must be >= 0; got {step}")
    params, opt_state = state["params"], state["opt_state"]
    if self._param_shardings is not None:
      params = jax.device_put(params, self._param_shardings)
      opt_state = jax.device_put(opt_state, self._opt_shardings)
    else:
      params = jax.device_put(params)
      opt_state = jax.device_put(opt_state)
    self._params, self._opt_state, self._step = params, opt_state, step
