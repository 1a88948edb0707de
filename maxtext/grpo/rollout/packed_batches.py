"""GRPO micro-batches with their sequences packed into rows.

A padded micro-batch (`rollout.micro_batches`) holds one sequence (prompt,
then completion, then padding) per row of the rollout's width W, so a
micro-batch of long-tailed completions is mostly padding. `pack` lays the
same B sequences into R <= B rows of W tokens (greedy first-fit,
`maxtext.data.packing`), with segment ids and positions so the model scores
each sequence as it would alone (`scoring.packed_completion_log_probs_and_
entropy`). Everything per sequence stays as it was ([B] and [B, L]: the
completion mask, behaviour log-probabilities, advantages, sequence mask,
normalisers); only the model's input changes:

  tokens         int32 [R, W] packed rows (replacing [B, W])
  segment_ids    int32 [R, W]
  positions      int32 [R, W]
  completion_at  int32 [B, L]: the flat row position r * W + c whose
                 logits predict completion id j of sequence b

so the loss and every per-sequence statistic are the padded batch's.

R is the rows the fullest micro-batch of the step needs, rounded up to a
multiple of `row_multiple` (the mesh's batch shards, and a bucket that
bounds how many shapes the engine compiles); every micro-batch of the step
has R rows, so they stack and split alike.
"""

from typing import Sequence

import numpy as np

from maxtext.data import packing

# The model's input in a packed micro-batch (the module docstring).
PACKED_KEYS = ("tokens", "segment_ids", "positions", "completion_at")
# Those of R rows (the others have one row per sequence).
ROW_KEYS = ("tokens", "segment_ids", "positions")


def sequence_lengths(micro_batch: dict) -> np.ndarray:
  """Tokens of each row's sequence: its prompt and completion."""
  return np.asarray(micro_batch["prompt_lengths"]) + np.sum(
      np.asarray(micro_batch["mask"]) > 0, axis=1
  ).astype(np.int32)


def rows_needed(micro_batch: dict) -> int:
  """Rows `pack` fills for this micro-batch alone."""
  width = np.asarray(micro_batch["tokens"]).shape[1]
  return len(packing.first_fit(sequence_lengths(micro_batch), width))


def row_multiple(sequences: int, shards: int) -> int:
  """What a step's packed row count is a multiple of: the `shards` the
  rows are split over, and a quarter of the micro-batch's `sequences`
  rounded up to them (so a run compiles at most about four shapes of its
  step)."""
  quarter = max(1, sequences // 4)
  return -(-quarter // shards) * shards


def num_rows(micro_batches: Sequence[dict], multiple: int) -> int:
  """R for a step: its fullest micro-batch's rows rounded up to a multiple
  of `multiple` (`row_multiple`)."""
  needed = max(rows_needed(batch) for batch in micro_batches)
  return -(-needed // multiple) * multiple


def pack(micro_batch: dict, rows: int) -> dict:
  """The micro-batch with its sequences packed into `rows` rows.

  Args:
    micro_batch: a padded micro-batch (`rollout.micro_batches`): "tokens"
      int32 [B, W] (prompt, completion, padding), "prompt_lengths" [B],
      "mask" [B, L] and the per-sequence arrays.
    rows: R, at least `rows_needed(micro_batch)`.

  Returns:
    The same dict with `PACKED_KEYS` in place of the padded tokens.
  """
  tokens = np.asarray(micro_batch["tokens"])
  prompt_lengths = np.asarray(micro_batch["prompt_lengths"])
  completion_width = np.asarray(micro_batch["mask"]).shape[1]
  width = tokens.shape[1]
  lengths = sequence_lengths(micro_batch)
  segment_ids, positions, starts = packing.layout(
      packing.first_fit(lengths, width), lengths, width, num_rows=rows
  )
  packed = np.zeros((rows, width), np.int32)
  completion_at = np.zeros((len(lengths), completion_width), np.int32)
  for i, (row, column) in enumerate(starts):
    n = int(lengths[i])
    packed[row, column : column + n] = tokens[i, :n]
    # Completion id j sits at prompt_length + j in its sequence; the
    # position before it predicts it. Past the completion's end, the
    # sequence's first token (masked by the caller).
    at = prompt_lengths[i] - 1 + np.arange(completion_width)
    at = np.where(at < n - 1, at, 0)
    completion_at[i] = row * width + column + at
  return dict(
      micro_batch,
      tokens=packed,
      segment_ids=segment_ids,
      positions=positions,
      completion_at=completion_at,
  )


def padding_fraction(micro_batches: Sequence[dict], rows: int = 0) -> float:
  """The share of the model's input tokens that hold no sequence: padded
  (rows 0: one row per sequence) or packed into `rows` rows each."""
  lengths = np.concatenate([sequence_lengths(b) for b in micro_batches])
  width = np.asarray(micro_batches[0]["tokens"]).shape[1]
  total_rows = len(micro_batches) * rows if rows else len(lengths)
  return packing.padding_fraction(lengths, total_rows, width)
