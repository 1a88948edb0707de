"""dataset_type="megatron": Megatron indexed datasets, blended, resumable.

The MLPerf LLM references train on C4 tokenized into Megatron indexed
datasets (`maxtext/text/megatron_index.py`: a `.idx` index beside a `.bin`
of tokens, named by a path prefix). This data set reads them as they are.

Config:
  train_data_path  Megatron's data-path list: one prefix ("/data/c4_train"
                   for c4_train.idx + c4_train.bin), or weights and
                   prefixes alternating ("0.3 /data/a 0.7 /data/b"); the
                   weights need not sum to 1 (they are normalised).
  eval_data_path   the validation prefix (one).
  megatron_eval_samples
                   N: the eval set is the validation prefix's first N
                   sequences, in file order; 0 = eval_steps * eval_batch_size.
                   Every evaluation reads all N (config_lib asks
                   eval_steps * eval_batch_size == N).

Rows (Megatron-LM core's GPTDataset rule, add_extra_token_to_sequence on):
the sequences of a prefix, in index order, are one stream of T tokens; row
w is tokens [w * S, w * S + S + 1) with S = max_sequence_length, so
neighbouring rows share their boundary token and there are (T - 1) // S
rows. Documents are not separated here: an end-of-document id is in the
stream only where the preprocessing appended one (Megatron's
preprocess_data.py --append-eod); nothing is added on reading.

Training order: sample n of the blend (n = step * global_batch_size + row)
comes from prefix d = BLEND[n mod P] (P = BLEND_PERIOD) as that prefix's
m-th sample, m = (n div P) * count_d + (samples of d among BLEND[:n mod P]),
where BLEND is Megatron's blending rule over one period: each sample goes
to the prefix furthest below its weighted share. The prefix's m-th sample is
row perm_{d,e}[m mod W_d] of epoch e = m div W_d, perm a permutation seeded
by (data_shuffle_seed, d, e). Every training batch is a function of the
step; `checkpoint_state` records the next sample and the data's identity so
that a resume is checked to read on from there.

Eval: batch i, row r is the validation prefix's row i * eval_batch_size + r,
unshuffled, for the N rows of the eval set.
"""

import hashlib
import math
import os
from typing import Any, Optional, Sequence

import numpy as np

from maxtext.core import caller_paths
from maxtext.core import checks
from maxtext.data import builtin_datasets
from maxtext.data import data_config
from maxtext.data import dataset
from maxtext.text import megatron_index

KIND = "megatron"
# Samples of one period of the blend (see the module docstring). The shares
# within a period are the weights' to within one sample per prefix.
BLEND_PERIOD = 1 << 16
_STATE_VERSION = 1


def parse_data_path(text: str, field: str = "train_data_path"):
  """Megatron's data-path list -> [(weight, prefix)], weights normalised.

  "PREFIX" alone has weight 1; otherwise weights and prefixes alternate,
  "W1 P1 W2 P2 ...", each weight a number > 0.

  Raises:
    ValueError: `config.<field>=<text>: <problem>`.
  """
  words = str(text).split()
  if not words:
    raise ValueError(
        f"config.{field}={text!r}: is required when dataset_type='megatron'"
    )
  if len(words) == 1:
    return [(1.0, words[0])]
  if len(words) % 2:
    raise ValueError(
        f"config.{field}={text!r}: a blend alternates weights and prefixes "
        "('0.3 /data/a 0.7 /data/b'); it has an odd number of words"
    )
  pairs = []
  for weight, prefix in zip(words[::2], words[1::2]):
    try:
      value = float(weight)
    except ValueError:
      raise ValueError(
          f"config.{field}={text!r}: {weight!r} is no weight (a blend "
          "alternates weights and prefixes)"
      ) from None
    if not math.isfinite(value) or value <= 0:
      raise ValueError(f"config.{field}={text!r}: weight {weight} must be > 0")
    pairs.append((value, prefix))
  total = math.fsum(w for w, _ in pairs)
  return [(w / total, p) for w, p in pairs]


def blend_schedule(weights: Sequence[float], period: int = BLEND_PERIOD):
  """One period of the blend: (prefix of each sample, its index in it).

  Sample i goes to the prefix whose weighted share of the first i + 1
  samples is furthest above what it has had (ties: the lower index), as
  Megatron's build_blending_indices chooses.

  Returns:
    (int32 [period] prefix ids, int64 [period] per-prefix sample indices,
    int64 [len(weights)] samples of each prefix per period).
  """
  count = len(weights)
  if count == 1:
    return (
        np.zeros((period,), np.int32),
        np.arange(period, dtype=np.int64),
        np.asarray([period], np.int64),
    )
  ids = np.empty((period,), np.int32)
  within = np.empty((period,), np.int64)
  taken = [0] * count
  for i in range(period):
    best, best_gap = 0, -math.inf
    for d in range(count):
      gap = weights[d] * (i + 1) - taken[d]
      if gap > best_gap:
        best, best_gap = d, gap
    ids[i] = best
    within[i] = taken[best]
    taken[best] += 1
  return ids, within, np.asarray(taken, np.int64)


def _rows(tokens: megatron_index.IndexedTokens, seq: int) -> int:
  return max(0, (tokens.num_tokens - 1) // seq)


# The .bin files whose every token was found to be an id of the vocabulary,
# by (device, inode, size, modification time, vocab_size): a run's
# pre-flight and its data set open the same files, and each is read once.
_IDS_CHECKED: set[tuple[int, int, int, int, int]] = set()


def _check_ids(
    tokens: megatron_index.IndexedTokens, field: str, vocab_size: int
) -> None:
  """Refuses a prefix holding a token that is no id below `vocab_size`,
  reading its tokens once per file and process (`_IDS_CHECKED`)."""
  info = os.stat(tokens.bin_path)
  key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, vocab_size)
  if key in _IDS_CHECKED:
    return
  found = megatron_index.first_outside_vocab(tokens, vocab_size)
  if found is not None:
    position, value = found
    if isinstance(value, float) and value.is_integer():
      value = int(value)
    if isinstance(value, int) and value >= vocab_size:
      problem = f"at or above vocab_size={vocab_size}"
    elif isinstance(value, int) and value < 0:
      problem = f"negative (vocab_size={vocab_size})"
    else:
      problem = f"not a whole number (vocab_size={vocab_size})"
    raise ValueError(
        f"config.{field}: {tokens.bin_path}: token {position} of its "
        f"stream is {value}, {problem}; check vocab_size and the data"
    )
  _IDS_CHECKED.add(key)


def _open(
    prefix: str, field: str, seq: int, vocab_size: int
) -> megatron_index.IndexedTokens:
  """A prefix opened and checked, one row at least, every token an id
  below `vocab_size`; errors name the field."""
  try:
    tokens = megatron_index.open_prefix(caller_paths.resolve_local_path(prefix))
  except megatron_index.FormatError as e:
    raise ValueError(f"config.{field}: {e}") from None
  if _rows(tokens, seq) < 1:
    raise ValueError(
        f"config.{field}: {tokens.bin_path}: holds {tokens.num_tokens} "
        f"tokens; one sequence needs max_sequence_length + 1 = {seq + 1}"
    )
  _check_ids(tokens, field, vocab_size)
  return tokens


def eval_samples(settings: data_config.DataConfig) -> int:
  """N: megatron_eval_samples, or eval_steps * eval_batch_size for 0."""
  return settings.megatron_eval_samples or (
      settings.eval_steps * settings.eval_batch_size
  )


def _open_all(settings: data_config.DataConfig):
  """([(weight, opened training prefix)], opened validation prefix), checked
  as `check_config` says."""
  seq, vocab = settings.max_sequence_length, settings.vocab_size
  blend = [
      (weight, _open(prefix, "train_data_path", seq, vocab))
      for weight, prefix in parse_data_path(settings.train_data_path)
  ]
  if len(str(settings.eval_data_path).split()) != 1:
    raise ValueError(
        f"config.eval_data_path={settings.eval_data_path!r}: one validation "
        "prefix (no blend) when dataset_type='megatron'"
    )
  validation = _open(settings.eval_data_path, "eval_data_path", seq, vocab)
  wanted = eval_samples(settings)
  if _rows(validation, seq) < wanted:
    raise ValueError(
        f"config.eval_data_path: {validation.bin_path}: holds "
        f"{_rows(validation, seq)} sequences of {seq} tokens; the eval set "
        f"is its first {wanted}"
    )
  return blend, validation


def check_config(settings: data_config.DataConfig) -> None:
  """The pre-flight of a megatron run: every prefix's files, read as the
  data set reads them (index, sizes), every token an id of the model's
  vocabulary (each .bin read once), and enough validation rows for the
  eval set.

  Raises:
    ValueError: one line naming the field and the file.
  """
  if settings.dataset_type == KIND:
    _open_all(settings)


def _fingerprint(text: str, prefixes: Sequence[str]):
  """One field's files as `builtin_datasets.changed_files` compares them,
  and per file."""
  files = []
  for prefix in prefixes:
    for path in (prefix + ".idx", prefix + ".bin"):
      files.append(builtin_datasets.file_fingerprint(path))
  digest = hashlib.sha256()
  for f in files:
    digest.update(f"{f['size']}:{f['sampled_sha256']}".encode())
  combined = {
      "path": text,
      "size": sum(f["size"] for f in files),
      "sampled_sha256": digest.hexdigest(),
  }
  return combined, files


class MegatronDataset(dataset.Dataset):
  """Blended Megatron indexed datasets (see the module docstring)."""

  def __init__(
      self,
      settings: data_config.DataConfig,
      process_index: int = 0,
      process_count: int = 1,
  ):
    """Opens and checks every prefix.

    Raises:
      ValueError: a bad data-path list, a bad prefix or a token that is no
        id of the vocabulary (one line naming the field and the file), too
        few validation rows for the eval set, or batch sizes not divisible
        by process_count.
    """
    self._vocab = settings.vocab_size
    self._seq = settings.max_sequence_length
    self._seed = settings.data_shuffle_seed
    self._train_batch, self._eval_batch, self._train_rows, self._eval_rows = (
        builtin_datasets.process_shares(settings, process_index, process_count)
    )
    self._train_text = settings.train_data_path
    self._eval_text = settings.eval_data_path
    blend, self._eval = _open_all(settings)
    self._weights = [w for w, _ in blend]
    self._train = [t for _, t in blend]
    self._train_counts = [_rows(t, self._seq) for t in self._train]
    self._eval_samples = eval_samples(settings)
    self._blend_ids, self._blend_within, self._per_period = blend_schedule(
        self._weights
    )
    self._perm_cache: dict[tuple[int, int], np.ndarray] = {}
    self._expected_sample: Optional[int] = None
    self._identity = hashlib.sha256(
        repr(
            (
                [(w, t.prefix) for w, t in zip(self._weights, self._train)],
                self._train_counts,
                self._seed,
                self._seq,
            )
        ).encode()
    ).hexdigest()[:16]

  # ------------------------------------------------------------ facts
  @property
  def num_train_rows(self) -> list[int]:
    """Rows per epoch of each training prefix."""
    return list(self._train_counts)

  @property
  def num_eval_samples(self) -> int:
    """Sequences of the eval set (N)."""
    return self._eval_samples

  def provenance(self) -> dict[str, Any]:
    """Fingerprints of every file (the resume check's `tokens_files`)."""
    train, train_files = _fingerprint(
        self._train_text, [t.prefix for t in self._train]
    )
    evals, eval_files = _fingerprint(self._eval_text, [self._eval.prefix])
    return {
        "tokens_files": {"train_data_path": train, "eval_data_path": evals},
        KIND: {
            "blend": [
                {
                    "weight": w,
                    "prefix": os.path.abspath(t.prefix),
                    "dtype": t.dtype.name,
                    "sequences": t.num_sequences,
                    "documents": t.num_documents,
                    "tokens": t.num_tokens,
                    "rows": n,
                }
                for w, t, n in zip(
                    self._weights, self._train, self._train_counts
                )
            ],
            "eval": {
                "prefix": os.path.abspath(self._eval.prefix),
                "samples": self._eval_samples,
                "sequence_length": self._seq,
            },
            "files": train_files + eval_files,
        },
    }

  # ------------------------------------------------------------ rows
  def _permutation(self, prefix: int, epoch: int) -> np.ndarray:
    """The row order of one epoch of one prefix."""
    key = (prefix, epoch)
    perm = self._perm_cache.get(key)
    if perm is None:
      rng = np.random.default_rng([self._seed, prefix, epoch])
      perm = rng.permutation(self._train_counts[prefix])
      # Rows are read in sample order, so a batch moves through a prefix's
      # epochs in turn: two per prefix are enough.
      if len(self._perm_cache) >= 2 * len(self._train):
        self._perm_cache.pop(next(iter(self._perm_cache)))
      self._perm_cache[key] = perm
    return perm

  def _window(self, tokens: megatron_index.IndexedTokens, row: int):
    """Row `row` of a prefix: its S + 1 tokens."""
    return tokens.stream(row * self._seq, row * self._seq + self._seq + 1)

  def _batch(self, windows: list[np.ndarray], sources) -> dataset.Batch:
    """Rows read from `sources` (one prefix per row) as a checked batch."""
    stacked = np.stack(windows)
    # Each file was checked when opened; a file changed since is caught
    # here, in the rows read.
    outside = megatron_index.ids_outside(stacked, self._vocab).any(axis=1)
    if outside.any():
      row = int(np.argmax(outside))
      raise ValueError(
          f"{sources[row].bin_path}: holds tokens that are no id of a "
          f"vocabulary of vocab_size={self._vocab} (it changed after it "
          "was opened)"
      )
    return builtin_datasets.to_batch(stacked)

  def blend_position(self, sample: int) -> tuple[int, int]:
    """(prefix index, m) of training sample `sample`: it is the prefix's
    m-th sample (counted over epochs)."""
    block, offset = divmod(sample, BLEND_PERIOD)
    prefix = int(self._blend_ids[offset])
    index = block * int(self._per_period[prefix]) + int(
        self._blend_within[offset]
    )
    return prefix, index

  def sample_source(self, sample: int) -> tuple[int, int]:
    """(prefix index, row of that prefix) of training sample `sample`."""
    prefix, index = self.blend_position(sample)
    epoch, position = divmod(index, self._train_counts[prefix])
    return prefix, int(self._permutation(prefix, epoch)[position])

  def get_batch(self, step: int) -> dataset.Batch:
    """This process's rows of the training batch of global step `step`.

    Raises:
      ValueError: a negative step, a step other than the one a restored
        checkpoint state says comes next, or token ids outside the
        vocabulary (naming the .bin).
    """
    step = builtin_datasets.check_index(step, "step")
    first = step * self._train_batch
    if self._expected_sample is not None:
      if first != self._expected_sample:
        raise ValueError(
            f"dataset_type='megatron': the checkpoint's data state reads on "
            f"at sample {self._expected_sample}; step {step} starts at sample "
            f"{first}"
        )
      self._expected_sample = None
    windows, sources = [], []
    for row in range(self._train_batch)[self._train_rows]:
      prefix, window = self.sample_source(first + row)
      windows.append(self._window(self._train[prefix], window))
      sources.append(self._train[prefix])
    return self._batch(windows, sources)

  def get_eval_batch(self, index: int) -> dataset.Batch:
    """This process's rows of eval batch `index` of the eval set.

    Raises:
      ValueError: a batch past the eval set's N sequences.
    """
    index = builtin_datasets.check_index(index, "index")
    if (index + 1) * self._eval_batch > self._eval_samples:
      raise ValueError(
          f"eval batch {index} of {self._eval_batch} rows is past the eval "
          f"set's {self._eval_samples} sequences"
      )
    rows = range(self._eval_batch)[self._eval_rows]
    windows = [
        self._window(self._eval, index * self._eval_batch + r) for r in rows
    ]
    return self._batch(windows, [self._eval] * len(windows))

  # ------------------------------------------------------------ position
  def checkpoint_state(self, step: int) -> dict[str, Any]:
    """The next training sample and the identity of the blend read."""
    return {
        "kind": KIND,
        "version": _STATE_VERSION,
        "next_sample": int(step) * self._train_batch,
        "global_batch_size": self._train_batch,
        "blend": self._identity,
    }

  def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
    """Checks a saved position; the next `get_batch` must start there.

    Raises:
      ValueError: a state of another kind or version, or another global
        batch (the same samples would fall into other steps). A changed
        blend (allowed by allow_data_change) is logged by the caller's
        provenance check, not refused here.
    """
    if not isinstance(state, dict) or state.get("kind") != KIND:
      raise ValueError(
          f"the checkpoint's data state is not a megatron data set's: {state!r}"
      )
    if state.get("version") != _STATE_VERSION:
      raise ValueError(
          f"megatron data state version {state.get('version')!r}; this "
          f"reader writes {_STATE_VERSION}"
      )
    if state.get("global_batch_size") != self._train_batch:
      raise ValueError(
          f"the checkpoint's data state was written at global_batch_size="
          f"{state.get('global_batch_size')}; this run has {self._train_batch}"
      )
    next_sample = state.get("next_sample")
    if not checks.is_int(next_sample) or next_sample < 0:
      raise ValueError(f"megatron data state: bad next_sample {next_sample!r}")
    self._expected_sample = int(next_sample)
