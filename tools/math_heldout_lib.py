"""The held-out math experiment's plan and verdict (`tools/math_heldout.py`).

The experiment asks whether GRPO adds held-out accuracy on the math task
beyond what more supervised fine-tuning gives. Per seed: SFT from the seed,
then from that SFT checkpoint two arms trained on as many samples:

* GRPO: `grpo_config.steps` steps of global_batch_size completions;
* the control: SFT continued (the SFT config, fresh optimizer and warm-up,
  the same demonstrations in another order) for as many samples.

A sample is a sequence through the training loss, as the training loop
counts samples (`samples_per_s` in metrics.jsonl, the MLPerf log's sample
counts): a GRPO step trains global_batch_size
completions (grpo_num_generations of each of its problems) once per rollout,
an SFT step global_batch_size demonstrations; `control_steps` gives the
control's steps.

Each arm is evaluated as the benchmark evaluates: the GRPO config's held-out
eval (grouped pass@k at its eval temperature and top-p). The verdict is on
the config's `grpo_eval_target_metric`: GRPO gains when the mean over seeds
of its arm beats the control's mean by more than the spread between seeds,
the larger of the two arms' ranges (max - min over seeds).

The SFT length: either given, or the first of the first seed's SFT
checkpoints whose held-out pass@1 reaches a target (`first_reaching`), so
GRPO starts where its groups hold both right and wrong answers.
"""

import dataclasses
import functools
import math
import os
import statistics
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from maxtext.config import config_lib
from maxtext.config import optimizer
from maxtext.model import transformer

# The control's demonstrations come in another order than its SFT run's:
# data_shuffle_seed = this + the seed.
CONTROL_SHUFFLE_OFFSET = 1000


def grpo_samples(steps: int, global_batch_size: int, iterations: int) -> int:
  """Samples the training loop counts for a GRPO run: global_batch_size a
  rollout, one rollout every `iterations` updates."""
  return math.ceil(steps / iterations) * global_batch_size


def control_steps(grpo_config, sft_config) -> int:
  """The control's SFT steps: as many samples as the GRPO run trains.

  Raises:
    ValueError: the GRPO run's samples are not a whole number of SFT
      batches (naming both configs' fields).
  """
  samples = grpo_samples(
      grpo_config.steps,
      grpo_config.global_batch_size,
      grpo_config.grpo_num_iterations,
  )
  if samples % sft_config.global_batch_size:
    raise ValueError(
        f"the GRPO run trains {samples} samples (steps={grpo_config.steps} x "
        f"global_batch_size={grpo_config.global_batch_size}), not a multiple "
        f"of the SFT config's global_batch_size="
        f"{sft_config.global_batch_size}: the control cannot match it"
    )
  return samples // sft_config.global_batch_size


@dataclasses.dataclass(frozen=True)
class Places:
  """Where every run of the experiment goes.

  Attributes:
    runs: the runs' base_output_directory.
    demos: the demonstrations' directory (tools/write_demonstrations').
    cache: JAX's persistent compilation cache, shared by every run.
  """

  runs: str
  demos: str
  cache: str


def _run(config, places: Places, name: str, seed: int, **values: Any):
  """`config` as run `name` of the experiment, with `values` set."""
  return config_lib.with_values(
      config,
      dict(
          base_output_directory=places.runs,
          run_name=name,
          seed=seed,
          jax_compilation_cache_dir=places.cache,
          **values,
      ),
  )


def sft_run(
    sft_config,
    places: Places,
    seed: int,
    steps: int,
    schedule_steps: int,
    probed: bool = False,
):
  """The SFT run of `seed`: from the seed's random parameters, `steps` steps
  on the demonstrations in the seed's order, along the learning-rate
  schedule of a run of `schedule_steps` (every seed's SFT run follows the
  longest one's schedule, so a shorter run is that run's first steps). A
  `probed` run keeps the config's checkpoints (the SFT length is chosen
  among them); any other saves its last only, where the arms start."""
  checkpoints = {} if probed else dict(checkpoint_period=steps)
  return _run(
      sft_config,
      places,
      f"sft_s{seed}",
      seed,
      steps=steps,
      lr_schedule_steps=optimizer.schedule_length(
          sft_config.lr_schedule_steps, schedule_steps
      ),
      data_shuffle_seed=seed,
      **checkpoints,
      **_demonstrations(places),
  )


def control_run(sft_config, places: Places, seed: int, start: str, steps: int):
  """The control of `seed`: the SFT config again from the checkpoint
  `start`, `steps` steps on the demonstrations in another order."""
  return _run(
      sft_config,
      places,
      f"control_s{seed}",
      seed,
      steps=steps,
      checkpoint_period=steps,
      load_parameters_path=start,
      data_shuffle_seed=CONTROL_SHUFFLE_OFFSET + seed,
      **_demonstrations(places),
  )


def grpo_run(grpo_config, places: Places, seed: int, start: str):
  """The GRPO run of `seed` from the checkpoint `start`: its eval of the
  starting parameters is the SFT's, its last eval GRPO's."""
  return _run(
      grpo_config,
      places,
      f"grpo_s{seed}",
      seed,
      load_parameters_path=start,
  )


def eval_run(grpo_config, places: Places, name: str, seed: int, start: str):
  """A one-step GRPO run from `start` whose eval of the starting parameters
  (the run's `start_eval`) is the held-out eval of `start`, drawn with
  `seed` as the GRPO run of that seed draws its evals."""
  return _run(
      grpo_config,
      places,
      name,
      seed,
      load_parameters_path=start,
      steps=1,
      eval_interval=1,
      checkpoint_period=1,
  )


def _demonstrations(places: Places) -> dict[str, str]:
  return dict(
      train_data_path=os.path.join(places.demos, "train.jsonl"),
      eval_data_path=os.path.join(places.demos, "eval.jsonl"),
      tokenizer_path=places.demos,
  )


def _shapes(config) -> dict[str, str]:
  """The model's parameters' shapes and dtypes by path (nothing allocated)."""
  abstract = jax.eval_shape(
      functools.partial(transformer.init_params, config),
      jax.ShapeDtypeStruct((2,), np.uint32),
  )
  return {
      jax.tree_util.keystr(path): f"{leaf.dtype}{list(leaf.shape)}"
      for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)
  }


def check_same_model(sft_config, grpo_config) -> None:
  """GRPO and the evaluations start from the SFT runs' checkpoints: both
  configs must describe one model.

  Raises:
    ValueError: naming the first parameter whose shape differs.
  """
  sft, grpo = _shapes(sft_config), _shapes(grpo_config)
  for path in sorted(set(sft) | set(grpo)):
    if sft.get(path) != grpo.get(path):
      raise ValueError(
          f"the SFT and GRPO configs describe different models: parameter "
          f"{path} is {sft.get(path, 'absent')} in the SFT config, "
          f"{grpo.get(path, 'absent')} in the GRPO config"
      )


def check_full_length(sft_config, grpo_config) -> None:
  """Every run trains all its steps: a quality target would end one early
  and the arms would not train as many samples.

  Raises:
    ValueError: naming the target field.
  """
  if sft_config.target_eval_loss > 0:
    raise ValueError(
        f"--sft_config.target_eval_loss={sft_config.target_eval_loss}: an "
        "SFT run would stop at it; give 0"
    )
  if grpo_config.grpo_target_pass_rate > 0:
    raise ValueError(
        f"--grpo_config.grpo_target_pass_rate="
        f"{grpo_config.grpo_target_pass_rate}: a GRPO run would stop at it; "
        "give 0"
    )


def checkpoint_steps(steps: int, period: int) -> list[int]:
  """The steps an SFT run of `steps` checkpoints at: every `period` and the
  last.

  Raises:
    ValueError: period < 1.
  """
  if period < 1:
    raise ValueError(f"checkpoint_period={period}: must be >= 1")
  return sorted(set(range(period, steps + 1, period)) | {steps})


def check_keeps_candidates(sft_config) -> None:
  """Finding the SFT length evaluates the first SFT run's checkpoints: the
  run must keep them all.

  Raises:
    ValueError: naming max_checkpoints_to_keep and the checkpoints needed.
  """
  needed = len(checkpoint_steps(sft_config.steps, sft_config.checkpoint_period))
  keep = sft_config.max_checkpoints_to_keep
  if 0 < keep < needed:
    raise ValueError(
        f"--sft_config.max_checkpoints_to_keep={keep}: finding the SFT length"
        f" evaluates the first SFT run's {needed} checkpoints (steps="
        f"{sft_config.steps}, checkpoint_period="
        f"{sft_config.checkpoint_period}); give 0 (keep all) or --sft_steps"
    )


def first_reaching(
    candidates: Sequence[int],
    value_of: Callable[[int], float],
    target: float,
) -> tuple[int, dict[int, float]]:
  """The first candidate whose value reaches `target`, by bisection.

  The values are taken to rise along `candidates` (held-out pass@1 along
  SFT steps), so log2(len) evaluations find the first at or above the
  target; the last candidate when none reaches it.

  Args:
    candidates: steps in increasing order (at least one).
    value_of: a step's value (an evaluation: each is asked once).
    target: the value to reach.

  Returns:
    (the step chosen, every evaluated step's value).

  Raises:
    ValueError: no candidates.
  """
  if not candidates:
    raise ValueError("first_reaching: no candidates")
  values: dict[int, float] = {}

  def reaches(i: int) -> bool:
    step = candidates[i]
    if step not in values:
      values[step] = value_of(step)
    return values[step] >= target

  low, high = 0, len(candidates) - 1
  while low < high:
    middle = (low + high) // 2
    if reaches(middle):
      high = middle
    else:
      low = middle + 1
  reaches(low)
  return candidates[low], values


@dataclasses.dataclass(frozen=True)
class SeedResult:
  """One seed's held-out pass rates (metric name -> value) after each phase,
  and its GRPO run's training statistics."""

  seed: int
  sft: Mapping[str, float]
  grpo: Mapping[str, float]
  control: Mapping[str, float]
  grpo_training: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The experiment's answer on `metric`.

  Attributes:
    metric: the eval metric compared (grpo_eval_target_metric).
    grpo_mean: its mean over seeds after GRPO.
    control_mean: its mean over seeds of the control.
    sft_mean: its mean over seeds after SFT (both arms' start).
    spread: the larger of the two arms' ranges over seeds.
    gain: grpo_mean - control_mean.
    counts: gain > spread.
  """

  metric: str
  grpo_mean: float
  control_mean: float
  sft_mean: float
  spread: float
  gain: float
  counts: bool

  def line(self) -> str:
    """The verdict in one line."""
    seeds = "" if self.spread else " (no spread: one seed, or equal values)"
    if self.counts:
      answer = "GRPO gains: the difference of means exceeds the spread"
    else:
      answer = "no gain beyond the spread between seeds"
    return (
        f"{self.metric}: GRPO mean {self.grpo_mean:.3f}, control mean "
        f"{self.control_mean:.3f}, difference {self.gain:+.3f}, spread "
        f"{self.spread:.3f}{seeds}: {answer}"
    )


def _values(results: Sequence[SeedResult], arm: str, metric: str):
  try:
    return [getattr(r, arm)[metric] for r in results]
  except KeyError:
    raise ValueError(
        f"the {arm} evaluations have no {metric!r}: the eval reports "
        f"{sorted(getattr(results[0], arm))}"
    ) from None


def verdict(results: Sequence[SeedResult], metric: str) -> Verdict:
  """The comparison of the module docstring on `metric`.

  Raises:
    ValueError: no results, or an evaluation without `metric`.
  """
  if not results:
    raise ValueError("verdict: no seeds")
  grpo = _values(results, "grpo", metric)
  control = _values(results, "control", metric)
  sft = _values(results, "sft", metric)
  spread = max(max(grpo) - min(grpo), max(control) - min(control))
  gain = statistics.fmean(grpo) - statistics.fmean(control)
  return Verdict(
      metric=metric,
      grpo_mean=statistics.fmean(grpo),
      control_mean=statistics.fmean(control),
      sft_mean=statistics.fmean(sft),
      spread=spread,
      gain=gain,
      counts=gain > spread,
  )


def _cell(values: Mapping[str, float], metrics: Sequence[str]) -> str:
  return " / ".join(f"{values[m]:.3f}" if m in values else "-" for m in metrics)


def table(
    results: Sequence[SeedResult],
    metrics: Sequence[str],
    training_keys: Sequence[str] = (),
) -> str:
  """The per-seed results and their means as a Markdown table: each arm's
  `metrics` joined by " / ", then the GRPO runs' `training_keys`."""
  names = " / ".join(metrics)
  header = [
      "seed",
      f"after SFT ({names})",
      f"after GRPO ({names})",
      f"control ({names})",
      *training_keys,
  ]
  rows = []
  for r in results:
    rows.append(
        [
            str(r.seed),
            _cell(r.sft, metrics),
            _cell(r.grpo, metrics),
            _cell(r.control, metrics),
            *(_number(r.grpo_training.get(k)) for k in training_keys),
        ]
    )
  rows.append(
      [
          "mean",
          *(
              _cell(_means(results, arm, metrics), metrics)
              for arm in ("sft", "grpo", "control")
          ),
          *(_number(_training_mean(results, k)) for k in training_keys),
      ]
  )
  lines = ["| " + " | ".join(header) + " |"]
  lines.append("|" + "---|" * len(header))
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def _number(value: Optional[float]) -> str:
  return "-" if value is None else f"{value:.3f}"


def _training_mean(results: Sequence[SeedResult], key: str) -> Optional[float]:
  values = [r.grpo_training[key] for r in results if key in r.grpo_training]
  return statistics.fmean(values) if values else None


def _means(
    results: Sequence[SeedResult], arm: str, metrics: Sequence[str]
) -> dict[str, float]:
  out = {}
  for m in metrics:
    values = [getattr(r, arm)[m] for r in results if m in getattr(r, arm)]
    if values:
      out[m] = statistics.fmean(values)
  return out


def training_summary(
    records: Sequence[Mapping[str, float]], keys: Sequence[str], window: int
) -> dict[str, float]:
  """A GRPO run's training statistics from its train records: for each of
  `keys`, its mean over the run ("<key>") and over the first and last
  `window` steps ("<key> first", "<key> last"). Keys no record holds are
  left out."""
  out = {}
  for key in keys:
    values = [r[key] for r in records if key in r]
    if not values:
      continue
    out[key] = statistics.fmean(values)
    out[f"{key} first"] = statistics.fmean(values[:window])
    out[f"{key} last"] = statistics.fmean(values[-window:])
  return out
