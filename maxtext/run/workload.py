"""What a kind of training supplies to the one training loop: `Workload`.

`trainer.run(config)` is the only training loop. It owns everything every
run needs: config checks, `jax.distributed`, the run state (mesh, run
directory and its lock, outputs, checkpoints, resume checks), warm-up before
`run_start`, the step (K `engine.fwd_bwd` calls and one `engine.update()`,
whose single flush carries the step's metrics), the records, evaluation on
`eval_schedule`, checkpoints between steps, SIGTERM/SIGINT stops, the
non-finite skip guard, a checkpoint when an output fails, and the run's end.

A workload supplies only what differs between kinds of training:

  check            its own config checks, before any device work
  mesh_config      the training mesh's settings (`mesh.MeshConfig`): the
                   config's parallelism, and the devices a GRPO run keeps
                   for generation
  engine_factory   its engine: the model with its loss
  make_dataset     where a step's inputs come from (a data set, or prompts
                   a rollout turns into micro-batches)
  row_length       tokens per trained row, for the throughput figures
  start            what it builds once the run state exists (a frozen
                   reference, a rollout producer) and an optional eval of
                   the starting parameters
  warm_up          compiles every program of a step before `run_start`
  batches          a step's micro-batches on the devices; `reads_ahead`
                   says whether step s + 1's may be read before step s's
                   update (a data set: yes; a rollout of the current
                   policy: no; GRPO's rollout drawn one update ahead,
                   grpo_max_age 1: yes, with the parameters before it)
  updates_per_batch
                   optimizer updates fed by one batch (GRPO's
                   `grpo_num_iterations`); evals, checkpoints and stops
                   fall only between batches
  finish_record    completes a step's flushed record on the host: values
                   measured there, how its metrics reduce over micro-batches
  evaluate/target  its eval metrics and the one that ends a run
  mlperf_header    what its MLPerf log states beyond the config's (a GRPO
                   run's sequences, samples, sampling and target)
  keeps_state_on   errors of user code (a reward function) after which the
                   loop checkpoints the last completed step before raising
  close            releases what it holds (a reward worker process)

`Pretraining` is the language-model workload; `maxtext/workloads.py` maps a
config's `workload` field to each workload. A new kind of training (DPO,
say) is a subclass with its loss, its batches and its eval, and one entry
there; it inherits every guarantee of the loop.
"""

from typing import Optional

import ml_collections

from maxtext.data import data_config
from maxtext.data import dataset as dataset_lib
from maxtext.data import dataset_kinds
from maxtext.core import eval_metrics
from maxtext.engine import model_setup
from maxtext.mllog import workload_header
from maxtext.run import warmup
from maxtext.runtime import mesh as mesh_lib


class RefusedStart(ValueError):
  """The workload refuses to start this run (`Workload.start`), for a reason
  found only once the run state exists (e.g. a GRPO run's KL reference is
  not the one its first attempt pinned); one line, like a config error."""


class Workload:
  """The language-model (pretraining) workload; the base of every other.

  Attributes:
    name: the workload's name (the config's `workload` field).
    reads_ahead: whether the loop may read step s + 1's batches while step
      s runs on the devices.
    reads_parameters: whether reading batches reads the engine's
      parameters (a rollout drawn with them): the loop then reads ahead
      before step s's last micro-batch, which takes its update, so the
      batches see the parameters before update s.
    keeps_state_on: exception types after which the loop checkpoints the
      last completed step, then lets the error go on.
  """

  name = "pretraining"
  reads_ahead = True
  reads_parameters = False
  keeps_state_on: tuple[type[BaseException], ...] = ()

  def check(self, config: ml_collections.ConfigDict) -> None:
    """The workload's own checks of a validated config (no device work).

    Raises:
      ValueError/TypeError: one line naming the field and the value.
    """
    del config

  def mesh_config(self, config) -> mesh_lib.MeshConfig:
    """The training mesh's settings: the config's, every device trains
    (only GRPO's workload gives devices to generation).

    Raises:
      ValueError: as `mesh.MeshConfig.validate`.
    """
    return mesh_lib.MeshConfig.from_config(config)

  def check_devices(self, config, mesh) -> None:
    """The workload's checks that need the devices (the training `mesh`;
    nothing allocated), before the run's directory is opened.

    Raises:
      ValueError/TypeError: one line naming the field and the value.
    """
    del config, mesh

  def engine_factory(self, config, mesh):
    """`(config, mesh) -> (engine, ModelSetup)`: the model with its loss."""
    return model_setup.build_engine(config, mesh)

  def make_dataset(
      self, config, process_index: int, process_count: int
  ) -> dataset_lib.Dataset:
    """This process's share of the run's inputs (`config.dataset_type`)."""
    return dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(config), process_index, process_count
    )

  def row_length(self, config) -> Optional[int]:
    """Tokens per trained row; None = `max_sequence_length`."""
    del config  # Pretraining's rows are max_sequence_length long.

  def updates_per_batch(self, config) -> int:
    """Optimizer updates each batch feeds (1: one batch, one update)."""
    del config
    return 1

  def start(self, state) -> Optional[dict[str, float]]:
    """Called once the run state is built, before the warm-up.

    Returns:
      The starting parameters' eval metrics (name -> value) when the
      workload evaluates them, else None.

    Raises:
      RefusedStart: the run may not start (one line; the trainer's
        ConfigError).
    """
    del state  # Pretraining evaluates on the eval schedule only.

  def warm_up(self, state) -> float:
    """Compiles a step's programs before `run_start`; returns seconds.

    Pretraining runs `warmup_steps_before_run_start` throw-away steps (by
    default one when the MLPerf log is on, else none): `warmup.warm_up`.
    """
    config = state.config
    if state.start_step >= config.steps:
      return 0.0  # Nothing left to train.
    steps = config.warmup_steps_before_run_start
    if steps < 0:
      steps = 1 if config.enable_mllog else 0
    return warmup.warm_up(state, steps)

  def batches(self, state, step: int) -> tuple[list, float]:
    """Step `step`'s micro-batches on the devices, and the seconds spent
    waiting for their inputs; ([], 0.0) past the last step."""
    return state.device_batches(step)

  def finish_record(self, step: int, record) -> None:
    """Completes step `step`'s flushed record (a `MetricsBuffer`) on the
    host: values measured there, and `aggregation_fns` for metrics that are
    not means over the micro-batches. Pretraining's record is complete."""
    del step, record  # Every pretraining metric comes from the engine.

  def evaluate(self, state) -> dict[str, eval_metrics.EvalMetric]:
    """The eval's metrics: the mean eval loss over `eval_steps` batches."""
    return state.evaluate()

  def target(self, config) -> eval_metrics.Target:
    """The eval metric that ends the run once it reaches its threshold."""
    return eval_metrics.target(config)

  def mlperf_header(self, config) -> Optional[workload_header.WorkloadHeader]:
    """What the run's MLPerf log states beyond the config's; None = the
    config's own (pretraining's)."""
    del config

  def close(self) -> None:
    """Releases what the workload holds (processes, files) once the run
    ended or failed; pretraining's data set closes with the run state."""
