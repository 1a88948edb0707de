"""Tests of testing/process_output.py."""

from absl.testing import absltest

from testing import process_output


class OneLineStartingTest(absltest.TestCase):

  def test_returns_the_one_line_with_the_prefix(self):
    text = "loading\nerror: disk full\nerror:x is elsewhere\n"
    self.assertEqual(
        process_output.one_line_starting(text, "error: "), "error: disk full"
    )
    # A prefix is matched at the start of a line only.
    self.assertEqual(process_output.one_line_starting("a b\nb a\n", "b"), "b a")

  def test_no_line_fails_showing_the_text(self):
    with self.assertRaisesRegex(
        AssertionError, r"(?s)found 0: \[\]\nloading\ndone"
    ):
      process_output.one_line_starting("loading\ndone\n", "error:")

  def test_two_lines_fail_showing_both_and_the_context(self):
    with self.assertRaisesRegex(
        AssertionError,
        r"(?s)found 2: \['error: a', 'error: b'\]\nstderr: all of it$",
    ):
      process_output.one_line_starting(
          "error: a\nerror: b\n", "error:", context="stderr: all of it"
      )


if __name__ == "__main__":
  absltest.main()
