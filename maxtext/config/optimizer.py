"""Learning-rate schedule and AdamW optimizer built from the config.

The schedule is a linear warm-up from 0 to `learning_rate` over
`warmup_steps`, then the decay `lr_schedule` names (`choices.LR_SCHEDULES`):

  "cosine"    cosine decay to learning_rate * lr_end_fraction at the
              schedule's last step (`lr_schedule_steps`, 0 = `steps`),
              constant after that;
  "constant"  `learning_rate` from the end of the warm-up on
              (`lr_end_fraction` plays no part).

`schedule_facts(config)` states the schedule in numbers (its length, warm-up
and decay steps, end learning rate, the decay's name as MLPerf spells it);
`make_schedule` builds the schedule from those same facts with optax, and
the MLPerf log (`maxtext.mllog.hyperparameters`) states them, so training
and the log cannot disagree.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from maxtext.core import checks
from maxtext.core import choices

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


def lr_schedule_steps(config) -> int:
  """Length of the learning-rate schedule: lr_schedule_steps, 0 = steps."""
  return config.lr_schedule_steps or config.steps


def end_learning_rate(config) -> float:
  """The schedule's last learning rate.

  "cosine": learning_rate * lr_end_fraction, free of float noise from the
  multiplication (1e-3 * 0.1 is 1e-4), as the MLPerf log states it;
  "constant": learning_rate.
  """
  if config.lr_schedule == "constant":
    return float(config.learning_rate)
  end = float(config.learning_rate) * float(config.lr_end_fraction)
  return float(f"{end:.12g}") if end else end


def schedule_facts(config) -> ScheduleFacts:
  """The schedule of `config` in numbers (see `ScheduleFacts`).

  Args:
    config: lr_schedule, learning_rate, warmup_steps, lr_schedule_steps,
      steps, lr_end_fraction.

  Raises:
    ValueError: an unknown lr_schedule, warmup_steps negative or past the
      schedule length, or lr_end_fraction outside [0, 1].
  """
  if config.lr_schedule not in choices.LR_SCHEDULES:
    raise ValueError(
        f"config.lr_schedule={config.lr_schedule!r}: must be one of "
        f"{list(choices.LR_SCHEDULES)}"
    )
  warmup = checks.check_int("warmup_steps", config.warmup_steps, 0)
  total = lr_schedule_steps(config)
  if total < warmup:
    raise ValueError(
        f"warmup_steps={warmup} exceeds the schedule length "
        f"{total} (lr_schedule_steps, 0 = steps)"
    )
  end_fraction = float(config.lr_end_fraction)
  if not 0.0 <= end_fraction <= 1.0:
    raise ValueError(f"lr_end_fraction must be in [0, 1], got {end_fraction}")
  return ScheduleFacts(
      kind=config.lr_schedule,
      learning_rate=float(config.learning_rate),
      warmup_steps=warmup,
      schedule_steps=total,
      end_learning_rate=end_learning_rate(config),
      decay_schedule=DECAY_SCHEDULE_NAMES[config.lr_schedule],
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


def make_schedule(config) -> optax.Schedule:
  """The learning rate as a function of the optimizer step count.

  For "cosine", with end = learning_rate * lr_end_fraction, warmup w, total
  T (`lr_schedule_steps`, 0 = `steps`) and decay = T - w:

  lr(t) = peak * t / w                            for t < w
        = end + (peak - end) * (1 + cos(pi * p)) / 2, p = (t - w) / decay
                                                  for w <= t < T
        = end                                     for t >= T

  For "constant": peak * t / w for t < w, then peak.

  Args:
    config: lr_schedule, learning_rate, warmup_steps, lr_schedule_steps,
      steps, lr_end_fraction.

  Returns:
    A function of an integer step (Python int or traced array) returning a
    float32 learning rate.

  Raises:
    ValueError: as `schedule_facts`.
  """
  facts = schedule_facts(config)
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
    config,
    schedule: optax.Schedule,
    *,
    include_clipping: bool = True,
    decay_mask: Callable[[Any], Any] = matrices,
) -> optax.GradientTransformation:
  """Global-norm clipping followed by AdamW.

  Args:
    config: adam_b1, adam_b2, adam_eps, weight_decay, grad_clip_norm (0 = no
      clipping).
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
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
      mask=decay_mask,
  )
  if config.grad_clip_norm > 0:
    # Without clipping here an identity stage takes the clip's place: both
    # have an empty state, so the optimizer state, and every checkpoint, has
    # the same structure either way.
    clip = (
        optax.clip_by_global_norm(config.grad_clip_norm)
        if include_clipping
        else optax.identity()
    )
    return optax.chain(clip, adamw)
  return adamw
