"""dataset_type="grain": prepared text shards read with Grain, resumable.

`tools/prepare_data` writes each split as one stream of token ids (documents
with the end-of-document id between them, see `metadata`). The stream is cut
into W = (tokens - 1) // S windows of S + 1 tokens (S = max_sequence_length;
window w starts at token w * S). Documents run into each other inside a
window: the model has no segment ids, so attention crosses document
boundaries, and the end-of-document id tells the model where one ends.

Training sample n of the run is window perm_e[n mod W] of epoch e = n // W,
perm_e a permutation seeded by data_shuffle_seed + e (Grain's index shuffle).
Step s's global batch is samples s * G .. s * G + G - 1; process p of P reads
only samples s * G + r * P + p, r < G / P, so the processes together read
each global batch once and the data does not depend on P.

The trainer reads batches in order; the Grain iterator behind them is state.
`checkpoint_state(step)` returns the state from which `get_batch(step)` comes
next (the trainer reads a batch ahead of its checkpoints), and
`restore_checkpoint_state` puts it back, so a resumed run reads exactly the
batches an uninterrupted run would. Eval batch i is a pure function of i: the
eval split's windows in order, wrapping around.
"""

import collections
import os
from typing import Any, Optional

import grain
import numpy as np

from maxtext.core import checks
from maxtext.data import data_config
from maxtext.data import dataset
from maxtext.text import metadata as metadata_lib

Batch = dataset.Batch

# Batches Grain reads ahead of the trainer, per process.
_PREFETCH_BATCHES = 4
# Steps whose pre-read iterator state is kept for checkpoint_state: the
# trainer reads at most one step ahead of the step it saves.
_STATES_KEPT = 4


class WindowReader:
  """Reads windows of S + 1 tokens of one split's stream. Picklable (Grain
  worker processes get a copy and open the shards themselves)."""

  def __init__(
      self,
      data_dir: str,
      meta: dict[str, Any],
      split: str,
      sequence_length: int,
  ):
    self._paths = [
        os.path.join(data_dir, name) for name in meta["splits"][split]["shards"]
    ]
    self._dtype = np.dtype(meta["token_dtype"])
    self._record = meta["record_tokens"]
    self._seq = sequence_length
    self._source = None

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_source"] = None  # Each process opens its own readers.
    return state

  def _open(self):
    if self._source is None:
      self._source = grain.sources.ArrayRecordDataSource(self._paths)
    return self._source

  def __call__(self, window: int) -> np.ndarray:
    """Tokens [window * S, window * S + S + 1) as int32 [S + 1]."""
    start = int(window) * self._seq
    stop = start + self._seq + 1
    first, last = start // self._record, (stop - 1) // self._record
    source = self._open()
    records = [source[i] for i in range(first, last + 1)]
    stream = np.concatenate([np.frombuffer(r, self._dtype) for r in records])
    offset = start - first * self._record
    return stream[offset : offset + self._seq + 1].astype(np.int32)


def _to_batch(windows: np.ndarray) -> Batch:
  return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


def load_checked_metadata(
    settings: data_config.DataConfig,
) -> tuple[dict[str, Any], dict[str, Any], str]:
  """`metadata.check_config` of a grain config's fields."""
  return metadata_lib.check_config(
      settings.train_data_path,
      settings.eval_data_path,
      settings.vocab_size,
      settings.max_sequence_length,
  )


def _checked_processes(
    settings: data_config.DataConfig, process_index: int, process_count: int
) -> tuple[int, int]:
  """`(process_index, process_count)`, checked: an index within the count
  and both batch sizes divisible by the count.

  Raises:
    ValueError: naming the value that is not.
  """
  process_count = checks.check_int("process_count", process_count, 1)
  process_index = checks.check_int("process_index", process_index, 0)
  if process_index >= process_count:
    raise ValueError(
        f"process_index must be in [0, {process_count}), got "
        f"{process_index}"
    )
  for name, rows in (
      ("global_batch_size", settings.global_batch_size),
      ("eval_batch_size", settings.eval_batch_size),
  ):
    if rows % process_count:
      raise ValueError(
          f"{name}={rows} is not divisible by the "
          f"process count {process_count}"
      )
  return process_index, process_count


class GrainDataset(dataset.Dataset):
  """Prepared text shards through a Grain pipeline (see the module doc)."""

  def __init__(
      self,
      settings: data_config.DataConfig,
      process_index: int = 0,
      process_count: int = 1,
  ):
    """Opens the prepared data and builds the pipeline.

    Args:
      settings: the data settings (train_data_path, eval_data_path,
        vocab_size, max_sequence_length, data_shuffle_seed,
        global_batch_size, eval_batch_size, grain_worker_count).
      process_index: this process's index.
      process_count: processes sharing each global batch.

    Raises:
      ValueError: as `load_checked_metadata`, or batch sizes not divisible by
        the process count.
    """
    process_index, process_count = _checked_processes(
        settings, process_index, process_count
    )
    self._train_meta, self._eval_meta, eval_dir = load_checked_metadata(
        settings
    )
    self._data_dir = settings.train_data_path
    self._seq = settings.max_sequence_length
    self._seed = settings.data_shuffle_seed
    self._workers = settings.grain_worker_count
    self._index = process_index
    self._count = process_count
    self._local = settings.global_batch_size // process_count
    self._eval_local = settings.eval_batch_size // process_count
    self._eval_rows = range(
        process_index * self._eval_local, (process_index + 1) * self._eval_local
    )
    self._eval_batch = settings.eval_batch_size
    self._train_reader = WindowReader(
        self._data_dir, self._train_meta, "train", self._seq
    )
    self._eval_reader = WindowReader(
        eval_dir, self._eval_meta, "eval", self._seq
    )
    self.num_train_windows = metadata_lib.windows(
        self._train_meta, "train", self._seq
    )
    self.num_eval_windows = metadata_lib.windows(
        self._eval_meta, "eval", self._seq
    )
    self._iterator = None
    self._base_step = 0
    self._next_step = 0
    self._states: collections.OrderedDict[int, Any] = collections.OrderedDict()

  @property
  def metadata(self) -> dict[str, Any]:
    """The train data's metadata.json."""
    return self._train_meta

  def provenance(self) -> dict[str, Any]:
    """What config.json records about this run's data."""
    return metadata_lib.provenance(self._train_meta, self._data_dir)

  def _pipeline(self, base_step: int):
    """This process's batches from global step `base_step` on."""
    samples = (
        grain.MapDataset.range(self.num_train_windows)
        .shuffle(seed=self._seed)
        .repeat()
    )
    first = base_step * self._local * self._count + self._index
    local = samples[first :: self._count].map(self._train_reader)
    batches = local.batch(self._local, drop_remainder=True).map(
        lambda w: _to_batch(np.asarray(w))
    )
    iterable = batches.to_iter_dataset(
        grain.ReadOptions(
            num_threads=max(1, min(16, self._local)),
            prefetch_buffer_size=_PREFETCH_BATCHES * self._local,
        )
    )
    if self._workers:
      iterable = iterable.mp_prefetch(
          grain.MultiprocessingOptions(
              num_workers=self._workers,
              per_worker_buffer_size=_PREFETCH_BATCHES,
          )
      )
    return iterable

  def _start(self, base_step: int, grain_state: Optional[Any] = None):
    self._close_iterator()
    self._iterator = iter(self._pipeline(base_step))
    if grain_state is not None:
      self._iterator.set_state(grain_state)
    self._base_step = base_step
    self._states.clear()

  def _close_iterator(self) -> None:
    if self._iterator is not None and hasattr(self._iterator, "close"):
      self._iterator.close()
    self._iterator = None

  def get_batch(self, step: int) -> Batch:
    """This process's rows of the training batch of global step `step`.

    Steps are read in order. The first call may name any step: a run
    resumed from a checkpoint without iterator state starts the pipeline
    there (same batches: the order is a function of the sample index).

    Raises:
      ValueError: a step other than the next one.
    """
    step = checks.check_int("step", step, 0)
    if self._iterator is None:
      self._start(step)
      self._next_step = step
    if step != self._next_step:
      raise ValueError(
          f"step={step}: the grain dataset reads steps in "
          f"order; the next one is {self._next_step}"
      )
    self._states[step] = self._iterator.get_state()
    while len(self._states) > _STATES_KEPT:
      self._states.popitem(last=False)
    batch = next(self._iterator)
    self._next_step = step + 1
    return batch

  def checkpoint_state(self, step: int) -> dict[str, Any]:
    """The iterator state from which `get_batch(step)` is read next.

    For the checkpoint of `step` completed steps; a JSON-serialisable dict,
    one per process.

    Raises:
      ValueError: `step` is neither the next step nor one of the last few
        read.
    """
    step = checks.check_int("step", step, 0)
    if self._iterator is None or step == self._next_step:
      grain_state = (
          None if self._iterator is None else self._iterator.get_state()
      )
      base = self._base_step if self._iterator is not None else step
    elif step in self._states:
      grain_state, base = self._states[step], self._base_step
    else:
      raise ValueError(
          f"step={step}: no iterator state kept for it (next "
          f"step {self._next_step})"
      )
    return {
        "kind": "grain",
        "process_index": self._index,
        "process_count": self._count,
        "step": step,
        "base_step": base,
        "workers": self._workers,
        "tokenizer_sha256": self._train_meta["tokenizer"]["sha256"],
        "grain_state": _jsonable(grain_state),
    }

  def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
    """Puts back what `checkpoint_state` returned (this process's item).

    Raises:
      ValueError: the state was saved by another process count or index, or
        for data with another tokenizer.
    """
    if not isinstance(state, dict) or state.get("kind") != "grain":
      raise ValueError(
          f"data iterator state {state!r} is not a grain " "dataset's state"
      )
    if state["process_count"] != self._count:
      raise ValueError(
          f"the checkpoint's data iterator was saved by "
          f"{state['process_count']} process(es); this run has {self._count}. "
          "Resume with the same process count (each process's position in "
          "the data is its own)"
      )
    if state["process_index"] != self._index:
      raise ValueError(
          f"data iterator state of process "
          f"{state['process_index']} given to process "
          f"{self._index}"
      )
    if state["tokenizer_sha256"] != self._train_meta["tokenizer"]["sha256"]:
      raise ValueError(
          "the checkpoint's data iterator read data made by "
          "another tokenizer than config.train_data_path's"
      )
    if state.get("workers") != self._workers or state["grain_state"] is None:
      # Grain's state is shaped by the worker count; the batches are not
      # (they are a function of the sample index), so start afresh there.
      self._start(state["step"])
    else:
      self._start(state["base_step"], state["grain_state"])
    self._next_step = state["step"]

  def get_eval_batch(self, index: int) -> Batch:
    """This process's rows of eval batch `index` (eval_batch_size rows)."""
    index = checks.check_int("index", index, 0)
    windows = np.stack(
        [
            self._eval_reader(
                (index * self._eval_batch + row) % self.num_eval_windows
            )
            for row in self._eval_rows
        ]
    )
    return _to_batch(windows)

  def close(self) -> None:
    """Stops Grain's reader threads and worker processes."""
    self._close_iterator()


def _jsonable(value: Any) -> Any:
  """Grain states are dicts of ints and strings; bytes become latin-1."""
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if isinstance(value, np.integer):
    return int(value)
  return value
