"""What a kind of training supplies to the one training loop: `Workload`.

`trainer.run(settings, workload=...)` is the only training loop. It owns
everything every run needs: `jax.distributed`, the run state (mesh, run
directory and its lock, outputs, checkpoints, resume checks), warm-up before
`run_start`, the step (K `engine.fwd_bwd` calls on the micro-batches its
batch source gives and one `engine.update()`, whose single flush carries the
step's metrics), the records, evaluation on `eval_schedule`, checkpoints
between steps, SIGTERM/SIGINT stops, the non-finite skip guard, a checkpoint
when an output or user code fails (`batch_source.UserCodeError`), and the
run's end.

A workload is built by the caller that holds the run's config
(`maxtext/workloads.py`), with its own settings, and takes the loop's
(`run_settings.RunSettings`, the attempt's) where it needs them. It supplies
only what differs between kinds of training:

  check            its own checks beyond its settings' `validate`, before
                   any device work
  mesh_config      the training mesh's settings (`mesh.MeshConfig`): the
                   config's parallelism, and the devices a GRPO run keeps
                   for generation
  check_devices    its checks that need the devices
  engine_factory   its engine: the model with its loss (pretraining's from
                   the builder its caller gives: `EngineBuilder`)
  make_dataset     its inputs (a data set, or the prompts a rollout turns
                   into micro-batches)
  row_length       tokens per trained row, for the throughput figures
  start            what it builds once the run state exists (a frozen
                   reference, a rollout producer) and an optional eval of
                   the starting parameters
  batch_source     where each step's micro-batches come from
                   (`batch_source.BatchSource`: a data set's, or GRPO's
                   rollouts drawn with the engine's parameters)
  warm_up          compiles every program of a step before `run_start`
  evaluate/target  its eval metrics and the one that ends a run
  mlperf_header    what its MLPerf log states beyond the config's (a GRPO
                   run's sequences, samples, sampling and target)
  close            releases what it holds (a reward worker process)

`Workload` itself is the language-model (pretraining) workload;
`maxtext/workloads.py` maps a config's `workload` field to each workload,
which it builds with the workload's own settings (SFT's `SftConfig`, GRPO's
`GrpoConfig`), checked by their `validate` as they are built. A
new kind of training (DPO, say) is a subclass with its loss, its batch
source and its eval, and one entry there; it inherits every guarantee of the
loop, and a frozen reference policy from `maxtext/run/frozen_reference.py`.
"""

from typing import Any, Callable, Optional

import jax

from maxtext.data import dataset as dataset_lib
from maxtext.data import dataset_kinds
from maxtext.core import eval_metrics
from maxtext.mllog import workload_header
from maxtext.run import batch_source as batch_source_lib
from maxtext.run import run_settings
from maxtext.run import warmup
from maxtext.runtime import mesh as mesh_lib

# `(seed, mesh) -> (engine, model setup)`: the model with its loss on
# `mesh`, its parameters loaded or drawn from `seed` (the attempt's); the
# caller that holds the run's config makes it (`workloads.engine_builder`).
EngineBuilder = Callable[[int, jax.sharding.Mesh], tuple[Any, Any]]


class RefusedStart(ValueError):
  """The workload refuses to start this run (`Workload.start`), for a reason
  found only once the run state exists (e.g. a GRPO run's KL reference is
  not the one its first attempt pinned); one line, like a config error."""


class Workload:
  """The language-model (pretraining) workload; the base of every other.

  Args:
    build_engine: its engine's builder (`EngineBuilder`).

  Attributes:
    name: the workload's name (the config's `workload` field).
  """

  name = "pretraining"

  def __init__(self, build_engine: EngineBuilder):
    self._build_engine = build_engine

  def check(self) -> None:
    """The workload's own checks beyond its settings' (no device work).

    Raises:
      ValueError/TypeError: one line naming the field and the value.
    """

  def mesh_config(self, run: run_settings.RunSettings) -> mesh_lib.MeshConfig:
    """The training mesh's settings: the run's, every device trains (only
    GRPO's workload gives devices to generation).

    Raises:
      ValueError: as `mesh.MeshConfig.validate`.
    """
    return run.mesh

  def check_devices(
      self, run: run_settings.RunSettings, mesh: jax.sharding.Mesh
  ) -> None:
    """The workload's checks that need the devices (the training `mesh`;
    nothing allocated), before the run's directory is opened.

    Raises:
      ValueError/TypeError: one line naming the field and the value.
    """
    del run, mesh

  def engine_factory(
      self, run: run_settings.RunSettings, mesh: jax.sharding.Mesh
  ):
    """`(engine, ModelSetup)`: the model with its loss on `mesh`, its
    parameters drawn from the attempt's seed (or loaded)."""
    return self._build_engine(run.seed, mesh)

  def make_dataset(
      self,
      run: run_settings.RunSettings,
      process_index: int,
      process_count: int,
  ) -> dataset_lib.Dataset:
    """This process's share of the run's inputs (its `dataset_type`)."""
    return dataset_kinds.make_dataset(run.data, process_index, process_count)

  def row_length(self) -> Optional[int]:
    """Tokens per trained row; None = `max_sequence_length` (pretraining's
    rows)."""

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

  def batch_source(self, state) -> batch_source_lib.BatchSource:
    """Where the steps' micro-batches come from, called once `start`
    returned: the run's data set, read ahead."""
    return batch_source_lib.DatasetSource(state)

  def warm_up(self, state) -> float:
    """Compiles a step's programs before `run_start`; returns seconds.

    Pretraining runs `warmup_steps_before_run_start` throw-away steps (by
    default one when the MLPerf log is on, else none): `warmup.warm_up`.
    """
    run = state.settings
    if state.start_step >= run.steps:
      return 0.0  # Nothing left to train.
    steps = run.warmup_steps_before_run_start
    if steps < 0:
      steps = 1 if run.mlperf.enable_mllog else 0
    return warmup.warm_up(state, steps)

  def evaluate(self, state) -> dict[str, eval_metrics.EvalMetric]:
    """The eval's metrics: the mean eval loss over `eval_steps` batches."""
    return state.evaluate()

  def target(self, run: run_settings.RunSettings) -> eval_metrics.Target:
    """The eval metric that ends the run once it reaches its threshold."""
    return eval_metrics.target(run.target_eval_loss)

  def mlperf_header(self) -> Optional[workload_header.WorkloadHeader]:
    """What the run's MLPerf log states beyond the config's; None = the
    config's own (pretraining's)."""

  def close(self) -> None:
    """Releases what the workload holds (processes, files) once the run
    ended or failed; pretraining's data set closes with the run state."""
