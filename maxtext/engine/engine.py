"""The training engine: gradient accumulation, optimizer step, step metrics.

One training step is K = `gradient_accumulation_steps` calls of `fwd_bwd` (one
jitted dispatch each) followed by one `update()` (three dispatches: the
gradient measure, the flush's concatenation, the optimizer apply), whatever K
and the number of metrics:

* `fwd_bwd(micro_batch)` runs the micro-step: `jax.value_and_grad(loss_fn)`,
  the gradients added into the engine's accumulator, a device buffer
  allocated by the first micro-batch that lives from then on and is donated
  to every micro-step, so XLA adds in place (with K = 1 the gradients become
  the accumulator). It returns the loss and the scalar aux metrics packed in
  one array, which the engine buffers with `MetricsRecorder.buffer_packed`
  (host lists, no device op); weighted aux metrics go through the per-name
  path, and a `SummedMetric` is declared to the recorder as a sum.
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

The engine is this loop over programs made elsewhere, one module per
concern:

* `maxtext/engine/step_spec.py`: the constructor's arguments that shape the
  step, checked, as a `StepSpec`;
* `maxtext/engine/step_programs.py`: the compiled programs ("allocate",
  "micro_step", "measure", "apply", "eval"), their shardings and donation,
  and the parameters that statistics of the forward pass move instead of
  gradients (`statistic_rules`; DeepSeek-V3's router bias), which ride the
  same programs with no dispatch added;
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
  flush-before-apply contract.
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
    )
    if not isinstance(recorder, metrics_recorder.MetricsRecorder):
      raise TypeError(
          f"recorder must be a MetricsRecorder; got {type(recorder).__name__}"
      )
    if (param_shardings is None) != (batch_sharding is None):
      raise ValueError(
          "param_shardings and batch_sharding must be given together (or "
          "neither)"
      )
    self._recorder = recorder
    self._k = self._spec.k
    self._param_shardings = param_shardings
    self._step = 0
    self._micro = 0
    # The step's `measure` result, once update() has dispatched it.
    self._update_packed = None
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

  def fwd_bwd(self, micro_batch) -> None:
    """Runs one micro-batch: gradients into the accumulator, metrics buffered.

    Raises:
      ValueError: if K micro-batches already ran since the last update().
    """
    self._programs.check_concrete("fwd_bwd")
    if self._micro >= self._k:
      raise ValueError(
          f"fwd_bwd called {self._micro + 1} times in step {self._step}, but "
          f"gradient_accumulation_steps is {self._k}; call update() first"
      )
    packed, weighted = self._programs.micro_step(
        self._params, micro_batch, first=self._micro == 0
    )
    self._micro += 1
    metric_packing.buffer(self._recorder, self._step, packed, weighted)

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
      self._update_packed = self._programs.measure(self._step)
      self._recorder.buffer_packed(
          self._step, metric_packing.UPDATE_NAMES, self._update_packed
      )
    args = (self._params, self._opt_state, self._update_packed)
    # The flush's own launches are dispatched first (prefetch), so on a
    # device that runs programs in order the fetch does not wait for the
    # optimizer.
    self._recorder.prefetch()
    if self._spec.donate:
      # The flush decides before anything is donated: a value that cannot be
      # fetched raises here with nothing changed. The apply then updates the
      # state in place, unless the step's gradients were not finite. The
      # flag comes from the global gradient norm, the same on every process,
      # so all processes run the apply or not alike.
      self._recorder.flush()
      buffer = self._recorder.get_step_metrics(self._step)
      if discard:
        self._programs.compile_apply(*args)
      elif not buffer.scalar_metrics["step_skipped"][-1] > 0:
        self._params, self._opt_state = self._programs.apply(*args)
    else:
      # The apply runs on the device while the host fetches and sorts the
      # step's metrics; nothing is donated, so until the flush has succeeded
      # and says the gradients were finite (the same flag on every process)
      # parameters, optimizer state, accumulator and step are untouched, and
      # a flush that raises drops the apply's result.
      new_params, new_opt_state = self._programs.apply(*args)
      self._recorder.flush()
      buffer = self._recorder.get_step_metrics(self._step)
      if not discard and not buffer.scalar_metrics["step_skipped"][-1] > 0:
        self._params, self._opt_state = new_params, new_opt_state
    self._programs.end_step()
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
    """Lowers the programs one training step runs, without running them:
    "micro_step", "measure" and "apply" -> `jax.stages.Lowered`
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

    `lower`'s three, the accumulator's allocation (with K > 1) and the
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
    step = _checked_state(state, self._params, self._opt_state)
    # Without shardings (None) each goes to the default device.
    self._params = jax.device_put(state["params"], self._param_shardings)
    self._opt_state = jax.device_put(
        state["opt_state"], self._programs.opt_shardings
    )
    self._step = step
