"""The training engine: gradient accumulation, optimizer step, step metrics.

One training step is K = `gradient_accumulation_steps` calls of `fwd_bwd`
(one dispatch each, of one compiled program; with K = 1 two: the
micro-step, then the update) and the flush's concatenation (with K > 1;
with K = 1 none, the step's metrics being one array already), dispatched
with the last micro-batch, followed by one `update()`, which dispatches
nothing: K + 1 device operations, whatever the number of metrics.

* `fwd_bwd(micro_batch)` runs the micro-step: `jax.value_and_grad(loss_fn)`
  and, with K > 1, the gradients added into the engine's accumulator (a
  device buffer that lives from the first micro-batch on and is donated to
  every micro-step, so XLA adds in place). The step's last micro-batch
  also takes the step's update in the same program: the mean gradient's
  global norm, whether it is finite, the clipping and the optimizer step,
  which runs only when the norm is finite (a `cond` inside the program: a
  skipped step keeps parameters and optimizer state). Parameters and
  optimizer state are donated to it (`donate_state`), so XLA updates them
  in place. With K = 1 the same update is a program of its own,
  dispatched right after the micro-step, which returns the gradients: on
  the TPU compiler of the lock one program for both needs more memory
  than the two (`maxtext/engine/step_programs.py`). The micro-step returns
  the loss and the scalar aux metrics packed in one array, which the
  engine buffers with `MetricsRecorder.buffer_packed` (host lists, no
  device op); the program that takes the update also returns
  `learning_rate`, `grad_norm` and `step_skipped`, packed the same way
  (with K = 1 appended to the micro-step's array, which the update program
  takes and returns, so the step has one packed array).
  Weighted aux metrics go through the per-name path, and a `SummedMetric`
  is declared to the recorder as a sum.
  Once the last micro-batch's values are buffered, the engine starts the
  flush's device side (`MetricsRecorder.prefetch`: the concatenation,
  none for one array, and the copy of the result to the host), so it
  queues right behind the step and the copy starts as the step ends, not
  when the host gets to `update()`.
* `update()` flushes the recorder (one transfer for the whole step, begun
  at the last micro-batch; no device op), advances `step` and returns the
  step's flushed `MetricsBuffer`. A value buffered after the last
  micro-batch (`record_metrics` without `donate_state`) makes the flush
  do its own concatenation instead.

The recorder's guarantee (nothing is applied when the step's metrics
cannot be flushed) is kept by where the decision is taken, with
`donate_state` choosing how:

* True (the default): one copy of the training state. The update takes
  effect with the last micro-batch, so the step's metrics are settled
  before it is dispatched: the last `fwd_bwd` first asks the recorder
  whether any value of the step is already lost (`check_flushable`: a
  device value deleted after it was buffered, the failure the recorder's
  all-or-nothing flush reports), and raises, naming the metric, with
  nothing dispatched and parameters, optimizer state, step counter and
  accumulator untouched. From
  the last micro-batch to `update()` the step takes no more values
  (`record_metrics` raises), so what the flush then meets are values
  checked at that point and the outputs of the step's own programs. What
  is left (a value the caller deletes after handing it over and after the
  last micro-batch, a device failure of the step's own programs) cannot be
  undone once the state is donated: `update()` raises, and `state` refuses
  to give out the state until a retried `update()` succeeds, so no
  checkpoint holds an update whose metrics were not flushed.
* False: parameters and optimizer state are not donated; the update's new
  state is kept aside and becomes the engine's only once `update()`'s
  flush has succeeded (a flush that raises, for any reason, leaves the old
  state in place). Both versions exist from the last micro-batch to the
  flush, and the micro-steps before it copy the state they pass through.

With K > 1 the accumulator stays allocated between steps: every
micro-step has it as an argument and output, so no program's peak grows,
but work between steps (eval, checkpoints) runs beside it. With K = 1 the
gradients are dropped once the update is dispatched.

The engine is this sequence over programs made elsewhere, one module per
concern:

* `maxtext/engine/step_spec.py`: the constructor's arguments that shape the
  step, checked, as a `StepSpec`;
* `maxtext/engine/step_programs.py`: the compiled programs ("allocate" and
  "micro_step", or with K = 1 "micro_step" and "update"; "eval"), their
  shardings and donation, and the parameters that statistics of the
  forward pass move instead of gradients (`statistic_rules`; DeepSeek-V3's
  router bias), which ride the same programs with no dispatch added;
* `maxtext/engine/metric_packing.py`: the packing of a micro-step's metrics
  and the names they get (`flatten_metrics`: nested dicts become
  `name/sub`; None values, the keys `intermediate_outputs` and
  `param_statistics` and tuple/list values are skipped; the loss is
  `loss`), each checked by
  `maxtext.metrics.values`, the check the recorder applies too;
* `maxtext/engine/step_lowering.py`: `lower` and `lower_programs`, the programs
  lowered for ahead-of-time compilation. An engine built on abstract
  parameters (`ShapeDtypeStruct`s) allocates nothing and can only be lowered
  (`tools/benchmarks/memory_bench`); an engine given every program compiled
  (`executables`, e.g. from `saved_step.load`) runs them in place of its
  jitted functions and compiles none, with the same dispatches and the same
  guarantee.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Union

import jax
import numpy as np
import optax

from maxtext.core import eval_metrics
from maxtext.engine import metric_packing
from maxtext.model import param_statistics
from maxtext.engine import step_lowering
from maxtext.engine import step_programs
from maxtext.engine import step_spec
from maxtext.metrics import recorder as metrics_recorder

LossFn = step_spec.LossFn
EvalFn = step_spec.EvalFn
flatten_metrics = metric_packing.flatten_metrics


def _checked_state(state: Mapping[str, Any], params, opt_state) -> int:
  """`state`'s step, once its keys and trees match the engine's.

  Raises:
    ValueError: a key is missing, a tree's structure differs from the
      current one's, or the step is negative.
  """
  for key in ("params", "opt_state", "step"):
    if key not in state:
      raise ValueError(f"state lacks {key!r}; has {sorted(state)}")
  for key, current in (("params", params), ("opt_state", opt_state)):
    want = jax.tree_util.tree_structure(current)
    got = jax.tree_util.tree_structure(state[key])
    if want != got:
      raise ValueError(f"state[{key!r}] has structure {got}, want {want}")
  step = int(np.asarray(state["step"]))
  if step < 0:
    raise ValueError(f"state['step'] must be >= 0; got {step}")
  return step


def _check_wiring(recorder, param_shardings, batch_sharding) -> None:
  """Checks the engine's recorder and that its shardings come as a pair.

  Raises:
    TypeError: `recorder` is not a MetricsRecorder.
    ValueError: only one of the shardings is given.
  """
  if not isinstance(recorder, metrics_recorder.MetricsRecorder):
    raise TypeError(
        f"recorder must be a MetricsRecorder; got {type(recorder).__name__}"
    )
  if (param_shardings is None) != (batch_sharding is None):
    raise ValueError(
        "param_shardings and batch_sharding must be given together (or "
        "neither)"
    )


class Engine:
  """Runs micro-batches and optimizer steps; records the step's metrics.

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
      norm before the optimizer sees it, using the norm the step's metrics
      report (one pass over the gradients for both the metric and the
      clipping); `optimizer` should then not clip again. 0 = no clipping.
    donate_state: True = one copy of parameters and optimizer state
      (donated to the program that updates them, which takes effect
      with the last micro-batch, once the step's values are checked);
      False = the new state is kept aside until the flush has
      succeeded, both versions existing until then (see the module
      docstring).
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
    compute_copy: None, or `compute_copy(params) -> params`: the copy of
      the parameters the micro-step differentiates the loss in, some leaves
      cast to a narrower dtype, whose gradients then come out (with K = 1:
      go to the update) in that dtype. For a leaf the loss reads only
      through one cast to that dtype (`transformer.gradient_copy`), the
      gradient's values are the parameter's, in fewer bytes; the update
      takes them in the parameters' dtype.
  """

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
      compute_copy: Optional[Callable[[Any], Any]] = None,
  ):
    """Creates the engine and the optimizer state; the class docstring
    says what each argument is.

    Raises:
      TypeError/ValueError: on bad arguments.
    """
    self._spec = step_spec.make_spec(
        loss_fn,
        params,
        optimizer,
        learning_rate_fn,
        gradient_accumulation_steps,
        grad_clip_norm,
        donate_state,
        eval_fn,
        eval_directions,
        statistic_rules,
        compute_copy,
    )
    _check_wiring(recorder, param_shardings, batch_sharding)
    self._recorder = recorder
    self._k = self._spec.k
    self._param_shardings = param_shardings
    self._step = 0
    self._micro = 0
    # Without donation: the step's new (params, opt_state), from its last
    # micro-batch until update()'s flush has succeeded.
    self._new_state = None
    # On abstract parameters (ShapeDtypeStructs) nothing is allocated, and
    # the engine can only lower its programs.
    self._params, self._opt_state = step_programs.place_state(
        params, optimizer, param_shardings
    )
    self._programs = step_programs.StepPrograms(
        self._spec,
        self._params,
        self._opt_state,
        param_shardings,
        batch_sharding,
        executables,
    )

  # -- training ------------------------------------------------------------

  def fwd_bwd(self, micro_batch, *, discard: bool = False) -> None:
    """Runs one micro-batch: gradients into the accumulator, metrics
    buffered; after the step's last micro-batch, the step's update.

    Args:
      micro_batch: the loss_fn's batch pytree.
      discard: on the step's last micro-batch, compute the update (every
        program of a real step runs) but keep parameters and optimizer
        state as they were, as for a skipped step (the warm-up before a
        run's timed region); the step counter still advances at update().

    Raises:
      ValueError: if K micro-batches already ran since the last update(),
        or (the last micro-batch) a value buffered for the step was lost
        (`MetricsRecorder.check_flushable`); then nothing is dispatched and
        nothing changes.
    """
    self._programs.check_concrete("fwd_bwd")
    if self._micro >= self._k:
      raise ValueError(
          f"fwd_bwd called {self._micro + 1} times in step {self._step}, but "
          f"gradient_accumulation_steps is {self._k}; call update() first"
      )
    last = self._micro == self._k - 1
    if last:
      # The update takes effect with this micro-batch: a value the flush
      # could not bring home stops the step here, before anything is
      # dispatched or donated.
      self._recorder.check_flushable()
    result = self._programs.micro_step(
        self._params,
        self._opt_state,
        micro_batch,
        step=self._step,
        first=self._micro == 0,
        last=last,
        commit=not discard,
    )
    if self._spec.donate:
      self._params, self._opt_state = result.params, result.opt_state
    elif last:
      self._new_state = (result.params, result.opt_state)
    self._micro += 1
    metric_packing.buffer(
        self._recorder, self._step, result.packed, result.weighted
    )
    if result.update_packed is not None:
      self._recorder.buffer_packed(
          self._step, metric_packing.UPDATE_NAMES, result.update_packed
      )
    if last:
      # The step's values are all buffered: the flush's concatenation
      # queues behind the step and its copy to the host starts as soon as
      # the step ends, so update() launches nothing and waits only for the
      # copy.
      self._recorder.prefetch()

  def record_metrics(self, name: str, value) -> None:
    """Buffers `value` for the current step under `name` (per-name API).

    Nested dicts are walked as `name/sub`; None values, the key
    `intermediate_outputs` and tuple/list values are skipped. Every leaf goes
    through `MetricsRecorder.buffer_metrics` (validated on the host).

    Raises:
      ValueError: with `donate_state`, between the step's last micro-batch
        and update(): its update has taken effect, so its metrics are
        settled (record them before the last micro-batch).
    """
    if not isinstance(name, str):
      raise TypeError(f"metric name must be a str; got {name!r}")
    if self._spec.donate and self._micro == self._k:
      raise ValueError(
          f"metric {name!r}: step {self._step}'s update took effect with its "
          "last micro-batch, which settled its metrics; record them before "
          "the last fwd_bwd (or after update(), for the next step)"
      )
    for full_name, leaf in flatten_metrics(name, value):
      self._recorder.buffer_metrics(self._step, full_name, leaf)

  def update(self, *, release: bool = False) -> metrics_recorder.MetricsBuffer:
    """Flushes the step's metrics and completes the step.

    Args:
      release: the returned buffer leaves the recorder (the caller keeps
        it), so a training loop's recorder history never grows.

    Returns:
      The step's flushed MetricsBuffer (micro-batch metrics plus
      `learning_rate`, `grad_norm`, `step_skipped`).

    Raises:
      ValueError: if fewer than K micro-batches ran this step.
      Whatever `MetricsRecorder.flush` raises; then the step counter and
        the recorder are untouched and update() may be retried. Without
        donation parameters and optimizer state are the step's old ones;
        with it the update has taken effect and `state` refuses to give it
        out until a retried update() succeeds (module docstring).
    """
    if self._micro != self._k:
      raise ValueError(
          f"update() after {self._micro} micro-batches in step {self._step}; "
          f"gradient_accumulation_steps is {self._k}"
      )
    self._recorder.flush()
    buffer = self._recorder.get_step_metrics(self._step)
    if self._new_state is not None:
      self._params, self._opt_state = self._new_state
      self._new_state = None
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
    self._programs.check_concrete("eval_step")
    return self._programs.eval(self._params, batch)

  @property
  def eval_directions(self) -> Mapping[str, eval_metrics.Direction]:
    """Each eval metric's name and the direction it improves in."""
    return self._spec.eval_directions

  # -- ahead-of-time compilation (maxtext/engine/step_lowering.py) -------

  def program_names(self) -> tuple[str, ...]:
    """The programs this engine runs, as `lower_programs` names them."""
    return step_programs.program_names(self._k)

  def lower(self, micro_batch) -> dict[str, jax.stages.Lowered]:
    """Lowers the program one training step runs, without running it:
    {"micro_step": `jax.stages.Lowered`}
    (`step_lowering.lower_step`). `micro_batch` may hold arrays or
    `jax.ShapeDtypeStruct`s: only its shapes are read.
    """
    return step_lowering.lower_step(
        self._programs, self._params, self._opt_state, micro_batch
    )

  def lower_programs(
      self, micro_batch, eval_batch
  ) -> dict[str, jax.stages.Lowered]:
    """Lowers every program the engine runs (`program_names()`).

    `lower`'s micro-step, the accumulator's allocation (with K > 1) and the
    eval of `eval_batch` (shapes as for `micro_batch`): compiled, they are
    what the `executables` argument takes.
    """
    return step_lowering.lower_programs(
        self._programs, self._params, self._opt_state, micro_batch, eval_batch
    )

  def close(self) -> None:
    """Drops the recorder's buffers and the gradient accumulator."""
    self._recorder.cleanup()
    self._programs.release()
    self._new_state = None

  # -- state ---------------------------------------------------------------

  @property
  def params(self):
    return self._params

  @property
  def opt_state(self):
    return self._opt_state

  @property
  def donates_state(self) -> bool:
    """Whether the step donates parameters and optimizer state to the
    program that updates them."""
    return self._spec.donate

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
    """The checkpointable state: {"params", "opt_state", "step"}.

    Raises:
      RuntimeError: with `donate_state`, between the step's last
        micro-batch and update(): the update has taken effect but its
        metrics are not flushed yet.
    """
    if self._spec.donate and self._micro == self._k:
      raise RuntimeError(
          f"step {self._step}'s update took effect with its last micro-batch "
          "and its metrics are not flushed yet; call update() first"
      )
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
    step = _checked_state(state, self._params, self._opt_state)
    # Without shardings (None) each goes to the default device.
    self._params = jax.device_put(state["params"], self._param_shardings)
    self._opt_state = jax.device_put(
        state["opt_state"], self._programs.opt_shardings
    )
    self._step = step
