"""A GRPO rollout as micro-batches on the devices: `RolloutBatches`.

`prepare` draws a rollout's prompts, generates with the parameters it is
given (`rollout`), computes the frozen reference's log-probabilities when
the KL term is on, and cuts the K micro-batches the loss
(`train_loss.loss_fn`) reads; `complete` puts the rollout's host values into
the flushed record of an update that trained on them. The training loop
(`maxtext/run/trainer.py`) dispatches the micro-batches: the GRPO workload's
batch source (`rollout_source.RolloutSource`) says which rollout feeds which
update and when it is drawn. Each of `grpo_num_iterations` updates over one
rollout is K `engine.fwd_bwd` calls and one `engine.update()`, so the
engine's one packed flush carries every metric of the loss. The behaviour
log-probabilities stay those of the parameters that generated, so later
passes are off-policy by exactly the updates in between, which the clipped
ratio bounds.

Every sample keeps the version of the parameters that drew it
(`Prepared.versions`: the updates they had taken), and with `record_age`
(rollouts drawn ahead, grpo_max_age = 1; docs/grpo.md) the records give the
trained samples' ages in updates (`rollout/age_max`, `rollout/age_mean`).
The behaviour log-probabilities are the decoder's at generation, so the
importance ratio of an update compares the trained parameters with the
older ones that drew its samples.

Each value stays where it is made. The rollout's statistics (rewards,
lengths, advantages: `rollout.rollout_stats`) are host values and go
straight into the record (`complete`), never through the devices. The
reference's log-probabilities stay on the devices: one program computes
them over the placed rollout and cuts it into the K micro-batches the loss
reads.

Phase timings (seconds on the host clock, each read once the device work it
times has come back to the host, so no synchronisation is added for them):

  timing/rollout        generation, rewards and advantages (`rollout`; its
                        parts `timing/generate` and `timing/reward`): the
                        decoder fetches its ids, so generation is complete.
  timing/reference      dispatching the one program that computes the
                        frozen reference's log-probabilities and cuts the
                        micro-batches (0 when grpo_beta = 0); its device
                        time falls into timing/update, which waits for it.
  timing/old_logprobs   0: the behaviour log-probabilities come out of
                        generation (the decoder's log-softmax of each drawn
                        id), so no separate pass computes them; their cost is
                        inside timing/generate, whatever num_iterations is.
  timing/update         from the update's micro-batches being ready (drawn
                        ahead: from its micro-batches but the last being
                        dispatched) to the engine's one metrics flush, which
                        waits for every micro-batch, the last of which also
                        takes the optimizer step (the update's metrics come
                        out of the same program), so the update is complete
                        (with a rollout drawn ahead, the next rollout's
                        drawing falls inside it; with a log-prob-error
                        threshold, the gate's forward pass over the
                        micro-batches, `logprob_gate`, too).
  timing/step           the record's whole step: from the rollout's start to
                        the update's flush for the first pass over a rollout,
                        the update alone for the later passes
                        (num_iterations > 1), whose records repeat the
                        rollout's statistics and timings, and for a rollout
                        drawn ahead, whose time overlapped the update
                        before.
"""

import dataclasses
import functools
import time
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.engine import engine as engine_lib
from maxtext.generation import decoder
from maxtext.generation import paged_decoder
from maxtext.generation import scoring
from maxtext.grpo.rollout import generation_mesh
from maxtext.grpo.loss import logprob_gate
from maxtext.grpo.rollout import packed_batches
from maxtext.grpo.rewards import rewards as rewards_lib
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.grpo.loss import train_loss
from maxtext.metrics import buffer
from maxtext.run import batch_source
from maxtext.generation import sampling
from maxtext.model import model_config as model_config_lib

# The micro-batch's arrays and their ranks (`rollout.micro_batches`, and
# the reference's log-probabilities).
_MICRO_BATCH_NDIMS = {
    "tokens": 2,
    "prompt_lengths": 1,
    "mask": 2,
    "old_log_probs": 2,
    "advantages": 1,
    "sequence_mask": 1,
    "token_normaliser": 1,
    "sequence_normaliser": 1,
    "ref_log_probs": 2,
}
# A packed micro-batch's model input besides "tokens" (`packed_batches`).
_PACKED_NDIMS = {"segment_ids": 2, "positions": 2, "completion_at": 2}


def _micro_batches_with_reference(
    reference,
    whole,
    temperature,
    num_micro_batches,
    config: model_config_lib.ModelConfig,
    mesh,
):
  """The rollout's K micro-batches, each with the reference's masked
  completion log-probabilities at the rollout's temperature, as the
  policy's (`train_loss`); a program of its own, one launch."""
  mask = whole["mask"]
  sequences = mask.shape[0] // num_micro_batches
  if "completion_at" in whole:
    # Packed: each micro-batch's positions index its own R rows; in the
    # stacked rows micro-batch k's start k * R * W further on.
    rows, width = whole["tokens"].shape
    rows //= num_micro_batches
    offset = (jnp.arange(mask.shape[0]) // sequences) * (rows * width)
    log_probs = scoring.packed_completion_log_probs_and_entropy(
        reference,
        whole["tokens"],
        whole["segment_ids"],
        whole["positions"],
        whole["completion_at"] + offset[:, None],
        config,
        mesh,
        temperature,
    )[0]
  else:
    rows = sequences
    log_probs = scoring.completion_log_probs_and_entropy(
        reference,
        whole["tokens"],
        whole["prompt_lengths"],
        mask.shape[1],
        config,
        mesh,
        temperature,
    )[0]
  whole = dict(whole, ref_log_probs=log_probs * mask)

  def cut(name, x, k):
    size = rows if name in packed_batches.ROW_KEYS else sequences
    return x[k * size : (k + 1) * size]

  return [
      {name: cut(name, x, k) for name, x in whole.items()}
      for k in range(num_micro_batches)
  ]


def _reference_program(num_micro_batches, model_config, mesh, packing):
  """One program: the reference's log-probabilities of the placed rollout,
  and the K micro-batches cut from it, left on the devices
  (`_micro_batches_with_reference`, called with the reference's
  parameters, the placed rollout and the temperature)."""
  ndims = dict(_MICRO_BATCH_NDIMS, **(_PACKED_NDIMS if packing else {}))
  return jax.jit(
      functools.partial(
          _micro_batches_with_reference,
          num_micro_batches=num_micro_batches,
          config=model_config,
          mesh=mesh,
      ),
      out_shardings=(
          None
          if mesh is None
          else [
              {
                  name: decoder.batch_sharding(mesh, ndim)
                  for name, ndim in ndims.items()
              }
          ]
          * num_micro_batches
      ),
  )


# The timings measured up to the micro-batches being ready.
ROLLOUT_TIMINGS = (
    "timing/rollout",
    "timing/generate",
    "timing/reward",
    "timing/reference",
    "timing/old_logprobs",
)
# The timings measured around the update.
UPDATE_TIMINGS = ("timing/update", "timing/step")


def _placeholder_reward(prompt, completion, **fields) -> float:
  """The warm-up's reward: no user code runs before the run starts."""
  del prompt, completion, fields
  return 0.0


@dataclasses.dataclass
class Prepared:
  """A rollout ready to train: what `RolloutBatches.prepare` makes.

  Attributes:
    rollout: the rollout (host arrays).
    batches: its K micro-batches on the devices (with a log-prob-error
      threshold, `logprob_gate.LazilyGated`: gated on first use).
    values: its host statistics and phase timings, for each record of the
      updates it feeds.
    versions: int64 [N]: per sample, the updates the parameters that drew
      it had taken (`Policy.version` at generation); a sample's age in an
      update is that update's index minus its version.
    start: perf_counter() at the rollout's start while its first update's
      timing/step is still to count it; None once counted, and for a
      rollout drawn while the previous update ran (`prepare(ahead=True)`),
      whose time overlapped that update.
  """

  rollout: rollout_lib.Rollout
  batches: Sequence[dict]
  values: dict[str, float]
  versions: np.ndarray
  start: Optional[float]


class RolloutBatches:
  """Makes GRPO rollouts into micro-batches for an engine whose loss is
  `train_loss.loss_fn`.

  Args:
    engine: the training engine; the log-prob-error gate reads its
      parameters when an update first reads a rollout's micro-batches.
    model_config: the model's config, frozen.
    prompts_of_step: step -> the step's P prompts.
    options_of_step: step -> the rollout's SamplingOptions (num_samples = G).
    reward_functions: from `rewards.load`.
    num_micro_batches: K (the engine's gradient_accumulation_steps).
    estimator: the advantage estimator.
    advantage_eps: the "grpo" estimator's eps.
    width: the rollout's token columns (fixed, so programs compile once).
    reference_params: the frozen reference policy, or None (beta = 0).
    mesh: the engine's mesh, or None for one device.
    overlong_filtering: completions cut by the length limit train nothing
      (`rollout.rollout`).
    rollout_fn: makes a step's Rollout; `rollout.rollout` (one turn of ids)
      or a text task's (`episode_rollout.rollout` with its setup bound),
      called with the same arguments.
    paged: the paged decoder's slots and pages, or None for the static
      decoder (`rollout.rollout`).
    record_age: records put `rollout/age_max` and `rollout/age_mean`, the
      trained samples' ages in updates (`Prepared.versions`); on for runs
      that draw rollouts ahead (grpo_max_age >= 1).
    generation: generate on devices of their own
      (`generation_mesh.GenerationMesh`: the parameters copied there before
      each rollout; records put `rollout/weight_copy_bytes` and
      `timing/weight_copy`), or None to generate on `mesh`.
    logprob_error_threshold: the loss's log-prob-error threshold, or None:
      with one, each rollout's micro-batches are gated with the parameters
      its first update starts from, when that update reads them
      (`logprob_gate`).
  """

  def __init__(
      self,
      engine: engine_lib.Engine,
      model_config: Any,
      prompts_of_step: Callable[[int], Sequence[Sequence[int]]],
      options_of_step: Callable[[int], sampling.SamplingOptions],
      reward_functions: Sequence[rewards_lib.RewardFunction],
      *,
      num_micro_batches: int,
      estimator: str = "grpo",
      advantage_eps: float = 1e-4,
      width: int,
      reference_params: Optional[Any] = None,
      mesh: Optional[jax.sharding.Mesh] = None,
      overlong_filtering: bool = False,
      rollout_fn: Callable[..., rollout_lib.Rollout] = rollout_lib.rollout,
      packing: bool = False,
      paged: Optional[paged_decoder.EngineOptions] = (
          paged_decoder.EngineOptions()
      ),
      record_age: bool = False,
      generation: Optional[generation_mesh.GenerationMesh] = None,
      logprob_error_threshold: Optional[float] = None,
  ):
    self._engine = engine
    # Only the model's fields: the reference's program and the decoder's
    # compile once per model, whatever the run's other fields.
    model_config = model_config_lib.of(model_config)
    self._config = model_config
    self._prompts_of_step = prompts_of_step
    self._options_of_step = options_of_step
    self._rewards = list(reward_functions)
    self._k = num_micro_batches
    self._estimator = estimator
    self._eps = advantage_eps
    self._width = width
    self._reference = reference_params
    self._mesh = mesh
    self._packing = packing
    if reference_params is not None:
      self._with_reference = _reference_program(
          num_micro_batches, model_config, mesh, packing
      )
    self._overlong_filtering = overlong_filtering
    self._rollout_fn = rollout_fn
    self._paged = paged
    self._record_age = record_age
    self._generation = generation
    self._gate = (
        None
        if logprob_error_threshold is None
        else logprob_gate.Gate(logprob_error_threshold, model_config, mesh)
    )

  def placeholder_rewards(self) -> list[rewards_lib.RewardFunction]:
    """The warm-up's reward functions: the names and weights of the run's,
    each scoring 0, so the metric set is the real one and no user code runs
    before the run starts."""
    return [
        rewards_lib.RewardFunction(f.name, _placeholder_reward, f.weight)
        for f in self._rewards
    ]

  def prepare(
      self,
      step: int,
      policy: batch_source.Policy,
      reward_functions: Optional[Sequence[rewards_lib.RewardFunction]] = None,
      *,
      restored: Optional[tuple[rollout_lib.Rollout, np.ndarray]] = None,
      ahead: bool = False,
  ) -> Prepared:
    """Rollout `step` drawn with `policy`'s parameters, as micro-batches on
    the devices.

    Args:
      step: the rollout (its prompts and its draws).
      policy: the parameters to generate with, and their version.
      reward_functions: instead of the step's own (the warm-up's).
      restored: (rollout, versions) drawn earlier (a checkpoint's pending
        rollout): only its micro-batches are made again.
      ahead: it is drawn while the previous update runs (grpo_max_age 1):
        its time is not the next update's step time (`Prepared.start`).
    """
    start = time.perf_counter()
    options = self._options_of_step(step)
    if restored is None:
      result, versions, copy_values = self._draw(
          step, policy, options, reward_functions
      )
    else:
      (result, versions), copy_values = restored, {}
    rolled = time.perf_counter()
    batches, packed_values = self._packed(
        rollout_lib.micro_batches(result, self._k)
    )
    batches, reference_s = self._on_devices(batches, options.temperature)
    values = dict(
        result.stats,
        **packed_values,
        **copy_values,
        **{
            # A restored rollout's is the drawing's, saved with it.
            "timing/rollout": (
                rolled - start
                if restored is None
                else result.stats.get("timing/rollout", 0.0)
            ),
            "timing/reference": reference_s,
            # Generation computed them (module docstring).
            "timing/old_logprobs": 0.0,
        },
    )
    return Prepared(
        rollout=result,
        batches=batches,
        values=values,
        versions=versions,
        start=None if ahead else start,
    )

  def _draw(self, step, policy, options, reward_functions):
    """(the rollout, its versions, the weight copy's values) of `step`,
    drawn with `policy`'s parameters (on the generation devices' copy of
    them when they are separate)."""
    version = policy.version
    params, mesh = policy.params, self._mesh
    copy_values = {}
    if self._generation is not None:
      params, seconds = self._generation.copy(params)
      mesh = self._generation.mesh
      copy_values = {
          "timing/weight_copy": seconds,
          "rollout/weight_copy_bytes": float(self._generation.copy_bytes),
      }
    result = self._rollout_fn(
        params,
        self._config,
        self._prompts_of_step(step),
        options,
        self._rewards if reward_functions is None else reward_functions,
        estimator=self._estimator,
        advantage_eps=self._eps,
        width=self._width,
        mesh=mesh,
        overlong_filtering=self._overlong_filtering,
        paged=self._paged,
    )
    versions = np.full((len(result.completions),), version, np.int64)
    return result, versions, copy_values

  def _packed(self, batches: list[dict]) -> tuple[list[dict], dict]:
    """(the micro-batches packed when packing is on, the packing values)."""
    if not self._packing:
      return batches, {}
    rows = packed_batches.num_rows(batches, self._row_multiple(batches))
    values = {
        "packing/padding_fraction": packed_batches.padding_fraction(
            batches, rows
        ),
        "packing/padded_padding_fraction": packed_batches.padding_fraction(
            batches
        ),
    }
    return [packed_batches.pack(batch, rows) for batch in batches], values

  def _on_devices(self, batches: list[dict], temperature: float):
    """(the micro-batches placed on the devices, with the reference's
    log-probabilities when the KL term is on and lazily gated with a
    log-prob-error threshold; the seconds dispatching the reference's
    program took)."""
    if self._reference is None:
      batches = [self._placed(batch) for batch in batches]
      reference_s = 0.0
    else:
      # The K micro-batches (each with the step's normalisers over K) as
      # one placed batch, which the reference's program cuts again.
      whole = self._placed(
          {
              name: np.concatenate([batch[name] for batch in batches])
              for name in batches[0]
          }
      )
      dispatched = time.perf_counter()
      batches = self._with_reference(
          self._reference, whole, np.float32(temperature)
      )
      reference_s = time.perf_counter() - dispatched
    if self._gate is not None:
      batches = logprob_gate.LazilyGated(
          batches, functools.partial(self._gated, temperature=temperature)
      )
    return batches, reference_s

  def _gated(self, batches: Sequence[dict], temperature: float) -> list:
    """`batches` gated with the engine's parameters now: the ones the
    update that first reads them starts from."""
    return self._gate(self._engine.params, batches, temperature)

  def _row_multiple(self, batches: list[dict]) -> int:
    """`packed_batches.row_multiple` on this step's mesh."""
    shards = 1 if self._mesh is None else self._mesh.devices.size
    return packed_batches.row_multiple(
        len(batches[0]["prompt_lengths"]), shards
    )

  def _placed(self, batch: dict) -> dict:
    """`batch` (host arrays, the same in every process) as arrays split by
    rows over the mesh: what the engine's programs take in a job of one
    process or many. Without a mesh, as it is."""
    if self._mesh is None:
      return batch

    def place(x):
      x = np.asarray(x)
      return jax.make_array_from_callback(
          x.shape,
          decoder.batch_sharding(self._mesh, x.ndim),
          lambda index: x[index],
      )

    return jax.tree_util.tree_map(place, batch)

  def complete(
      self,
      record: buffer.MetricsBuffer,
      update_start: float,
      prepared: Prepared,
      step: Optional[int] = None,
  ) -> None:
    """Completes an update's flushed record on the host: its rollout's
    statistics and timings, the update's timings, the samples' ages (with
    `record_age`), and the step's reduction of the loss's extremes (true
    max/min over the micro-batches).

    Args:
      record: the update's flushed record (`Engine.update`'s).
      update_start: perf_counter() when the update's micro-batches were
        ready to dispatch.
      prepared: the rollout the update trained on.
      step: the update's index (for the ages); None = the record's step.
    """
    end = time.perf_counter()
    began = update_start if prepared.start is None else prepared.start
    prepared.start = None  # Later updates of the rollout time themselves.
    values = dict(
        prepared.values,
        **{"timing/update": end - update_start, "timing/step": end - began},
    )
    if self._record_age:
      ages = (record.step if step is None else step) - prepared.versions
      values["rollout/age_max"] = float(np.max(ages))
      values["rollout/age_mean"] = float(np.mean(ages))
    for name, value in values.items():
      record.scalar_metrics[name] = np.array([value])
    record.aggregation_fns.update(
        {
            name: fn
            for name, fn in train_loss.STEP_AGGREGATIONS.items()
            if name in record.scalar_metrics
        }
    )
