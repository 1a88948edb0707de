"""Tests of the tools' shared command-line conventions."""

import contextlib
import io

from absl import app
from absl import flags
from absl.testing import absltest

from tools import command_line


def _flags(**values):
  """Flag holders of a fresh FlagValues, parsed with `values`."""
  flag_values = flags.FlagValues()
  holders = {
      name: flags.DEFINE_string(name, None, "a flag", flag_values=flag_values)
      for name in ("run_dir", "output")
  }
  flag_values(["prog"] + [f"--{k}={v}" for k, v in values.items()])
  return holders


class CheckTest(absltest.TestCase):

  def test_passes_with_the_required_flags(self):
    holders = _flags(run_dir="r")
    command_line.check(["prog"], holders["run_dir"])

  def test_positional_arguments_are_named(self):
    with self.assertRaisesRegex(
        app.UsageError, r"unexpected arguments: \['extra'\]"
    ):
      command_line.check(["prog", "extra"])

  def test_missing_and_empty_required_flags_are_named(self):
    holders = _flags(run_dir="")
    for name in ("run_dir", "output"):
      with self.assertRaisesRegex(app.UsageError, f"^--{name} is required$"):
        command_line.check(["prog"], holders[name])


class UserErrorsTest(absltest.TestCase):

  def run_body(self, error, **kwargs):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
      with self.assertRaises(SystemExit) as exit_info:
        with command_line.user_errors("tool", **kwargs):
          raise error
    return exit_info.exception.code, stderr.getvalue()

  def test_value_error_is_one_line_and_status_2(self):
    code, stderr = self.run_body(ValueError("config.steps=-1: below 0"))
    self.assertEqual(code, 2)
    self.assertEqual(stderr, "tool: error: config.steps=-1: below 0\n")

  def test_other_errors_keep_their_traceback(self):
    with self.assertRaisesRegex(TypeError, "a bug"):
      with command_line.user_errors("tool"):
        raise TypeError("a bug")

  def test_listed_types_are_user_errors(self):
    code, stderr = self.run_body(
        TypeError("config.steps: not an int"), errors=(TypeError, ValueError)
    )
    self.assertEqual(code, 2)
    self.assertEqual(stderr, "tool: error: config.steps: not an int\n")

  def test_a_clean_body_prints_nothing(self):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
      with command_line.user_errors("tool"):
        pass
    self.assertEqual(stderr.getvalue(), "")


if __name__ == "__main__":
  absltest.main()
