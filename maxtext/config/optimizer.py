"""Learning-rate schedule and AdamW optimizer built from the config.

The schedule is a linear warm-up from 0 to `learning_rate` over
`warmup_steps`, then the decay `lr_schedule` names (`choices.LR_SCHEDULES`):

  "cosine"    cosine decay to learning_rate * lr_end_fraction at the
              schedule's last step (`lr_schedule_steps`, 0 = `steps`),
              constant after that;
  "constant"  `learning_rate` from the end of the warm-up on
              (`lr_end_fraction` plays no part).

The optimizer's settings are `OptimizerConfig`, the config's fields of its
names. `schedule_facts(settings)` states the schedule in numbers (its length,
warm-up and decay steps, end learning rate, the decay's name as MLPerf spells
it); `make_schedule` builds the schedule from those same facts with optax, and
the MLPerf log (`maxtext.mllog.hyperparameters`) states them, so training
and the log cannot disagree.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from maxtext.core import choices
from maxtext.core import component_config

# How MLPerf's `opt_learning_rate_decay_schedule` spells each schedule.
DECAY_SCHEDULE_NAMES = {
    "cosine": "cosine with linear warmup",
    "constant": "constant",
}


@dataclasses.dataclass(frozen=True)
class ScheduleFacts:
  """The learning-rate schedule of a config, in numbers.

  Attributes:
    kind: the decay, one of `choices.LR_SCHEDULES`.
    learning_rate: the peak, reached at the end of the warm-up.
    warmup_steps: steps of linear warm-up from 0.
    schedule_steps: warm-up plus decay (`lr_schedule_steps`, 0 = `steps`).
    end_learning_rate: the learning rate from `schedule_steps` on.
    decay_schedule: the decay's name as MLPerf spells it.
  """

  kind: str
  learning_rate: float
  warmup_steps: int
  schedule_steps: int
  end_learning_rate: float
  decay_schedule: str

  @property
  def decay_steps(self) -> int:
    """Steps from the end of the warm-up to the end of the schedule."""
    return self.schedule_steps - self.warmup_steps


def schedule_length(lr_schedule_steps: int, steps: int) -> int:
  """Length of the learning-rate schedule: lr_schedule_steps, 0 = steps."""
  return lr_schedule_steps or steps


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(component_config.ComponentConfig):
  """The schedule's and AdamW's settings (`maxtext/configs/base.py`
  documents each field).

  Attributes:
    lr_schedule: the decay after the warm-up (`choices.LR_SCHEDULES`).
    learning_rate: the peak, reached at the end of the warm-up.
    warmup_steps: steps of linear warm-up from 0.
    lr_schedule_steps: warm-up plus decay; 0 = `steps`.
    steps: the run's length, the schedule's when lr_schedule_steps is 0.
    lr_end_fraction: "cosine"'s last learning rate over the peak.
    adam_b1: AdamW's first-moment decay.
    adam_b2: AdamW's second-moment decay.
    adam_eps: AdamW's denominator epsilon.
    weight_decay: AdamW's decoupled weight decay.
    grad_clip_norm: the global gradient norm clipped to; 0 = no clipping.
  """

  lr_schedule: str = "cosine"
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  lr_schedule_steps: int = 0
  steps: int = 1000
  lr_end_fraction: float = 0.1
  adam_b1: float = 0.9
  adam_b2: float = 0.95
  adam_eps: float = 1e-8
  weight_decay: float = 0.1
  grad_clip_norm: float = 1.0

  @property
  def schedule_steps(self) -> int:
    """Length of the learning-rate schedule (`schedule_length`)."""
    return schedule_length(self.lr_schedule_steps, self.steps)

  def validate(self) -> None:
    """Raises ValueError naming the first field out of its range."""
    fail = component_config.fail
    if self.lr_schedule not in choices.LR_SCHEDULES:
      raise fail(
          "lr_schedule",
          self.lr_schedule,
          f"must be one of {list(choices.LR_SCHEDULES)}",
      )
    if self.learning_rate <= 0:
      raise fail("learning_rate", self.learning_rate, "must be > 0")
    for key in ("warmup_steps", "lr_schedule_steps"):
      if getattr(self, key) < 0:
        raise fail(key, getattr(self, key), "must be >= 0")
    if self.warmup_steps > self.schedule_steps:
      raise fail(
          "warmup_steps",
          self.warmup_steps,
          f"must be <= the schedule length {self.schedule_steps} "
          f"(lr_schedule_steps, 0 = steps)",
      )
    if not 0.0 <= self.lr_end_fraction <= 1.0:
      raise fail("lr_end_fraction", self.lr_end_fraction, "must be in [0, 1]")
    for key in ("adam_b1", "adam_b2"):
      if not 0.0 <= getattr(self, key) < 1.0:
        raise fail(key, getattr(self, key), "must be in [0, 1)")
    if self.adam_eps <= 0:
      raise fail("adam_eps", self.adam_eps, "must be > 0")
    if self.weight_decay < 0:
      raise fail("weight_decay", self.weight_decay, "must be >= 0")
    if self.grad_clip_norm < 0:
      raise fail(
          "grad_clip_norm",
          self.grad_clip_norm,
          "must be >= 0 (0 = no clipping)",
      )


def end_learning_rate(settings: OptimizerConfig) -> float:
  """The schedule's last learning rate.

  "cosine": learning_rate * lr_end_fraction, free of float noise from the
  multiplication (1e-3 * 0.1 is 1e-4), as the MLPerf log states it;
  "constant": learning_rate.
  """
  if settings.lr_schedule == "constant":
    return float(settings.learning_rate)
  end = float(settings.learning_rate) * float(settings.lr_end_fraction)
  return float(f"{end:.12g}") if end else end


def schedule_facts(settings: OptimizerConfig) -> ScheduleFacts:
  """The schedule of `settings` in numbers (see `ScheduleFacts`).

  Raises:
    ValueError: as `OptimizerConfig.validate`.
  """
  settings.validate()
  return ScheduleFacts(
      kind=settings.lr_schedule,
      learning_rate=float(settings.learning_rate),
      warmup_steps=int(settings.warmup_steps),
      schedule_steps=settings.schedule_steps,
      end_learning_rate=end_learning_rate(settings),
      decay_schedule=DECAY_SCHEDULE_NAMES[settings.lr_schedule],
  )


def _cosine_decay(facts: ScheduleFacts) -> optax.Schedule:
  peak, end = facts.learning_rate, facts.end_learning_rate
  if not facts.decay_steps:
    # The warm-up ends at the schedule's end (optax's cosine refuses zero
    # decay steps): the end learning rate from there on.
    return optax.constant_schedule(end)
  return optax.cosine_decay_schedule(
      init_value=peak,
      decay_steps=facts.decay_steps,
      alpha=end / peak if peak else 0.0,
  )


def _constant(facts: ScheduleFacts) -> optax.Schedule:
  return optax.constant_schedule(facts.learning_rate)


# The learning rate after the warm-up, for each of `choices.LR_SCHEDULES`,
# as a function of the steps since the warm-up ended.
DECAYS: dict[str, Callable[[ScheduleFacts], optax.Schedule]] = {
    "cosine": _cosine_decay,
    "constant": _constant,
}


def make_schedule(settings: OptimizerConfig) -> optax.Schedule:
  """The learning rate as a function of the optimizer step count.

  For "cosine", with end = learning_rate * lr_end_fraction, warmup w, total
  T (`lr_schedule_steps`, 0 = `steps`) and decay = T - w:

  lr(t) = peak * t / w                            for t < w
        = end + (peak - end) * (1 + cos(pi * p)) / 2, p = (t - w) / decay
                                                  for w <= t < T
        = end                                     for t >= T

  For "constant": peak * t / w for t < w, then peak.

  Returns:
    A function of an integer step (Python int or traced array) returning a
    float32 learning rate.

  Raises:
    ValueError: as `schedule_facts`.
  """
  facts = schedule_facts(settings)
  schedule = DECAYS[facts.kind](facts)
  if facts.warmup_steps:
    # What optax.warmup_cosine_decay_schedule builds, for any decay.
    schedule = optax.join_schedules(
        [
            optax.linear_schedule(0.0, facts.learning_rate, facts.warmup_steps),
            schedule,
        ],
        [facts.warmup_steps],
    )
  return lambda count: jnp.asarray(schedule(count), jnp.float32)


def matrices(params: Any) -> Any:
  """The default weight-decay mask: arrays of two or more dimensions."""
  return jax.tree_util.tree_map(lambda x: jnp.ndim(x) >= 2, params)


def make_optimizer(
    settings: OptimizerConfig,
    schedule: optax.Schedule,
    *,
    include_clipping: bool = True,
    decay_mask: Callable[[Any], Any] = matrices,
) -> optax.GradientTransformation:
  """Global-norm clipping followed by AdamW.

  Args:
    settings: adam_b1, adam_b2, adam_eps, weight_decay, grad_clip_norm (0 =
      no clipping).
    schedule: the learning-rate schedule from `make_schedule`.
    include_clipping: False leaves the clipping to the caller: the engine
      clips with the gradient norm it measures anyway (`Engine`'s
      `grad_clip_norm`), which saves a second pass over the gradients.
    decay_mask: params -> a pytree of bools, True where weight decay
      applies. The model knows its parameters' dimensions: stacked layers
      make a norm scale two-dimensional, so the model's own mask
      (`transformer.weight_decay_mask`) is the one a run uses. Either mask
      gives the optimizer state the same structure (the decay stage has no
      state).

  Returns:
    The optax transformation. Its state lives in the parameters' dtypes.
  """
  adamw = optax.adamw(
      learning_rate=schedule,
      b1=settings.adam_b1,
      b2=settings.adam_b2,
      eps=settings.adam_eps,
      weight_decay=settings.weight_decay,
      mask=decay_mask,
  )
  if settings.grad_clip_norm > 0:
    # Without clipping here an identity stage takes the clip's place: both
    # have an empty state, so the optimizer state, and every checkpoint, has
    # the same structure either way.
    clip = (
        optax.clip_by_global_norm(settings.grad_clip_norm)
        if include_clipping
        else optax.identity()
    )
    return optax.chain(clip, adamw)
  return adamw
