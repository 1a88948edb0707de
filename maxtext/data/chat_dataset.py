"""dataset_type="chat": chat examples (JSONL of messages) for fine-tuning.

`train_data_path` and `eval_data_path` are JSONL files, one example per
line: {"messages": [{"role": "system"|"user"|"assistant"|"tool",
"content": "..."}, ...]}, with an optional "tools": [tool JSON schemas]
that the template renders as an episode's prompt renders its
environment's tools (other keys of a line are ignored). Each example is
rendered with the chat template of the tokenizer directory `tokenizer_path`
("" = the tokenizer files `tools/import_checkpoint` copied beside
`load_parameters_path`'s checkpoint) by `maxtext/text/chat.py` into ids and
the assistant's tokens.

One example is one row, padded (no packing): inputs = ids[:-1], targets =
ids[1:], weights[t] = 1 where targets[t] is an assistant token, else 0; the
padding (id 0) has weight 0. `transformer.loss_fn` averages over the weighted
tokens, so the loss is the assistant's tokens' mean cross entropy and the
prompt's tokens carry no gradient. An example longer than
max_sequence_length + 1 tokens is refused, not truncated: a cut example
loses the end of a reply and its end-of-turn token, the one the model learns
to stop with.

With `packing`, a training row holds several examples one after another
(`maxtext.data.packing`: segment ids and positions, so each example's loss
is its own alone): an epoch's permuted examples are taken in blocks of
`PACK_BLOCK` and each block is packed first-fit into rows; training row n
is the n-th row of that sequence of rows over the epochs, so a step holds
as many examples as its rows fit and the batches are still a function of
the step. Eval batches stay one example per row.

Every line is read, checked, rendered and tokenized when the data set is
built (and by `check_config` in the pre-flight, before any device work): a
bad line is one error naming the file and the line. The encoded examples of
a file are kept in memory (a few bytes per token), cached by file identity
so the pre-flight's work is not repeated.

Training sample n (= step * global_batch_size + row) is example
perm_e[n mod N] of epoch e = n // N, perm_e a permutation seeded by
(data_shuffle_seed, e): the batches are a function of the step, so a resume
reads what an uninterrupted run would, with no state to checkpoint. Eval
batch i holds eval examples (i * eval_batch_size + row) mod M, in file order.
"""

import collections
import dataclasses
import json
import os
from typing import Any

import numpy as np

from maxtext.core import caller_paths
from maxtext.data import builtin_datasets
from maxtext.data import data_config
from maxtext.data import dataset
from maxtext.data import packing
from maxtext.text import chat

Batch = dataset.Batch

_FIELDS = ("train_data_path", "eval_data_path")
# Encoded files kept (train and eval of a run, and one more).
_CACHE_SIZE = 3
_cache: collections.OrderedDict[tuple, "Examples"] = collections.OrderedDict()
# Examples packed together, first-fit, with packing on.
PACK_BLOCK = 256


def _fail(field: str, value: str, problem: str) -> ValueError:
  return ValueError(f"config.{field}={value!r}: {problem}")


def tokenizer_directory(tokenizer_path: str, load_parameters_path: str) -> str:
  """The directory whose tokenizer files render the examples.

  `tokenizer_path`, else the checkpoint directory `load_parameters_path`
  names (the directory above it when it names a step), where the import
  copies the model's tokenizer files.

  Raises:
    ValueError: neither is set.
  """
  if tokenizer_path:
    return caller_paths.resolve_local_path(tokenizer_path)
  path = load_parameters_path.rstrip("/")
  if not path:
    raise _fail(
        "tokenizer_path",
        "",
        "dataset_type='chat' needs a tokenizer with a chat template: set "
        "tokenizer_path, or load_parameters_path to an imported checkpoint "
        "whose tokenizer files are beside it",
    )
  if os.path.basename(path).isdigit() and not os.path.isfile(
      os.path.join(path, chat.TOKENIZER_FILE)
  ):
    path = os.path.dirname(path)
  return caller_paths.resolve_local_path(path)


def load_tokenizer(settings: data_config.DataConfig) -> chat.ChatTokenizer:
  """`chat.ChatTokenizer.load` of the config's tokenizer directory, checked
  against the model's vocabulary and, when `tokenizer_path` names a
  directory, against the tokenizer files of load_parameters_path's
  checkpoint (a model fine-tuned with another tokenizer than its own reads
  ids that mean other text).

  Raises:
    ValueError: one line naming the field.
  """
  directory = tokenizer_directory(
      settings.tokenizer_path, settings.load_parameters_path
  )
  field = (
      "tokenizer_path" if settings.tokenizer_path else "load_parameters_path"
  )
  try:
    tokenizer = chat.ChatTokenizer.load(directory)
  except ValueError as e:
    raise _fail(field, directory, str(e)) from None
  if tokenizer.vocab_size > settings.vocab_size:
    raise ValueError(
        f"config.vocab_size={settings.vocab_size}: smaller than the "
        f"vocabulary of {field}={directory!r} ({tokenizer.vocab_size} ids)"
    )
  if settings.tokenizer_path and settings.load_parameters_path:
    imported = tokenizer_directory("", settings.load_parameters_path)
    if os.path.isfile(os.path.join(imported, chat.TOKENIZER_FILE)):
      try:
        theirs = chat.ChatTokenizer.load(imported)
      except ValueError:
        theirs = None  # Tokenizer files without a chat template.
      if theirs is not None and theirs.fingerprint != tokenizer.fingerprint:
        raise _fail(
            "tokenizer_path",
            settings.tokenizer_path,
            "its tokenizer or chat template differs from the one imported "
            "beside load_parameters_path="
            f"{settings.load_parameters_path!r} ({imported}); set "
            "tokenizer_path='' to use the checkpoint's",
        )
  return tokenizer


@dataclasses.dataclass(frozen=True)
class Examples:
  """One file's encoded examples.

  Attributes:
    ids: each example's token ids, int32 [n_i].
    masks: each example's assistant mask, bool [n_i].
  """

  ids: list[np.ndarray]
  masks: list[np.ndarray]

  @property
  def tokens(self) -> int:
    return sum(len(i) for i in self.ids)

  @property
  def assistant_tokens(self) -> int:
    return int(sum(m.sum() for m in self.masks))


def _read_examples(
    field: str, path: str, tokenizer: chat.ChatTokenizer, row_tokens: int
) -> Examples:
  """Reads, checks and encodes every line of a chat JSONL file (`path` as
  the config names it; read from the caller's directory)."""
  if not path:
    raise _fail(field, path, "is required when dataset_type='chat'")
  local = caller_paths.resolve_local_path(path)
  if not os.path.isfile(local):
    raise _fail(
        field,
        path,
        "does not exist" if not os.path.exists(local) else "is not a file",
    )
  ids, masks = [], []
  try:
    with open(local, encoding="utf-8") as f:
      for number, line in enumerate(f, start=1):
        if not line.strip():
          continue  # Blank lines (a trailing newline) are not examples.
        where = f"line {number}"
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise _fail(
              field, path, f"{where}: not JSON ({e.msg} at column {e.colno})"
          ) from None
        if not isinstance(record, dict) or "messages" not in record:
          raise _fail(field, path, f'{where}: not an object with "messages"')
        try:
          encoded = tokenizer.encode(
              record["messages"], tools=record.get("tools")
          )
        except ValueError as e:
          raise _fail(field, path, f"{where}: {e}") from None
        if len(encoded.ids) > row_tokens:
          raise _fail(
              field,
              path,
              f"{where}: {len(encoded.ids)} tokens rendered; a row holds "
              f"max_sequence_length + 1 = {row_tokens} (examples are "
              "refused, not truncated)",
          )
        if encoded.ids.size and int(encoded.ids.max()) < 0:
          raise _fail(field, path, f"{where}: negative token id")
        ids.append(encoded.ids)
        masks.append(encoded.assistant_mask)
  except UnicodeDecodeError as e:
    raise _fail(
        field, path, f"not UTF-8 text ({e.reason} at byte {e.start})"
    ) from None
  except OSError as e:
    raise _fail(field, path, f"cannot be read: {e.strerror or e}") from None
  if not ids:
    raise _fail(field, path, "holds no example")
  return Examples(ids, masks)


def load_examples(
    settings: data_config.DataConfig, field: str, tokenizer: chat.ChatTokenizer
) -> Examples:
  """The encoded examples of `config.<field>`, from the cache when the file,
  the tokenizer and the row length are those of an earlier read.

  Raises:
    ValueError: `config.<field>=<path>: line <n>: <problem>` for the first
      bad line, or a missing, unreadable or empty file.
  """
  path = settings.data_path(field)
  row_tokens = settings.max_sequence_length + 1
  local = caller_paths.resolve_local_path(path) if path else ""
  try:
    info = os.stat(local) if local else None
  except OSError:
    info = None
  key = (
      local,
      (info.st_size, info.st_mtime_ns, info.st_ino) if info else None,
      tokenizer.fingerprint,
      row_tokens,
  )
  if info is not None and key in _cache:
    _cache.move_to_end(key)
    return _cache[key]
  examples = _read_examples(field, path, tokenizer, row_tokens)
  _cache[key] = examples
  while len(_cache) > _CACHE_SIZE:
    _cache.popitem(last=False)
  return examples


def check_config(settings: data_config.DataConfig) -> None:
  """The pre-flight of a chat run: the tokenizer and every line of both
  files, as the data set reads them (nothing for other kinds).

  Raises:
    ValueError: one line naming the field (and the line of a bad example).
  """
  if settings.dataset_type != "chat":
    return
  tokenizer = load_tokenizer(settings)
  for field in _FIELDS:
    load_examples(settings, field, tokenizer)


def _rows(examples: Examples, indices, seq: int) -> Batch:
  """Padded rows of the examples `indices`: inputs, targets, weights."""
  inputs = np.zeros((len(indices), seq), np.int32)
  targets = np.zeros((len(indices), seq), np.int32)
  weights = np.zeros((len(indices), seq), np.float32)
  for row, index in enumerate(indices):
    ids, mask = examples.ids[index], examples.masks[index]
    n = len(ids) - 1
    inputs[row, :n] = ids[:-1]
    targets[row, :n] = ids[1:]
    weights[row, :n] = mask[1:]
  return {"inputs": inputs, "targets": targets, "weights": weights}


def _packed_rows(examples: Examples, rows, seq: int) -> Batch:
  """Rows of several examples each (`rows`: the example indices of each),
  with "segment_ids" and "positions" beside inputs, targets, weights."""
  lengths = {i: len(examples.ids[i]) - 1 for row in rows for i in row}
  inputs = np.zeros((len(rows), seq), np.int32)
  targets = np.zeros((len(rows), seq), np.int32)
  weights = np.zeros((len(rows), seq), np.float32)
  segment_ids = np.zeros((len(rows), seq), np.int32)
  positions = np.zeros((len(rows), seq), np.int32)
  for r, members in enumerate(rows):
    column = 0
    for segment, i in enumerate(members, start=1):
      ids, mask, n = examples.ids[i], examples.masks[i], lengths[i]
      span = slice(column, column + n)
      inputs[r, span] = ids[:-1]
      targets[r, span] = ids[1:]
      weights[r, span] = mask[1:]
      segment_ids[r, span] = segment
      positions[r, span] = np.arange(n)
      column += n
    positions[r, column:] = np.arange(seq - column)
  return {
      "inputs": inputs,
      "targets": targets,
      "weights": weights,
      "segment_ids": segment_ids,
      "positions": positions,
  }


class ChatDataset(dataset.Dataset):
  """Chat examples, one padded row each, loss on the assistant's tokens."""

  def __init__(
      self,
      settings: data_config.DataConfig,
      process_index: int = 0,
      process_count: int = 1,
  ):
    """Reads and encodes both files.

    Args:
      settings: the data settings (train_data_path, eval_data_path,
        tokenizer_path, load_parameters_path, vocab_size,
        max_sequence_length, data_shuffle_seed, global_batch_size,
        eval_batch_size).
      process_index: this process's index.
      process_count: processes sharing each global batch.

    Raises:
      ValueError: as `check_config`, or batch sizes not divisible by the
        process count.
    """
    self._seq = settings.max_sequence_length
    self._shuffle_seed = settings.data_shuffle_seed
    self._train_batch, self._eval_batch, self._train_rows, self._eval_rows = (
        builtin_datasets.process_shares(settings, process_index, process_count)
    )
    self.tokenizer = load_tokenizer(settings)
    self._tokenizer_dir = tokenizer_directory(
        settings.tokenizer_path, settings.load_parameters_path
    )
    self._paths = {
        field: caller_paths.resolve_local_path(settings.data_path(field))
        for field in _FIELDS
    }
    self.train = load_examples(settings, "train_data_path", self.tokenizer)
    self.eval = load_examples(settings, "eval_data_path", self.tokenizer)
    self._perm_cache: dict[int, np.ndarray] = {}
    self._packing = bool(settings.packing)
    self._epoch_rows: dict[int, list[list[int]]] = {}

  def provenance(self) -> dict[str, Any]:
    """The files' fingerprints (`builtin_datasets.file_fingerprint`), the
    tokenizer's (its files and template, `ChatTokenizer.fingerprint`), and
    counts."""
    files = {
        field: builtin_datasets.file_fingerprint(path)
        for field, path in self._paths.items()
    }
    files["tokenizer_path"] = {
        "path": os.path.abspath(self._tokenizer_dir),
        "size": self.tokenizer.vocab_size,
        "sampled_sha256": self.tokenizer.fingerprint,
    }
    return {
        "chat_files": files,
        "chat_examples": {
            "train": len(self.train.ids),
            "eval": len(self.eval.ids),
            "train_tokens": self.train.tokens,
            "train_assistant_tokens": self.train.assistant_tokens,
        },
    }

  def _permutation(self, epoch: int) -> np.ndarray:
    perm = self._perm_cache.get(epoch)
    if perm is None:
      rng = np.random.default_rng([self._shuffle_seed, epoch])
      perm = rng.permutation(len(self.train.ids))
      if len(self._perm_cache) >= 2:
        self._perm_cache.pop(min(self._perm_cache))
      self._perm_cache[epoch] = perm
    return perm

  def train_indices(self, step: int) -> list[int]:
    """The examples of this process's rows of step `step`'s batch."""
    step = builtin_datasets.check_index(step, "step")
    indices = []
    for row in range(self._train_batch)[self._train_rows]:
      sample = step * self._train_batch + row
      epoch, offset = divmod(sample, len(self.train.ids))
      indices.append(int(self._permutation(epoch)[offset]))
    return indices

  def epoch_rows(self, epoch: int) -> list[list[int]]:
    """With packing: epoch `epoch`'s packed rows, each its example
    indices (the module docstring)."""
    rows = self._epoch_rows.get(epoch)
    if rows is None:
      perm = self._permutation(epoch)
      rows = []
      for begin in range(0, len(perm), PACK_BLOCK):
        block = perm[begin : begin + PACK_BLOCK]
        lengths = [len(self.train.ids[i]) - 1 for i in block]
        rows += [
            [int(block[j]) for j in row]
            for row in packing.first_fit(lengths, self._seq)
        ]
      if len(self._epoch_rows) >= 2:
        self._epoch_rows.pop(min(self._epoch_rows))
      self._epoch_rows[epoch] = rows
    return rows

  def packed_rows(self, step: int) -> list[list[int]]:
    """With packing: the example indices of each of this process's rows of
    step `step`'s batch."""
    step = builtin_datasets.check_index(step, "step")
    out = []
    for row in range(self._train_batch)[self._train_rows]:
      n, epoch = step * self._train_batch + row, 0
      while n >= len(self.epoch_rows(epoch)):
        n -= len(self.epoch_rows(epoch))
        epoch += 1
      out.append(self.epoch_rows(epoch)[n])
    return out

  def get_batch(self, step: int) -> Batch:
    """This process's rows of the training batch of global step `step`."""
    if self._packing:
      return _packed_rows(self.train, self.packed_rows(step), self._seq)
    return _rows(self.train, self.train_indices(step), self._seq)

  def get_eval_batch(self, index: int) -> Batch:
    """This process's rows of eval batch `index` (eval_batch_size rows)."""
    index = builtin_datasets.check_index(index, "index")
    rows = range(self._eval_batch)[self._eval_rows]
    indices = [
        (index * self._eval_batch + row) % len(self.eval.ids) for row in rows
    ]
    return _rows(self.eval, indices, self._seq)
