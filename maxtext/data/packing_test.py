"""Tests of maxtext/data/packing.py: first-fit rows and their arrays."""

from absl.testing import absltest
import numpy as np

from maxtext.data import packing


class FirstFitTest(absltest.TestCase):

  def test_longest_first_into_the_first_row_with_room(self):
    # 7 opens row 0, 6 row 1, 5 row 2; 3 fits row 0 (7 + 3 = 10); 2 fits
    # row 1; 2 row 1 again (6 + 2 + 2 = 10); 1 row 2.
    rows = packing.first_fit([3, 7, 2, 6, 5, 2, 1], 10)
    self.assertEqual(rows, [[1, 0], [3, 2, 5], [4, 6]])

  def test_every_sequence_once_and_no_row_overfull(self):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 65, 200)
    rows = packing.first_fit(lengths, 64)
    placed = sorted(i for row in rows for i in row)
    self.assertEqual(placed, list(range(200)))
    for row in rows:
      self.assertLessEqual(sum(lengths[i] for i in row), 64)
    # First-fit decreasing never needs more than 11/9 OPT + 1 rows.
    self.assertLessEqual(len(rows), int(11 / 9 * -(-sum(lengths) // 64)) + 1)

  def test_too_long_is_refused(self):
    with self.assertRaisesRegex(ValueError, "sequence 1 of 11 tokens"):
      packing.first_fit([3, 11], 10)


class LayoutTest(absltest.TestCase):

  def test_ids_positions_and_starts(self):
    segment_ids, positions, starts = packing.layout(
        [[1, 0], [2]], [2, 3, 4], 6, num_rows=3
    )
    np.testing.assert_array_equal(
        segment_ids, [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0], [0] * 6]
    )
    np.testing.assert_array_equal(
        positions, [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1], range(6)]
    )
    np.testing.assert_array_equal(starts, [[0, 3], [0, 0], [1, 0]])

  def test_too_few_rows_are_refused(self):
    with self.assertRaisesRegex(ValueError, "2 packed rows do not fit in 1"):
      packing.layout([[0], [1]], [2, 2], 3, num_rows=1)


class DocumentRowsTest(absltest.TestCase):

  def test_a_document_starts_after_each_end_id(self):
    eod = 9
    segment_ids, positions = packing.document_rows(
        np.array([[5, 9, 4, 4, 9, 9, 3], [9, 1, 2, 3, 4, 5, 6]]), eod
    )
    np.testing.assert_array_equal(
        segment_ids, [[1, 1, 2, 2, 2, 3, 4], [1, 2, 2, 2, 2, 2, 2]]
    )
    np.testing.assert_array_equal(
        positions, [[0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 2, 3, 4, 5]]
    )


class PaddingFractionTest(absltest.TestCase):

  def test_share_of_empty_tokens(self):
    self.assertAlmostEqual(packing.padding_fraction([3, 5], 2, 8), 0.5)


if __name__ == "__main__":
  absltest.main()
