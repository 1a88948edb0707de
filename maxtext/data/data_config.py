"""The data sets' settings: `DataConfig`, the config's fields of its names
(`maxtext/core/component_config.py`).

Every data set kind (`maxtext.data.dataset_kinds`) reads its files, its
batch shapes and its order from one `DataConfig`; `config_lib.validate`
checks these fields (it sits below this package) and the pre-flight checks
the files they name.
"""

import dataclasses

from maxtext.core import component_config

# The fields that name a data file, by the split they hold.
DATA_PATH_FIELDS = ("train_data_path", "eval_data_path")


@dataclasses.dataclass(frozen=True)
class DataConfig(component_config.ComponentConfig):
  """What a run's data set reads (`maxtext/configs/base.py` documents each
  field).

  Attributes:
    dataset_type: the data set kind (`dataset_kinds.KINDS`).
    train_data_path, eval_data_path: the training and held-out data.
    tokenizer_path, load_parameters_path: where a chat data set's tokenizer
      and chat template are (the checkpoint's, when tokenizer_path is "").
    vocab_size: token ids are in [0, vocab_size).
    max_sequence_length: tokens of a row (plus one for the targets).
    seed: the synthetic data's seed.
    data_shuffle_seed: the order of a file's rows.
    global_batch_size, eval_batch_size: rows of a batch, all processes.
    packing: rows restart at each document of a token stream.
    eod_id: the end-of-document id; -1 = none (grain: its metadata's).
    grain_worker_count: Grain's reader processes.
    megatron_eval_samples, eval_steps: the Megatron validation set's size
      (0 = eval_steps * eval_batch_size).
  """

  dataset_type: str = "synthetic"
  train_data_path: str = ""
  eval_data_path: str = ""
  tokenizer_path: str = ""
  load_parameters_path: str = ""
  vocab_size: int = 256
  max_sequence_length: int = 64
  seed: int = 0
  data_shuffle_seed: int = 0
  global_batch_size: int = 16
  eval_batch_size: int = 16
  packing: bool = False
  eod_id: int = -1
  grain_worker_count: int = 0
  megatron_eval_samples: int = 0
  eval_steps: int = 4

  def data_path(self, field: str) -> str:
    """The value of `field`, one of `DATA_PATH_FIELDS`.

    Raises:
      KeyError: `field` names no data file.
    """
    if field not in DATA_PATH_FIELDS:
      raise KeyError(f"{field!r} is none of {DATA_PATH_FIELDS}")
    return getattr(self, field)
