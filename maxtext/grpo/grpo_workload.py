"""GRPO as a workload of the one training loop (`maxtext/run/trainer.py`).

`workloads.run(config)` with `config.workload = "grpo"` (grpo_main's configs
set it) post-trains a model with GRPO under every guarantee of the loop
(SIGTERM checkpoint, skip guard, finished-run message, checkpoint on an
output's failure, resume checks, MLPerf log, one metrics flush per step).
What GRPO supplies (see `maxtext/run/workload.py`):

  check            the reward functions' imports, the task, the loss
                   options (`workloads.check` runs config_lib.validate_grpo
                   on the config first)
  engine_factory   the model with `train_loss.loss_fn`
  make_dataset     the prompts (`prompts.PromptDataset`), by rollout
  start            the frozen reference (grpo_beta > 0:
                   `run/frozen_reference`, the starting parameters, loaded
                   again, never saved), the rollouts' batch source, and an
                   eval of the starting parameters
  batch_source     `rollout_source.RolloutSource`: update s's micro-batches
                   from rollout s // grpo_num_iterations, drawn with the
                   engine's parameters, with the reference's
                   log-probabilities; with grpo_max_age 1 drawn one update
                   ahead and kept beside each checkpoint
                   (`pending_rollout`); its records get the rollout's
                   statistics and the phase timings
  warm_up          one update on a rollout drawn with placeholder reward
                   functions, discarded (`warmup.discarded_steps`): every
                   program of a step compiled, nothing trained
  evaluate/target  held-out pass@1 / grouped pass@k; the one that
                   grpo_eval_target_metric names (MLPerf's eval_accuracy)
                   reaching grpo_target_pass_rate ends the run

A reward function's failure (`rewards.RewardError`, a
`batch_source.UserCodeError`) stops the run after a checkpoint of the last
completed step.

The starting parameters come from `load_parameters_path` (a pretraining
run's checkpoint) or the seed. The frozen KL reference (grpo_beta > 0) is
those starting parameters, loaded again, never saved, and pinned by the
first attempt (`run/frozen_reference`): a resume whose reference changed is
refused in one line unless `grpo_allow_reference_change`. The prompts and
the rollout's draws are functions of (seed, rollout), so a resumed run
continues with the prompts and draws an uninterrupted run would have used.

Several processes form one job as for pretraining (`distributed`): every
process draws the same prompts, holds the whole rollout on its host (the
decoder hands every row to every process) and scores it with the reward
functions, and the micro-batches are split by rows over the mesh; process 0
alone writes the records.
"""

import dataclasses
import functools
import time
from typing import Optional

from absl import logging
import jax

from maxtext.engine import engine as engine_lib
from maxtext.core import eval_metrics
from maxtext.engine import model_setup
from maxtext.config import optimizer as optimizer_lib
from maxtext.run import batch_source
from maxtext.run import frozen_reference
from maxtext.run import run_settings
from maxtext.run import warmup
from maxtext.run import workload
from maxtext.grpo.rollout import decode_footprint
from maxtext.grpo import evaluation
from maxtext.grpo import grpo_config
from maxtext.grpo.loss import frozen_router
from maxtext.grpo.loss import logprob_gate
from maxtext.grpo import mlperf_header
from maxtext.grpo.rollout import generation_mesh
from maxtext.grpo.rollout import pending_rollout
from maxtext.grpo.loss import policy_loss
from maxtext.grpo.tasks import progression_task
from maxtext.grpo.tasks import prompts as prompts_lib
from maxtext.grpo.rewards import rewards as rewards_lib
from maxtext.generation import paged_decoder
from maxtext.grpo.rollout import rollout as rollout_lib
from maxtext.grpo.rollout import rollout_batches
from maxtext.grpo.rollout import rollout_source
from maxtext.grpo.loss import train_loss
from maxtext.grpo.rollout import episode_rollout
from maxtext.grpo.tasks import text_task
from maxtext.metrics import recorder as metrics_recorder
from maxtext.mllog import workload_header
from maxtext.model import transformer
from maxtext.generation import sampling
from maxtext.runtime import device_memory
from maxtext.runtime import mesh as mesh_lib


def loss_options(settings: grpo_config.GrpoConfig) -> policy_loss.LossOptions:
  """The policy loss's options from GRPO's settings."""
  return settings.loss.options()


def batch_shardings(
    settings: grpo_config.GrpoConfig, rows_2d: jax.sharding.NamedSharding
) -> dict:
  """The GRPO micro-batch's shardings: every leaf split by rows.

  Args:
    settings: GRPO's settings (which leaves the micro-batch carries: the
      loss's, packing).
    rows_2d: the pretraining batch's sharding (rows split, columns whole).
  """
  rows_1d = jax.sharding.NamedSharding(
      rows_2d.mesh, jax.sharding.PartitionSpec(rows_2d.spec[0])
  )
  out = {
      "tokens": rows_2d,
      "prompt_lengths": rows_1d,
      "mask": rows_2d,
      "old_log_probs": rows_2d,
      "advantages": rows_1d,
      "sequence_mask": rows_1d,
      "token_normaliser": rows_1d,
      "sequence_normaliser": rows_1d,
  }
  if settings.loss.grpo_beta > 0:
    out["ref_log_probs"] = rows_2d
  if settings.loss.grpo_logprob_error_threshold:  # `logprob_gate`'s fields.
    out.update({name: rows_1d for name in logprob_gate.ADDED})
  if settings.packing:  # `packed_batches`: the packed rows' layout.
    out.update(segment_ids=rows_2d, positions=rows_2d, completion_at=rows_2d)
  return out


def engine_factory(settings: grpo_config.GrpoConfig, mesh):
  """run_state's engine factory: the model with the GRPO loss.

  Args:
    settings: GRPO's settings, the attempt's (`GrpoConfig.with_seed`): the
      engine's set-up (the model's, the optimizer's, the seed) and the
      loss's.
    mesh: the training mesh.

  Returns:
    (engine, its model setup).
  """
  setup = model_setup.setup_model(settings.engine.model, mesh)
  params = model_setup.init_params(settings.engine, setup)
  if settings.loss.grpo_freeze_router:
    logging.info(
        "GRPO: the MoE router is frozen (%d parameter arrays).",
        frozen_router.count(params),
    )
  return make_engine(settings, setup, params), setup


def make_engine(
    settings: grpo_config.GrpoConfig, setup, params
) -> engine_lib.Engine:
  """The engine training `params` (arrays, or their shapes for an ahead-of-
  time compile: `train_compile`) with the GRPO loss of `settings` on
  `setup`'s mesh."""
  engine = settings.engine
  optimizer = engine.optimizer
  schedule = optimizer_lib.make_schedule(optimizer)
  freeze = settings.loss.grpo_freeze_router
  return engine_lib.Engine(
      functools.partial(
          train_loss.loss_fn,
          config=engine.model,
          options=loss_options(settings),
          mesh=setup.mesh,
          freeze_router=freeze,
      ),
      params,
      model_setup.make_optimizer(
          optimizer,
          schedule,
          decay_mask=(
              frozen_router.decay_mask(transformer.weight_decay_mask)
              if freeze
              else None
          ),
      ),
      schedule,
      metrics_recorder.MetricsRecorder(mode="train"),
      engine.gradient_accumulation_steps,
      param_shardings=setup.param_shardings,
      batch_sharding=batch_shardings(settings, setup.batch_sharding),
      grad_clip_norm=engine.grad_clip_norm,
      donate_state=engine.donate_state,
      compute_copy=functools.partial(
          transformer.gradient_copy, config=engine.model
      ),
  )


def abstract_micro_batch(
    settings: grpo_config.GrpoConfig,
) -> dict[str, jax.ShapeDtypeStruct]:
  """One unpacked GRPO micro-batch's shapes, the whole mesh's (the
  `rollout.micro_batches` layout): R = global_batch_size / K rows of
  W = grpo_prompt_length + grpo_max_completion_length tokens, L =
  grpo_max_completion_length completion columns.

  Raises:
    ValueError: settings.packing (a packed micro-batch's shapes depend on
      the rollout's lengths).
  """
  if settings.packing:
    raise ValueError(
        "config.packing=True: a packed GRPO micro-batch has no fixed shape "
        "to compile ahead of time; compile with packing=False"
    )
  rows = (
      settings.rollout.global_batch_size
      // settings.engine.gradient_accumulation_steps
  )
  completion = settings.grpo_max_completion_length
  width = settings.row_length
  i32, f32 = jax.numpy.int32, jax.numpy.float32
  out = {
      "tokens": jax.ShapeDtypeStruct((rows, width), i32),
      "prompt_lengths": jax.ShapeDtypeStruct((rows,), i32),
      "mask": jax.ShapeDtypeStruct((rows, completion), f32),
      "old_log_probs": jax.ShapeDtypeStruct((rows, completion), f32),
      "advantages": jax.ShapeDtypeStruct((rows,), f32),
      "sequence_mask": jax.ShapeDtypeStruct((rows,), f32),
      "token_normaliser": jax.ShapeDtypeStruct((rows,), f32),
      "sequence_normaliser": jax.ShapeDtypeStruct((rows,), f32),
  }
  if settings.loss.grpo_beta > 0:
    out["ref_log_probs"] = jax.ShapeDtypeStruct((rows, completion), f32)
  if settings.loss.grpo_logprob_error_threshold:
    out.update(
        {
            name: jax.ShapeDtypeStruct((rows,), f32)
            for name in logprob_gate.ADDED
        }
    )
  return out


def longest_context(settings: grpo_config.GrpoConfig) -> int:
  """Ids of the longest context a rollout's generation prefills: the
  built-in task's prompt (grpo_prompt_length); with grpo_task, a turn
  continues the whole conversation so far (the paged decoder prefills it
  anew each turn), which may hold all of an episode's grpo_prompt_length +
  grpo_max_completion_length tokens but the one the turn writes."""
  if not settings.grpo_task:
    return settings.grpo_prompt_length
  return settings.row_length - 1


def rollout_options(
    settings: grpo_config.GrpoConfig, step: int
) -> sampling.SamplingOptions:
  """The rollout's sampling at step `step` (seeded by (seed, step))."""
  return sampling.SamplingOptions(
      max_new_tokens=settings.grpo_max_completion_length,
      temperature=settings.grpo_temperature,
      top_k=settings.grpo_top_k,
      top_p=settings.grpo_top_p,
      seed=rollout_lib.step_seed(settings.seed, step),
      num_samples=settings.grpo_num_generations,
      stop_ids=settings.stop_ids,
  )


def _episode_options(
    settings: grpo_config.GrpoConfig, stop_ids, step: int
) -> sampling.SamplingOptions:
  return dataclasses.replace(rollout_options(settings, step), stop_ids=stop_ids)


def options_of_step(settings: grpo_config.GrpoConfig, episodes=None):
  """step -> the rollout's sampling; a text task's turns (`episodes`, its
  `episode_rollout.EpisodeSetup`) stop on its template's end of turn."""
  if episodes is None:
    return functools.partial(rollout_options, settings)
  return functools.partial(_episode_options, settings, episodes.chat.stop_ids)


def paged_options(
    settings: grpo_config.GrpoConfig,
) -> Optional[paged_decoder.EngineOptions]:
  """The rollout's paged decoder, or None for the static decoder."""
  if settings.grpo_decoder == "static":
    return None
  return paged_decoder.EngineOptions(
      num_slots=settings.grpo_decode_slots,
      page_size=settings.grpo_decode_page_size,
  )


def eval_options(settings: grpo_config.GrpoConfig) -> sampling.SamplingOptions:
  """The held-out eval's sampling: greedy (one sample) at temperature 0,
  else `RolloutConfig.eval_samples_per_prompt` samples of each prompt."""
  return sampling.SamplingOptions(
      max_new_tokens=settings.grpo_max_completion_length,
      temperature=settings.grpo_eval_temperature,
      top_p=settings.grpo_eval_top_p,
      seed=settings.seed,
      num_samples=settings.rollout.eval_samples_per_prompt(),
      stop_ids=settings.stop_ids,
  )


# `GrpoWorkload._generation` before `_generation_mesh` makes it.
_UNSET = object()


class GrpoWorkload(workload.Workload):
  """GRPO post-training (module docstring).

  Args:
    settings: GRPO's settings (`grpo_config.GrpoConfig.from_config` of the
      run's config, its input paths resolved), with every component's it
      builds; an attempt's are `settings.with_seed` of its seed
      (`RunSettings.seed`).
  """

  name = "grpo"

  def __init__(self, settings: grpo_config.GrpoConfig):
    super().__init__(self._engine)
    self.settings = settings
    self._rewards: list[rewards_lib.RewardFunction] = []
    # A text task's episodes (config.grpo_task), else None.
    self._episodes: Optional[episode_rollout.EpisodeSetup] = None
    self._source: Optional[rollout_source.RolloutSource] = None
    # `_generation_mesh`'s, once made (None: generation shares the
    # training devices).
    self._generation = _UNSET
    # grpo_max_age (`check`), and with 1 the encoded rollouts a restored
    # checkpoint holds (`pending_rollout`), until the source takes them.
    self._max_age = 0
    self._restored: dict[int, tuple] = {}

  def mesh_config(self, run: run_settings.RunSettings) -> mesh_lib.MeshConfig:
    """The training mesh's settings: `grpo_generation_devices` generate
    (`generation_mesh`), the rest train.

    Raises:
      ValueError: as `mesh.MeshConfig.validate`.
    """
    settings = dataclasses.replace(
        run.mesh, generation_devices=self.settings.grpo_generation_devices
    )
    settings.validate()
    return settings

  def _engine(self, seed: int, mesh):
    """The engine builder (`workload.EngineBuilder`): the model with the
    GRPO loss, initialised with the attempt's `seed`."""
    return engine_factory(self.settings.with_seed(seed), mesh)

  @property
  def reads_ahead(self) -> bool:
    """Whether rollouts are drawn one update ahead (grpo_max_age 1; the
    source's `draws_ahead`)."""
    return self._max_age >= 1

  def check(self) -> None:
    settings = self.settings
    self._max_age = settings.grpo_max_age
    if settings.grpo_task:
      self._episodes = text_task.episode_setup(settings.task)
    # A text task's verifier may be its whole reward: no function needed.
    if settings.grpo_task and not settings.grpo_reward_functions.strip():
      self._rewards = []
    else:
      self._rewards = rewards_lib.load(
          settings.grpo_reward_functions, settings.grpo_reward_timeout_seconds
      )
    if not settings.grpo_task:
      prompts_lib.make_task(settings.task)
    loss_options(settings)

  def check_devices(self, run: run_settings.RunSettings, mesh) -> None:
    """Refuses paged decoder settings whose pool or page book cannot fit
    the generation devices or the host (`decode_footprint.check`)."""
    del run  # The pool's sizes are GRPO's and the model's fields.
    device = jax.local_devices()[0]
    decode_footprint.check(
        self.settings.rollout,
        devices=self.settings.grpo_generation_devices or mesh.devices.size,
        device_bytes=device_memory.bytes_limit(device),
        host_bytes=device_memory.host_bytes(),
        pool_on_host=device.platform == "cpu",
        processes=jax.process_count(),
    )

  def make_dataset(
      self, run: run_settings.RunSettings, process_index, process_count
  ):
    # Every process holds the same prompts: each scores the whole rollout.
    del process_index, process_count
    settings = self.settings.with_seed(run.seed).task
    if self._episodes is not None:
      prompts = text_task.TaskDataset(
          settings, self._episodes.task, self._episodes.chat
      )
    else:
      prompts = prompts_lib.PromptDataset(settings)
    if not self.reads_ahead:
      return prompts
    return pending_rollout.WithPendingRollout(
        prompts, self._pending_state, self._restore_pending
    )

  def row_length(self) -> int:
    # Throughput counts the trained rows: prompt plus completion.
    return self.settings.row_length

  def start(self, state) -> dict[str, float]:
    """Builds the rollouts' source and evaluates the starting parameters."""
    settings = self.settings.with_seed(state.settings.seed)
    reference = (
        frozen_reference.load(
            state,
            functools.partial(model_setup.init_params, settings.engine),
            source=settings.engine.load_parameters_path,
            allow_change=settings.grpo_allow_reference_change,
        )
        if settings.loss.grpo_beta > 0
        else None
    )
    self._source = rollout_source.RolloutSource(
        self._rollout_batches(state, reference),
        updates_per_batch=settings.grpo_num_iterations,
        max_age=settings.grpo_max_age,
        start_step=state.start_step,
        steps=state.settings.steps,
        restored=self._restored,
    )
    self._restored = {}
    # The eval's programs compile here, before the timed region.
    values = self._pass_rates(state)
    logging.info(
        "GRPO eval of the starting parameters (step %d): %s",
        state.start_step,
        values,
    )
    return values

  def _rollout_batches(
      self, state, reference
  ) -> rollout_batches.RolloutBatches:
    """What makes the run's rollouts into micro-batches (its prompts, its
    sampling, its rewards, the reference or None, its decoder)."""
    run = state.settings
    settings = self.settings.with_seed(run.seed)
    return rollout_batches.RolloutBatches(
        state.engine,
        settings.engine.model,
        lambda rollout: state.dataset.get_batch(rollout)["prompts"].tolist(),
        options_of_step(settings, self._episodes),
        self._rewards,
        num_micro_batches=run.gradient_accumulation_steps,
        width=settings.row_length,
        estimator=settings.grpo_advantage_estimator,
        advantage_eps=settings.grpo_advantage_eps,
        reference_params=reference,
        mesh=state.setup.mesh,
        overlong_filtering=settings.grpo_overlong_filtering,
        rollout_fn=(
            rollout_lib.rollout
            if self._episodes is None
            else functools.partial(
                episode_rollout.rollout, setup=self._episodes
            )
        ),
        packing=settings.packing,
        paged=paged_options(settings),
        record_age=self.reads_ahead,
        generation=self._generation_mesh(state),
        logprob_error_threshold=loss_options(settings).logprob_error_threshold,
    )

  def batch_source(self, state) -> rollout_source.RolloutSource:
    del state  # Built by `start`.
    return self._source

  def warm_up(self, state) -> float:
    """One update on the first rollout's shapes, drawn with placeholder
    reward functions, discarded: parameters, optimizer state, step counter
    and recorder end as they were; the reward functions' worker process
    started (its imports are not the first step's)."""
    if state.start_step >= state.settings.steps:
      return 0.0
    start = time.perf_counter()
    for worker in self._reward_workers():
      worker.start()
    engine = state.engine
    batches = self._source.warm_up_batches(
        state.start_step, batch_source.Policy(engine.params, engine.step)
    )
    warmup.discarded_steps(engine, batches, 1)
    return time.perf_counter() - start

  def _pending_state(self, step: int) -> Optional[dict]:
    """The encoded rollout that feeds update `step` (checkpoint of `step`
    updates done), or None when none was drawn."""
    if self._source is None:
      return None
    return self._source.pending_state(step)

  def _restore_pending(self, value: dict) -> None:
    """Keeps a restored checkpoint's rollout for the rollouts' source.

    Raises:
      ValueError: the saved rollout is malformed (one line).
    """
    index, rollout, versions = pending_rollout.decode(value)
    self._restored[index] = (rollout, versions)

  def evaluate(self, state) -> dict[str, eval_metrics.EvalMetric]:
    values = self._pass_rates(state)
    return {
        name: eval_metrics.EvalMetric(
            value, eval_metrics.Direction.HIGHER_IS_BETTER
        )
        for name, value in values.items()
    }

  def target(self, run: run_settings.RunSettings) -> eval_metrics.Target:
    # pass@1, or grouped pass@k of grpo_eval_samples_per_prompt samples:
    # MLPerf's eval_accuracy.
    del run  # GRPO's own settings name it.
    return eval_metrics.Target(
        self.settings.grpo_eval_target_metric,
        self.settings.grpo_target_pass_rate or None,
    )

  def mlperf_header(self) -> workload_header.WorkloadHeader:
    # GRPO's own settings hold what its log states.
    return mlperf_header.header(self.settings.mlperf)

  def _reward_workers(self) -> set:
    """The worker processes the reward functions run in (none in-process)."""
    return {f.worker for f in self._rewards if f.worker is not None}

  def close(self) -> None:
    """Stops the reward functions' worker process and the tool executor's
    pool."""
    for worker in self._reward_workers():
      worker.close()
    if self._episodes is not None and self._episodes.executor is not None:
      self._episodes.executor.close()

  def _generation_mesh(self, state) -> Optional[generation_mesh.GenerationMesh]:
    """The devices generation has to itself (`generation_mesh.make`), made
    once per workload; None when it shares the training devices."""
    if self._generation is _UNSET:
      self._generation = generation_mesh.make(
          self.settings.rollout,
          self.mesh_config(state.settings),
      )
    return self._generation

  def _pass_rates(self, state) -> dict[str, float]:
    """The held-out prompts' pass rates under the current parameters
    (generated on the generation mesh where the run has one)."""
    params, mesh = state.engine.params, state.setup.mesh
    settings = self.settings.with_seed(state.settings.seed)
    generation = self._generation_mesh(state)
    if generation is not None:
      params, _ = generation.copy(params)
      mesh = generation.mesh
    if self._episodes is not None:
      return episode_rollout.evaluate(
          params,
          settings.engine.model,
          self._episodes,
          dataclasses.replace(
              eval_options(settings),
              stop_ids=self._episodes.chat.stop_ids,
          ),
          self._rewards,
          paged=paged_options(settings),
          mesh=mesh,
      )
    return evaluation.evaluate(
        params,
        settings.engine.model,
        state.dataset.get_eval_batch(0)["prompts"].tolist(),
        eval_options(settings),
        progression_task.exact_match,
        engine=paged_options(settings),
        mesh=mesh,
    )
