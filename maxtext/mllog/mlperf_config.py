"""The MLPerf log's settings: `MlperfConfig`, the config's fields of its names
(`maxtext/core/component_config.py`).

Every module of `maxtext/mllog/` reads a run's settings from one
`MlperfConfig`: the log's own fields (whether it is on, its file, the cache
flush, the ruleset and the submission fields), and the run's facts its
header states (`hyperparameters.run_hyperparameters`) and its pre-flight
checks (`mlperf_preflight`): the batch, the model's precisions and experts,
the parallelism, the data set, the evaluation schedule and target, and the
optimizer's settings whole (`optimizer`, for its schedule). The fields of
other packages are declared here again; their values come from the same
config, and their owners' checks (`config_lib.validate`) judge them.

What a workload's log says differently (a GRPO run's sequences, samples
and target) is not read from here: the workload states it
(`workload_header.WorkloadHeader`).
"""

import dataclasses

from maxtext.config import optimizer as optimizer_lib
from maxtext.core import component_config


@dataclasses.dataclass(frozen=True)
class MlperfConfig(component_config.ComponentConfig):
  """What the MLPerf log reads (`maxtext/configs/base.py` documents each
  field).

  Attributes:
    enable_mllog: write the log (process 0 only); off = no work.
    mllog_file: the first attempt's log, a local path; "" = in the run
      directory.
    cache_clear_command: every host's cache flush before the run; "" = the
      default (`cache_flush`).
    mllog_ruleset: the training ruleset the log follows.
    submission_org, submission_platform, submission_division,
      submission_status, submission_benchmark: the submission events
      (`rules.validate_submission` checks them).
    mllog_train_samples: the logged `train_samples`; 0 = the run's own.
    steps, global_batch_size, gradient_accumulation_steps,
      max_sequence_length, seed: the run's budget and batch.
    compute_dtype, weight_dtype: the precisions the header discloses.
    num_experts, load_balance_loss_weight: a model with experts logs its
      load-balancing weight as `moe_aux_loss_coeff`.
    data_parallelism, tensor_parallelism, context_parallelism,
      expert_parallelism: the parallelism the header discloses.
    dataset_type, train_data_path, eval_data_path, eval_steps,
      eval_batch_size, megatron_eval_samples: the data the logged samples
      count (`hyperparameters.train_samples_of`, `eval_set`).
    eval_interval, first_eval_samples, target_eval_loss, deferred_eval:
      where the run evaluates, its target, and whether the evaluation is
      deferred (`deferred_log`).
    optimizer: the optimizer's settings, for the logged schedule and the
      reference convergence points.
  """

  enable_mllog: bool = False
  mllog_file: str = ""
  cache_clear_command: str = ""
  mllog_ruleset: str = "6.1.0"
  submission_org: str = "maxtext-engine"
  submission_platform: str = "cpu"
  submission_division: str = "open"
  submission_status: str = "onprem"
  submission_benchmark: str = "llama31_8b"
  mllog_train_samples: int = 0
  steps: int = 1000
  global_batch_size: int = 16
  gradient_accumulation_steps: int = 1
  max_sequence_length: int = 64
  seed: int = 0
  compute_dtype: str = "float32"
  weight_dtype: str = "float32"
  num_experts: int = 0
  load_balance_loss_weight: float = 0.01
  data_parallelism: int = -1
  tensor_parallelism: int = 1
  context_parallelism: int = 1
  expert_parallelism: int = 1
  dataset_type: str = "synthetic"
  train_data_path: str = ""
  eval_data_path: str = ""
  eval_steps: int = 4
  eval_batch_size: int = 16
  megatron_eval_samples: int = 0
  eval_interval: int = 100
  first_eval_samples: int = 0
  target_eval_loss: float = 0.0
  deferred_eval: bool = False
  optimizer: optimizer_lib.OptimizerConfig = dataclasses.field(
      default_factory=optimizer_lib.OptimizerConfig
  )

  def validate(self) -> None:
    """The log's local fields (the submission fields: `rules`)."""
    if self.mllog_train_samples < 0:
      raise component_config.fail(
          "mllog_train_samples", self.mllog_train_samples, "must be >= 0"
      )
    command = self.cache_clear_command
    if "\0" in command or (command and not command.strip()):
      raise component_config.fail(
          "cache_clear_command",
          command,
          "must be '' (the default flush) or a shell command",
      )
    if self.mllog_file.startswith("gs://"):
      raise component_config.fail(
          "mllog_file",
          self.mllog_file,
          "must be a local path: the log is staged locally and mirrored to "
          "gs:// with the run directory when base_output_directory is gs://",
      )

  def submission(self) -> dict[str, str]:
    """The submission events' values, by their log key (each also the
    field's name), in the order the log writes them."""
    return {
        "submission_org": self.submission_org,
        "submission_platform": self.submission_platform,
        "submission_division": self.submission_division,
        "submission_status": self.submission_status,
        "submission_benchmark": self.submission_benchmark,
    }
