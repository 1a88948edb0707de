"""Tests for maxtext.core.checks."""

import os

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.core import checks


class ChecksTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("python_int", 3, True),
      ("numpy_int", np.int64(3), True),
      ("bool", True, False),
      ("float", 3.0, False),
      ("str", "3", False),
  )
  def test_is_int(self, value, expected):
    self.assertEqual(checks.is_int(value), expected)

  @parameterized.named_parameters(
      ("int", 3, True),
      ("float", 2.5, True),
      ("numpy_float", np.float32(1), True),
      ("bool", False, False),
      ("str", "1", False),
      ("none", None, False),
  )
  def test_is_number(self, value, expected):
    self.assertEqual(checks.is_number(value), expected)

  def test_check_int(self):
    self.assertEqual(checks.check_int("steps", np.int32(4), minimum=1), 4)
    self.assertIsInstance(checks.check_int("steps", np.int32(4)), int)
    with self.assertRaisesRegex(TypeError, r"steps must be an int, got True"):
      checks.check_int("steps", True)
    with self.assertRaisesRegex(ValueError, r"steps must be >= 1, got 0"):
      checks.check_int("steps", 0, minimum=1)

  def test_check_number(self):
    self.assertEqual(checks.check_number("lr", 1), 1.0)
    with self.assertRaisesRegex(TypeError, r"lr must be a number, got True"):
      checks.check_number("lr", True)
    with self.assertRaisesRegex(ValueError, r"lr must be finite, got nan"):
      checks.check_number("lr", float("nan"))
    self.assertEqual(
        checks.check_number("x", float("inf"), finite=False), float("inf")
    )
    with self.assertRaisesRegex(ValueError, r"lr must be > 0, got 0"):
      checks.check_number("lr", 0, positive=True)

  def test_file_kind(self):
    tmp = self.create_tempdir()
    regular = tmp.create_file("f").full_path
    self.assertEqual(
        checks.file_kind(os.stat(regular).st_mode), "a regular file"
    )
    self.assertEqual(
        checks.file_kind(os.stat(tmp.full_path).st_mode), "a directory"
    )
    self.assertEqual(checks.file_kind(os.stat("/dev/null").st_mode), "a device")
    fifo = os.path.join(tmp.full_path, "fifo")
    os.mkfifo(fifo)
    self.assertEqual(checks.file_kind(os.stat(fifo).st_mode), "a FIFO")


if __name__ == "__main__":
  absltest.main()
