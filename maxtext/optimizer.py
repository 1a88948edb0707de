"""Learning-rate schedule and AdamW optimizer built from the config.

The schedule is linear warmup from 0 to `learning_rate` over `warmup_steps`,
then cosine decay to learning_rate * lr_end_fraction at the schedule's last
step (`lr_schedule_steps`, 0 = `steps`), constant after that. `schedule_summary`
describes the same schedule in numbers for the MLPerf log, so training and the
log cannot disagree.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax

from maxtext import config_lib
from maxtext.mllog import hyperparameters as mllog_hyperparameters

# Name of the schedule in the MLPerf log (`opt_learning_rate_decay_schedule`).
DECAY_SCHEDULE_NAME = mllog_hyperparameters.DECAY_SCHEDULE


def _check(config) -> tuple[float, int, int, float]:
  """Returns (peak, warmup, total, end_fraction); raises ValueError if bad."""
  peak = float(config.learning_rate)
  warmup = int(config.warmup_steps)
  total = config_lib.lr_schedule_steps(config)
  end_fraction = float(config.lr_end_fraction)
  if warmup < 0:
    raise ValueError(f"warmup_steps must be >= 0, got {warmup}")
  if total < warmup:
    raise ValueError(
        f"warmup_steps={warmup} exceeds the schedule length "
        f"{total} (lr_schedule_steps, 0 = steps)"
    )
  if not 0.0 <= end_fraction <= 1.0:
    raise ValueError(f"lr_end_fraction must be in [0, 1], got {end_fraction}")
  return peak, warmup, total, end_fraction


def make_schedule(config) -> optax.Schedule:
  """The learning rate as a function of the optimizer step count.

  lr(t) = peak * t / warmup                       for t < warmup
        = end + (peak - end) * (1 + cos(pi * p)) / 2, p = (t - warmup) / decay
                                                  for warmup <= t < total
        = end                                     for t >= total
  with end = peak * lr_end_fraction and decay = total - warmup.

  Args:
    config: learning_rate, warmup_steps, lr_schedule_steps, steps,
      lr_end_fraction.

  Returns:
    A function of an integer step (Python int or traced array) returning a
    float32 learning rate.

  Raises:
    ValueError: if warmup_steps is negative or exceeds the schedule length, or
      lr_end_fraction is outside [0, 1].
  """
  peak, warmup, total, end_fraction = _check(config)
  end = peak * end_fraction
  decay = total - warmup

  def schedule(count):
    t = jnp.asarray(count, jnp.float32)
    warm = peak * t / max(warmup, 1)
    progress = jnp.clip((t - warmup) / max(decay, 1), 0.0, 1.0)
    cosine = end + (peak - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    lr = jnp.where(t < warmup, warm, jnp.where(t >= total, end, cosine))
    return lr.astype(jnp.float32)

  return schedule


def _decay_mask(params: Any) -> Any:
  """Weight decay applies to matrices; vectors (norm scales) are exempt."""
  return jax.tree_util.tree_map(lambda x: jnp.ndim(x) >= 2, params)


def make_optimizer(
    config, schedule: optax.Schedule, *, include_clipping: bool = True
) -> optax.GradientTransformation:
  """Global-norm clipping followed by AdamW.

  Args:
    config: adam_b1, adam_b2, adam_eps, weight_decay, grad_clip_norm (0 = no
      clipping).
    schedule: the learning-rate schedule from `make_schedule`.
    include_clipping: False leaves the clipping to the caller: the engine
      clips with the gradient norm it measures anyway (`Engine`'s
      `grad_clip_norm`), which saves a second pass over the gradients.

  Returns:
    The optax transformation. Its state lives in the parameters' dtypes.
  """
  adamw = optax.adamw(
      learning_rate=schedule,
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
      mask=_decay_mask,
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


def schedule_summary(config) -> dict[str, Any]:
  """The schedule in numbers, the single source for what the MLPerf log says.

  Returns:
    dict with "learning_rate" (peak), "end_learning_rate", "warmup_steps",
    "decay_steps" (schedule steps - warmup), "schedule_steps",
    "decay_schedule" (DECAY_SCHEDULE_NAME), and the optimizer's
    "adam_b1", "adam_b2", "adam_eps", "weight_decay", "grad_clip_norm".
  """
  peak, warmup, total, _ = _check(config)
  return {
      "learning_rate": peak,
      "end_learning_rate": config_lib.end_learning_rate(config),
      "warmup_steps": warmup,
      "decay_steps": total - warmup,
      "schedule_steps": total,
      "decay_schedule": DECAY_SCHEDULE_NAME,
      "adam_b1": float(config.adam_b1),
      "adam_b2": float(config.adam_b2),
      "adam_eps": float(config.adam_eps),
      "weight_decay": float(config.weight_decay),
      "grad_clip_norm": float(config.grad_clip_norm),
  }
