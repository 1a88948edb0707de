"""The data set kinds a config can name: `config.dataset_type` -> data set.

One table for every kind, so the built-in data sets
(`maxtext/data/builtin_datasets.py`) and the Grain one never know each other:
this module sits above both.

  "synthetic"    `builtin_datasets.SyntheticDataset`: arithmetic progressions.
  "tokens_file"  `builtin_datasets.TokensFileDataset`: memory-mapped token
                 files.
  "grain"        `grain_dataset.GrainDataset`: prepared text shards
                 through Grain, read in step order with iterator state.
  "chat"         `text.chat_dataset.ChatDataset`: chat examples (JSONL of
                 messages) rendered with a chat template, one padded row
                 each, weighted on the assistant's tokens (fine-tuning).
  "megatron"     `text.megatron_dataset.MegatronDataset`: Megatron indexed
                 datasets (.idx/.bin), blended by weight.
"""

from typing import Callable

from maxtext.data import builtin_datasets
from maxtext.data import data_config
from maxtext.data import dataset
from maxtext.data import packing

# (settings, process_index, process_count) -> this process's data set.
Factory = Callable[[data_config.DataConfig, int, int], dataset.Dataset]


def _grain(
    settings: data_config.DataConfig, process_index: int, process_count: int
):
  # Imported here: Grain is needed only by runs that read prepared text.
  # pylint: disable-next=import-outside-toplevel
  from maxtext.data import grain_dataset

  return grain_dataset.GrainDataset(settings, process_index, process_count)


def _chat(
    settings: data_config.DataConfig, process_index: int, process_count: int
):
  # Imported here: Jinja and the tokenizer are needed only by chat runs.
  # pylint: disable-next=import-outside-toplevel
  from maxtext.data import chat_dataset

  return chat_dataset.ChatDataset(settings, process_index, process_count)


def _megatron(
    settings: data_config.DataConfig, process_index: int, process_count: int
):
  # Imported here, as Grain is: only runs that read Megatron files need it.
  # pylint: disable-next=import-outside-toplevel
  from maxtext.data import megatron_dataset

  return megatron_dataset.MegatronDataset(
      settings, process_index, process_count
  )


KINDS: dict[str, Factory] = {
    "synthetic": builtin_datasets.SyntheticDataset,
    "tokens_file": builtin_datasets.TokensFileDataset,
    "grain": _grain,
    "chat": _chat,
    "megatron": _megatron,
}


def make_dataset(
    settings: data_config.DataConfig,
    process_index: int = 0,
    process_count: int = 1,
) -> dataset.Dataset:
  """The data set that `config.dataset_type` names, for one process.

  Args:
    settings: the data settings (`dataset_type` and the fields its data
      set reads).
    process_index: this process's index.
    process_count: processes sharing each global batch.

  With `config.packing` a pretraining data set read from a token stream
  ("tokens_file", "grain", "megatron") restarts its rows at each document
  (`packing.PackedDocuments`): after each `config.eod_id`, or for "grain"
  its metadata's eod_id when eod_id is -1. ("chat" packs its examples
  itself; "synthetic" rows are one sequence each.)

  Raises:
    ValueError: an unknown dataset_type, packing a token stream with no
      end-of-document id, and as the data set constructors.
  """
  factory = KINDS.get(settings.dataset_type)
  if factory is None:
    *others, last = [repr(k) for k in KINDS]
    raise ValueError(
        f"dataset_type={settings.dataset_type!r}: must be "
        f"{', '.join(others)} or {last}"
    )
  eod_id = settings.eod_id
  streamed = settings.dataset_type in packing.STREAM_KINDS
  if streamed and settings.packing and eod_id < 0:
    if settings.dataset_type != "grain":
      raise ValueError(
          f"packing=True with dataset_type={settings.dataset_type!r} needs "
          "config.eod_id, the end-of-document id that ends each document"
      )
  data = factory(settings, process_index, process_count)
  if not (streamed and settings.packing):
    return data
  if eod_id < 0:
    eod_id = int(data.metadata["eod_id"])
  return packing.PackedDocuments(data, eod_id)
