"""Training and eval data: batches as NumPy arrays, addressed by step.

Every batch is a pure function of (config, step): no iterator state exists, so
a resumed run sees exactly the data order of an uninterrupted one. Each process
builds only its own rows of the global batch: rows
[process_index * B_local, (process_index + 1) * B_local) with
B_local = global batch size / process_count.

Batches are dicts {"inputs": int32 [B_local, S], "targets": int32 [B_local, S]}
with S = config.max_sequence_length and targets[:, t] = the token after
inputs[:, t].

Two `dataset.Dataset`s live here (`maxtext/data/dataset_kinds.py` maps each
`config.dataset_type` to its data set, the Grain text pipeline included):
  * "synthetic": `SyntheticDataset`, arithmetic progressions modulo the
    vocabulary, learnable to a loss near 0.
  * "tokens_file": `TokensFileDataset`, memory-mapped token files.
"""

import errno
import hashlib
import math
import os
import stat
from typing import Sequence

import numpy as np

from maxtext.core import checks
from maxtext.core import choices
from maxtext.data import data_config
from maxtext.data import dataset
from maxtext.data import packing

Batch = dataset.Batch

# Common differences of the synthetic progressions. After two tokens the
# difference is known, so only the first prediction of a sequence stays
# uncertain (log(len(SYNTHETIC_STEPS)) nats).
SYNTHETIC_STEPS = (1, 2, 3, 5)

# Stream ids that keep the train and eval random streams apart.
_TRAIN_STREAM = 0
_EVAL_STREAM = 1

# Raw token files (".bin") hold little-endian uint16 token ids, no header.
RAW_TOKEN_DTYPE = np.dtype("<u2")

# A tokens file's content fingerprint: SHA-256 of the file's size and of
# _FINGERPRINT_BLOCKS blocks of _FINGERPRINT_BLOCK_BYTES at evenly spaced
# offsets, first and last block included (the whole file when it is smaller
# than the blocks together). At most 1 MiB is read whatever the file's size,
# so every resume can afford it on a file of hundreds of GiB; the size
# catches any change of length, and the blocks (the .npy header among them)
# a file regenerated from other text or with another tokenizer. An edit
# that keeps the length and misses every block is not seen.
_FINGERPRINT_BLOCKS = 16
_FINGERPRINT_BLOCK_BYTES = 64 * 1024


def _local_rows(
    global_batch: int, process_index: int, process_count: int, name: str
) -> slice:
  """The slice of global batch rows that one process owns."""
  if not checks.is_int(process_count) or process_count < 1:
    raise ValueError(
        f"process_count must be a positive int, got " f"{process_count!r}"
    )
  if not checks.is_int(process_index) or not (
      0 <= process_index < process_count
  ):
    raise ValueError(
        f"process_index must be in [0, {process_count}), got "
        f"{process_index!r}"
    )
  if global_batch % process_count:
    raise ValueError(
        f"{name}={global_batch} is not divisible by the process "
        f"count {process_count}"
    )
  local = global_batch // process_count
  return slice(process_index * local, (process_index + 1) * local)


def process_shares(
    settings: data_config.DataConfig, process_index: int, process_count: int
):
  """(train batch, eval batch, train rows, eval rows) of one process."""
  return (
      settings.global_batch_size,
      settings.eval_batch_size,
      _local_rows(
          settings.global_batch_size,
          process_index,
          process_count,
          "global_batch_size",
      ),
      _local_rows(
          settings.eval_batch_size,
          process_index,
          process_count,
          "eval_batch_size",
      ),
  )


def check_index(value: int, name: str) -> int:
  if not checks.is_int(value) or value < 0:
    raise ValueError(f"{name} must be a non-negative int, got {value!r}")
  return int(value)


def to_batch(windows: np.ndarray) -> Batch:
  """[B, S + 1] token windows -> inputs/targets int32 [B, S]."""
  windows = windows.astype(np.int32)
  return {"inputs": windows[:, :-1], "targets": windows[:, 1:]}


def split_micro_batches(batch: Batch, num_micro_batches: int) -> list[Batch]:
  """Splits a batch along its first axis into equal micro-batches.

  Args:
    batch: dict of arrays that share the leading dimension B.
    num_micro_batches: K >= 1, a divisor of B.

  Returns:
    K dicts with the same keys, arrays [B / K, ...], in row order.

  Raises:
    ValueError: if K is not a positive int dividing B, or the arrays disagree
      on B.
  """
  if not checks.is_int(num_micro_batches) or num_micro_batches < 1:
    raise ValueError(
        f"num_micro_batches must be a positive int, got "
        f"{num_micro_batches!r}"
    )
  if not batch:
    raise ValueError("batch is empty")
  sizes = {key: np.shape(value)[0] for key, value in batch.items()}
  if len(set(sizes.values())) != 1:
    raise ValueError(f"batch arrays disagree on the batch dimension: {sizes}")
  size = next(iter(sizes.values()))
  if size % num_micro_batches:
    raise ValueError(
        f"batch size {size} is not divisible by "
        f"num_micro_batches={num_micro_batches}"
    )
  micro = size // num_micro_batches
  return [
      {key: value[i * micro : (i + 1) * micro] for key, value in batch.items()}
      for i in range(num_micro_batches)
  ]


class SyntheticDataset(dataset.Dataset):
  """Arithmetic progressions modulo the vocabulary, deterministic by seed.

  Each sequence is (a + d * t) mod vocab_size for t = 0..S, with a start `a`
  uniform over the vocabulary and a difference `d` drawn from SYNTHETIC_STEPS.
  A model that reads the last two tokens predicts every token after the first
  exactly, so the attainable mean loss is log(len(SYNTHETIC_STEPS)) / S.

  Train batch `step` and eval batch `i` come from separate random streams
  seeded by (config.seed, stream, index); the global batch is drawn whole and
  each process keeps its rows, so the data does not depend on the process
  count.
  """

  def __init__(
      self,
      settings: data_config.DataConfig,
      process_index: int = 0,
      process_count: int = 1,
  ):
    """Creates the dataset.

    Args:
      settings: the data settings (vocab_size, max_sequence_length, seed,
        global_batch_size, eval_batch_size).
      process_index: this process's index.
      process_count: number of processes sharing each global batch.

    Raises:
      ValueError: if a batch size is not divisible by process_count, or the
        process arguments are out of range.
    """
    self._vocab = settings.vocab_size
    self._seq = settings.max_sequence_length
    self._seed = settings.seed
    self._train_batch, self._eval_batch, self._train_rows, self._eval_rows = (
        process_shares(settings, process_index, process_count)
    )

  def _windows(self, stream: int, index: int, batch: int) -> np.ndarray:
    rng = np.random.default_rng([self._seed, stream, index])
    starts = rng.integers(0, self._vocab, size=(batch, 1))
    steps = rng.choice(np.asarray(SYNTHETIC_STEPS), size=(batch, 1))
    positions = np.arange(self._seq + 1)[None, :]
    return (starts + steps * positions) % self._vocab

  def get_batch(self, step: int) -> Batch:
    """This process's rows of the training batch of global step `step`."""
    step = check_index(step, "step")
    windows = self._windows(_TRAIN_STREAM, step, self._train_batch)
    return to_batch(windows[self._train_rows])

  def get_eval_batch(self, index: int) -> Batch:
    """This process's rows of eval batch `index` (eval_batch_size rows)."""
    index = check_index(index, "index")
    windows = self._windows(_EVAL_STREAM, index, self._eval_batch)
    return to_batch(windows[self._eval_rows])


def _fail(name: str, path: str, problem: str) -> ValueError:
  """A token file error in the config's words: `config.<name>=<path>: ...`."""
  return ValueError(f"config.{name}={path!r}: {problem}")


def _npy_layout(
    f, size: int, path: str, name: str
) -> tuple[np.dtype, tuple[int, ...], int]:
  """Reads a .npy header without reading the array (and never unpickling).

  Args:
    f: the file, open in binary mode at its start.
    size: the file's size in bytes.
    path: its path, for messages.
    name: the config field that names it, for messages.

  Returns:
    (dtype, shape, offset of the data).

  Raises:
    ValueError: the header is malformed, the array holds Python objects,
      is not stored in C order, or the file is shorter than its header says.
  """
  try:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
      shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
      shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
    else:
      raise ValueError(
          f"unsupported format version {version[0]}." f"{version[1]}"
      )
  except (ValueError, SyntaxError, TypeError) as e:
    # np.load would try to unpickle a file without the magic string and
    # report "pickled data"; the file is simply not a .npy file.
    detail = " ".join(str(e).split())  # One line, whatever NumPy says.
    raise _fail(name, path, f"malformed .npy file: {detail}") from None
  if dtype.hasobject:
    raise _fail(
        name,
        path,
        "malformed .npy file: it holds Python objects "
        "(a pickled array), not token ids",
    )
  offset = f.tell()
  count = math.prod(shape)
  needed = offset + count * dtype.itemsize
  if size < needed:
    raise _fail(
        name,
        path,
        f"malformed .npy file: truncated: its header "
        f"says shape {shape} of {dtype} ({needed} bytes with the "
        f"header), the file has {size} bytes",
    )
  del fortran_order  # One order for the 1-D arrays accepted.
  return dtype, shape, offset


def _open_tokens(path: str, name: str) -> np.ndarray:
  """Memory-maps a 1-D integer token file (.npy, or raw uint16 .bin).

  Only the header is read (nothing is unpickled, no token is loaded), so a
  bad file is found at once, before any training: by `TokensFileDataset` and
  by `check_token_files`.

  Args:
    path: the file, as the config names it.
    name: the config field naming it ("train_data_path", "eval_data_path").

  Returns:
    The tokens, a read-only memory-mapped 1-D integer array.

  Raises:
    ValueError: `config.<name>=<path>: <problem>` for a missing, unreadable,
      empty, malformed or non-integer file, or one that is not a regular
      file.
  """
  if not path:
    raise ValueError(f"{name} is required for dataset_type='tokens_file'")
  size = _token_file_size(path, name)
  dtype, shape, offset = _token_layout(path, name, size)
  if not np.issubdtype(dtype, np.integer):
    raise _fail(name, path, f"has dtype {dtype}; token ids must be integers")
  if len(shape) != 1:
    raise _fail(
        name,
        path,
        f"has shape {shape}; expected a flat 1-D array " "of token ids",
    )
  if shape[0] == 0:
    return np.zeros((0,), dtype)  # mmap cannot map zero bytes.
  try:
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
  except OSError as e:
    raise _fail(name, path, f"cannot be read: {e.strerror or e}") from None


def _token_file_size(path: str, name: str) -> int:
  """The size of the token file at `path`, checked to be a non-empty regular
  file named .npy or .bin.

  Raises:
    ValueError: as `_open_tokens`.
  """
  try:
    info = os.stat(path)
  except OSError as e:
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
      raise _fail(name, path, "does not exist") from None
    raise _fail(name, path, f"cannot be read: {e.strerror}") from None
  if not stat.S_ISREG(info.st_mode):
    # Checked before opening: opening a FIFO would wait for a writer.
    raise _fail(
        name, path, f"is {checks.file_kind(info.st_mode)}, not a token " "file"
    )
  if not path.endswith((".npy", ".bin")):
    raise _fail(
        name,
        path,
        "a token file must end in .npy (NumPy array) or "
        ".bin (raw little-endian uint16)",
    )
  size = info.st_size
  if size == 0:
    raise _fail(name, path, "is empty")
  return size


def _token_layout(
    path: str, name: str, size: int
) -> tuple[np.dtype, tuple[int, ...], int]:
  """The dtype, shape and data offset of the token file at `path` of `size`
  bytes, from its .npy header or its raw uint16 size.

  Raises:
    ValueError: as `_open_tokens`.
  """
  try:
    with open(path, "rb") as f:
      if path.endswith(".npy"):
        dtype, shape, offset = _npy_layout(f, size, path, name)
      else:
        if size % RAW_TOKEN_DTYPE.itemsize:
          raise _fail(
              name,
              path,
              f"raw token file has {size} bytes, not a "
              f"multiple of {RAW_TOKEN_DTYPE.itemsize} (uint16)",
          )
        dtype, shape, offset = RAW_TOKEN_DTYPE, (size // 2,), 0
  except OSError as e:
    raise _fail(name, path, f"cannot be read: {e.strerror or e}") from None
  return dtype, shape, offset


def _open_checked(settings: data_config.DataConfig, name: str) -> np.ndarray:
  """`_open_tokens` of `config.<name>`, long enough for one sequence."""
  path = settings.data_path(name)
  tokens = _open_tokens(path, name)
  needed = settings.max_sequence_length + 1
  if tokens.shape[0] < needed:
    raise _fail(
        name,
        path,
        f"holds {tokens.shape[0]} tokens; one sequence "
        f"needs max_sequence_length + 1 = {needed}",
    )
  return tokens


def check_token_files(settings: data_config.DataConfig) -> None:
  """Checks the tokens_file dataset's files as `TokensFileDataset` does.

  Reads only the files' headers and sizes. For `maxtext/run/preflight.py`: a
  bad file is reported before any device work.

  Args:
    settings: the data settings (dataset_type, train_data_path,
      eval_data_path, max_sequence_length).

  Raises:
    ValueError: `config.<field>=<path>: <problem>` for the first bad file.
  """
  if settings.dataset_type != "tokens_file":
    return
  for name in ("train_data_path", "eval_data_path"):
    _open_checked(settings, name)


def file_fingerprint(path: str) -> dict[str, object]:
  """{"path", "size", "sampled_sha256"} of a file (see _FINGERPRINT_BLOCKS)."""
  size = os.path.getsize(path)
  digest = hashlib.sha256(size.to_bytes(8, "little"))
  span = _FINGERPRINT_BLOCKS * _FINGERPRINT_BLOCK_BYTES
  with open(path, "rb") as f:
    if size <= span:
      digest.update(f.read())
    else:
      last = size - _FINGERPRINT_BLOCK_BYTES
      for i in range(_FINGERPRINT_BLOCKS):
        f.seek(last * i // (_FINGERPRINT_BLOCKS - 1))
        digest.update(f.read(_FINGERPRINT_BLOCK_BYTES))
  return {
      "path": os.path.abspath(path),
      "size": size,
      "sampled_sha256": digest.hexdigest(),
  }


# The provenance maps whose entries are `file_fingerprint`s, by config field:
# the tokens_file data set's and the chat data set's (text/chat_dataset.py).
_FINGERPRINT_GROUPS = ("tokens_files", "chat_files")


def changed_files(recorded, current) -> list[str]:
  """What differs between two data sets' `provenance()`s.

  Args:
    recorded: the data provenance an earlier attempt recorded (anything
      without a fingerprint group, e.g. None, compares as unchanged).
    current: this attempt's.

  Returns:
    One text per changed file: "config.<field>='<path>': <what changed>".
  """
  if not isinstance(recorded, dict) or not isinstance(current, dict):
    return []
  changes = []
  for group in _FINGERPRINT_GROUPS:
    old_files, new_files = recorded.get(group), current.get(group)
    if not isinstance(old_files, dict) or not isinstance(new_files, dict):
      continue
    for field, new in new_files.items():
      old = old_files.get(field)
      if old is None or new is None or old == new:
        continue
      if old["size"] != new["size"]:
        what = f"{old['size']} bytes recorded, {new['size']} now"
        if group == "chat_files" and field == "tokenizer_path":
          what = f"{old['size']} ids recorded, {new['size']} now"
      elif old["sampled_sha256"] != new["sampled_sha256"]:
        what = (
            f"same size, other content (sampled sha256 "
            f"{old['sampled_sha256'][:12]}... recorded, "
            f"{new['sampled_sha256'][:12]}... now)"
        )
      else:
        what = f"recorded as {old['path']!r}"
      changes.append(f"config.{field}={new['path']!r}: {what}")
  return changes


class TokensFileDataset(dataset.Dataset):
  """Windows of a memory-mapped token file, shuffled by data_shuffle_seed.

  File formats: a NumPy ".npy" file holding one 1-D array of any integer dtype,
  or a raw ".bin" file of little-endian uint16 token ids with no header. Token
  ids must be in [0, vocab_size); each batch is checked as it is read.

  The file is cut into W = (N - 1) // S windows of S + 1 tokens, window w being
  tokens[w * S : w * S + S + 1] (neighbours share one boundary token, so every
  token but the first is a target once). Training sample n (= step *
  global_batch_size + row) is window perm_e[n mod W] of epoch e = n // W, where
  perm_e is a permutation seeded by (data_shuffle_seed, e). Eval batches read
  the eval file's windows in order, wrapping around.
  """

  def __init__(
      self,
      settings: data_config.DataConfig,
      process_index: int = 0,
      process_count: int = 1,
  ):
    """Opens both token files and checks them.

    Args:
      settings: the data settings (train_data_path, eval_data_path,
        vocab_size, max_sequence_length, data_shuffle_seed, global_batch_size,
        eval_batch_size).
      process_index: this process's index.
      process_count: number of processes sharing each global batch.

    Raises:
      ValueError: for a missing, unreadable, empty, malformed or too short
        file, a bad dtype, or batch sizes not divisible by process_count; a
        file's message is `config.<field>=<path>: <problem>`.
    """
    self._vocab = settings.vocab_size
    self._seq = settings.max_sequence_length
    self._shuffle_seed = settings.data_shuffle_seed
    self._train_batch, self._eval_batch, self._train_rows, self._eval_rows = (
        process_shares(settings, process_index, process_count)
    )
    self._train_path = settings.train_data_path
    self._eval_path = settings.eval_data_path
    self._train = _open_checked(settings, "train_data_path")
    self._eval = _open_checked(settings, "eval_data_path")
    self._train_windows = (self._train.shape[0] - 1) // self._seq
    self._eval_windows = (self._eval.shape[0] - 1) // self._seq
    self._perm_cache: dict[int, np.ndarray] = {}

  def provenance(self) -> dict[str, object]:
    """Each token file's size and content fingerprint (`file_fingerprint`)."""
    return {
        "tokens_files": {
            "train_data_path": file_fingerprint(self._train_path),
            "eval_data_path": file_fingerprint(self._eval_path),
        }
    }

  @property
  def num_train_windows(self) -> int:
    """Training sequences per epoch."""
    return self._train_windows

  @property
  def num_eval_windows(self) -> int:
    """Distinct eval sequences."""
    return self._eval_windows

  def _permutation(self, epoch: int) -> np.ndarray:
    perm = self._perm_cache.get(epoch)
    if perm is None:
      rng = np.random.default_rng([self._shuffle_seed, epoch])
      perm = rng.permutation(self._train_windows)
      # A step touches at most two epochs; keep the two newest.
      if len(self._perm_cache) >= 2:
        self._perm_cache.pop(min(self._perm_cache))
      self._perm_cache[epoch] = perm
    return perm

  def _read(
      self, tokens: np.ndarray, window_ids: Sequence[int], path: str
  ) -> Batch:
    """The windows `window_ids` of `tokens` (read from `path`) as a batch."""
    windows = np.stack(
        [
            np.asarray(tokens[w * self._seq : w * self._seq + self._seq + 1])
            for w in window_ids
        ]
    )
    if windows.size and (windows.min() < 0 or windows.max() >= self._vocab):
      raise ValueError(
          f"token file {path!r} holds token ids outside [0, {self._vocab}) "
          f"(found {windows.min()}..{windows.max()}); check vocab_size"
      )
    return to_batch(windows)

  def get_batch(self, step: int) -> Batch:
    """This process's rows of the training batch of global step `step`."""
    step = check_index(step, "step")
    rows = range(self._train_batch)[self._train_rows]
    window_ids = []
    for row in rows:
      sample = step * self._train_batch + row
      epoch, offset = divmod(sample, self._train_windows)
      window_ids.append(int(self._permutation(epoch)[offset]))
    return self._read(self._train, window_ids, self._train_path)

  def get_eval_batch(self, index: int) -> Batch:
    """This process's rows of eval batch `index` (eval_batch_size rows)."""
    index = check_index(index, "index")
    rows = range(self._eval_batch)[self._eval_rows]
    window_ids = [
        (index * self._eval_batch + row) % self._eval_windows for row in rows
    ]
    return self._read(self._eval, window_ids, self._eval_path)


def placeholder_batches(
    settings: data_config.DataConfig,
    process_index: int = 0,
    process_count: int = 1,
) -> tuple[Batch, Batch]:
  """(train batch, eval batch) of zeros with this process's real shapes.

  For compiling and warming up the step before a run starts: they have the
  shapes, dtypes and keys of `get_batch` and `get_eval_batch` (float32
  "weights" too, for the kinds of `choices.WEIGHTED_DATASET_TYPES`, and
  "segment_ids" and "positions" for the kinds `packing` packs) without
  reading the data set (MLPerf forbids touching it before `run_start`).
  """
  train_rows, eval_rows = process_shares(
      settings, process_index, process_count
  )[2:]
  weighted = settings.dataset_type in choices.WEIGHTED_DATASET_TYPES
  packed = settings.packing

  def zeros(rows: slice, kinds: tuple[str, ...]) -> Batch:
    batch = to_batch(
        np.zeros(
            (rows.stop - rows.start, settings.max_sequence_length + 1), np.int32
        )
    )
    if weighted:
      batch["weights"] = np.zeros(batch["targets"].shape, np.float32)
    if packed and settings.dataset_type in kinds:
      batch["segment_ids"] = np.zeros(batch["targets"].shape, np.int32)
      batch["positions"] = np.zeros(batch["targets"].shape, np.int32)
    return batch

  return (
      zeros(train_rows, packing.PACKED_TRAIN_KINDS),
      zeros(eval_rows, packing.STREAM_KINDS),
  )
