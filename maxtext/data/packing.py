"""Packed rows: several sequences in one row, told apart by segment ids.

A packed row holds sequences one after another; `segment_ids` numbers them
1, 2, ... in the row (0 is the padding after the last one) and `positions`
restart at 0 where each starts. The model reads both
(`maxtext.model.transformer.Rows`): attention and the recurrent layers see
only a token's own sequence and the rotary embeddings take its position in
it, so each sequence gives what it gives alone in a row of its own.

  first_fit        which sequences share a row: greedy first-fit, longest
                   first, into rows of a given width.
  layout           the segment ids and positions of such rows, and where
                   each sequence starts.
  document_rows    segment ids and positions of pretraining windows cut
                   from a concatenated token stream: a document ends at
                   its end-of-document id.
  padding_fraction the share of a layout's tokens that are padding.
  PackedDocuments  a pretraining data set's batches with the segment ids
                   and positions of their documents.
"""

from typing import Any, Optional, Sequence

import numpy as np

from maxtext.data import dataset

# With config.packing: the dataset_types whose rows are windows of one
# concatenated token stream, packed by document (`PackedDocuments`), train
# and eval batches; and every dataset_type whose training batches are
# packed ("chat" packs its examples; its eval rows stay one example each).
STREAM_KINDS = ("tokens_file", "grain", "megatron")
PACKED_TRAIN_KINDS = STREAM_KINDS + ("chat",)


def first_fit(lengths: Sequence[int], width: int) -> list[list[int]]:
  """Greedy first-fit decreasing: the sequences of each row, by index.

  Sequences are taken longest first (ties in index order) and each goes
  into the first row with room for it, a new row when none has. The rows
  keep their sequences in the order they were placed.

  Args:
    lengths: tokens of each sequence, each in [1, width].
    width: tokens per row.

  Returns:
    One list of sequence indices per row, rows in the order they were
    opened.

  Raises:
    ValueError: a length outside [1, width].
  """
  order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
  rows: list[list[int]] = []
  room: list[int] = []
  for i in order:
    n = int(lengths[i])
    if not 1 <= n <= width:
      raise ValueError(
          f"sequence {i} of {n} tokens does not fit a packed row of {width}"
      )
    for r, left in enumerate(room):
      if n <= left:
        rows[r].append(i)
        room[r] -= n
        break
    else:
      rows.append([i])
      room.append(width - n)
  return rows


def layout(
    rows: Sequence[Sequence[int]],
    lengths: Sequence[int],
    width: int,
    num_rows: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Segment ids, positions and starts of packed rows.

  Args:
    rows: the sequences of each row (`first_fit`).
    lengths: tokens of each sequence.
    width: tokens per row.
    num_rows: rows of the result (>= len(rows)); the rows after the last
      used one are padding. 0 = len(rows).

  Returns:
    (segment_ids int32 [R, W]: 1.. per sequence in its row, 0 on padding;
    positions int32 [R, W]: 0.. within each sequence, and within each
    row's padding; starts int32 [N, 2]: (row, column) of each sequence's
    first token).

  Raises:
    ValueError: num_rows below the rows used, or a row overfull.
  """
  num_rows = num_rows or len(rows)
  if num_rows < len(rows):
    raise ValueError(f"{len(rows)} packed rows do not fit in {num_rows}")
  segment_ids = np.zeros((num_rows, width), np.int32)
  positions = np.zeros((num_rows, width), np.int32)
  starts = np.zeros((len(lengths), 2), np.int32)
  for r, members in enumerate(rows):
    column = 0
    for segment, i in enumerate(members, start=1):
      n = int(lengths[i])
      if column + n > width:
        raise ValueError(f"row {r} holds more than {width} tokens")
      segment_ids[r, column : column + n] = segment
      positions[r, column : column + n] = np.arange(n)
      starts[i] = (r, column)
      column += n
    positions[r, column:] = np.arange(width - column)
  for r in range(len(rows), num_rows):
    positions[r] = np.arange(width)
  return segment_ids, positions, starts


def document_rows(
    inputs: np.ndarray, eod_id: int
) -> tuple[np.ndarray, np.ndarray]:
  """Segment ids and positions of windows of a concatenated token stream.

  A document ends with its end-of-document id: the token after an
  `eod_id` starts a new segment (the id itself is its document's last
  token). A window's first token starts a segment whatever came before it
  in the stream: what the window cannot see, it cannot attend to.

  Args:
    inputs: int [B, S] model inputs.
    eod_id: the end-of-document id.

  Returns:
    (segment_ids int32 [B, S] from 1, positions int32 [B, S]).
  """
  inputs = np.asarray(inputs)
  b, s = inputs.shape
  starts = np.zeros((b, s), bool)
  starts[:, 0] = True
  starts[:, 1:] = inputs[:, :-1] == eod_id
  segment_ids = np.cumsum(starts, axis=1).astype(np.int32)
  # Position = distance to the latest start at or before each token.
  column = np.broadcast_to(np.arange(s), (b, s))
  latest = np.maximum.accumulate(np.where(starts, column, 0), axis=1)
  return segment_ids, (column - latest).astype(np.int32)


def padding_fraction(
    lengths: Sequence[int], num_rows: int, width: int
) -> float:
  """The share of num_rows x width tokens that hold no sequence."""
  total = num_rows * width
  return 1.0 - float(np.sum(lengths)) / total if total else 0.0


class PackedDocuments(dataset.Dataset):
  """A pretraining data set whose rows restart at each document.

  Every training and eval batch gets "segment_ids" and "positions"
  (`document_rows` of its inputs at `eod_id`); the tokens, targets and
  weights are the wrapped data set's. Checkpoint state, provenance and
  closing are the wrapped data set's.
  """

  def __init__(self, inner: dataset.Dataset, eod_id: int):
    self._inner = inner
    self._eod_id = eod_id

  def _with_documents(self, batch: dataset.Batch) -> dataset.Batch:
    segment_ids, positions = document_rows(batch["inputs"], self._eod_id)
    return dict(batch, segment_ids=segment_ids, positions=positions)

  def get_batch(self, step: int) -> dataset.Batch:
    return self._with_documents(self._inner.get_batch(step))

  def get_eval_batch(self, index: int) -> dataset.Batch:
    return self._with_documents(self._inner.get_eval_batch(index))

  def checkpoint_state(self, step: int) -> Optional[dict[str, Any]]:
    return self._inner.checkpoint_state(step)

  def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
    self._inner.restore_checkpoint_state(state)

  def provenance(self) -> Optional[dict[str, Any]]:
    return self._inner.provenance()

  def close(self) -> None:
    self._inner.close()
