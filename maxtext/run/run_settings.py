"""What the training loop reads of a run's config: `RunSettings`.

The loop (`trainer`, `run_state`, `deferred_eval`) and the workloads' shared
part take this frozen bundle, never the run's `ConfigDict`: the loop's own
fields (the budget, the outputs' periods, the profiler, the run directory's
lock and GCS timeouts, the resume's switches), and the settings of every
component it builds, whole (the run directory's, checkpointing's, the
MLPerf log's, the data's, the mesh's, the throughput figures', the
distributed runtime's, the eval schedule's). The caller that holds the
config (`maxtext/workloads.py`) builds it once, after the config's checks,
with `record`: the config's values by field name, which the run's record
(config.json, the resume's comparison) keeps whole by its purpose.

A run's seed may be drawn at its first attempt (`seed` -1) and is then the
recorded one: `with_seed` gives the attempt's settings, the seed set in
every component that holds one and in the record.
"""

import dataclasses
import types
from typing import Any, Mapping

from maxtext.config import eval_schedule as eval_schedule_lib
from maxtext.core import checks
from maxtext.core import component_config
from maxtext.data import data_config
from maxtext.metrics import throughput as throughput_lib
from maxtext.mllog import mlperf_config
from maxtext.runtime import distributed as distributed_lib
from maxtext.runtime import mesh as mesh_lib
from maxtext.storage import checkpoint_config
from maxtext.storage import run_dir as run_dir_lib


@dataclasses.dataclass(frozen=True)
class RunSettings(component_config.ComponentConfig):
  """The loop's settings (module docstring; `maxtext/configs/base.py`
  documents each field, `config_lib.validate` checks them)."""

  run_name: str = ""
  seed: int = 0
  steps: int = 1000
  global_batch_size: int = 16
  gradient_accumulation_steps: int = 1
  max_consecutive_skipped_steps: int = 5
  eval_steps: int = 4
  deferred_eval: bool = False
  target_eval_loss: float = 0.0
  warmup_steps_before_run_start: int = -1
  log_period: int = 10
  profiler_start_step: int = 3
  profiler_steps: int = 0
  progress_interval_s: float = 30.0
  # The resume's switches.
  resume: bool = False
  start_over: bool = False
  allow_data_change: bool = False
  # The run directory's lock and its GCS mirror.
  run_lock_refresh_interval_seconds: float = 60.0
  gcs_request_timeout_seconds: float = 60.0
  gcs_sync_interval_seconds: float = 30.0
  gcs_startup_timeout_seconds: float = 20.0
  gcs_final_timeout_seconds: float = 300.0
  # Where JAX runs.
  hardware: str = "auto"
  allow_cpu_fallback: bool = False
  jax_compilation_cache_dir: str = ""
  # The components the loop builds, whole.
  run_dir: run_dir_lib.RunDirConfig = dataclasses.field(
      default_factory=run_dir_lib.RunDirConfig
  )
  checkpoint: checkpoint_config.CheckpointConfig = dataclasses.field(
      default_factory=checkpoint_config.CheckpointConfig
  )
  mlperf: mlperf_config.MlperfConfig = dataclasses.field(
      default_factory=mlperf_config.MlperfConfig
  )
  data: data_config.DataConfig = dataclasses.field(
      default_factory=data_config.DataConfig
  )
  mesh: mesh_lib.MeshConfig = dataclasses.field(
      default_factory=mesh_lib.MeshConfig
  )
  batch: mesh_lib.BatchLayout = dataclasses.field(
      default_factory=mesh_lib.BatchLayout
  )
  throughput: throughput_lib.ThroughputConfig = dataclasses.field(
      default_factory=throughput_lib.ThroughputConfig
  )
  distributed: distributed_lib.DistributedConfig = dataclasses.field(
      default_factory=distributed_lib.DistributedConfig
  )
  eval_schedule: eval_schedule_lib.EvalSchedule = dataclasses.field(
      default_factory=eval_schedule_lib.EvalSchedule
  )
  # The config's values by field name (given by the caller): the run's
  # record, written to config.json and compared with the recorded one,
  # never the source of a setting.
  record: Mapping[str, Any] = dataclasses.field(
      default_factory=lambda: types.MappingProxyType({})
  )

  def with_seed(self, seed: int) -> "RunSettings":
    """The attempt's settings: `seed` (the resolved one,
    `run_record.resolve_seed`) in these, in each component that holds a
    seed (the data's, the MLPerf log's; `run_settings_test` checks there
    is no other), and in the record.

    Raises:
      ValueError: `seed` is not an int >= 0.
    """
    seed = checks.check_int("seed", seed, 0)
    return dataclasses.replace(
        self,
        seed=seed,
        data=dataclasses.replace(self.data, seed=seed),
        mlperf=dataclasses.replace(self.mlperf, seed=seed),
        record=types.MappingProxyType(dict(self.record, seed=seed)),
    )
