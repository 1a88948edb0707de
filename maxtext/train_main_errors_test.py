"""Mistakes in a config's paths and data, through the real `train_main`.

Each case gives the binary (the `//maxtext:train_main` py_binary under Bazel,
`python -m maxtext.train_main` otherwise; see `testing/runfiles.py`) the tiny
config plus one mistake made for real in a temp dir, and expects what a user
should see: exit status 2, one `train_main: error:` line naming the field,
no traceback, and no file written.
"""

import os

from absl.testing import absltest
from absl.testing import parameterized

from testing import process_output
from testing import runfiles
from testing import tiny_configs

# Imports alone are slow on a loaded 2-core machine.
_TIMEOUT_S = 240


class TrainMainErrorsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tempdir = self.create_tempdir()
    self.tmp = self.tempdir.full_path
    self.file = self.tempdir.create_file(
        "a_file", "not a directory\n"
    ).full_path

  def listing(self):
    found = set()
    for root, dirs, files in os.walk(self.tmp):
      found.update(os.path.join(root, n) for n in dirs + files)
    return found

  @parameterized.named_parameters(
      (
          "output_under_a_file",
          lambda t: {"base_output_directory": os.path.join(t.file, "runs")},
          r"config\.base_output_directory='.*/a_file/runs': is under "
          r".*/a_file, which is a regular file",
      ),
      (
          "run_name_too_long",
          lambda t: {"run_name": "r" * 300},
          r"config\.run_name='r{300}': name too long \(300 > 255 characters\)",
      ),
      (
          "malformed_npy",
          lambda t: {
              "dataset_type": "tokens_file",
              "train_data_path": t.not_numpy("train.npy"),
              "eval_data_path": t.not_numpy("train.npy"),
          },
          r"config\.train_data_path='.*/train\.npy': malformed \.npy file: the "
          r"magic string is not correct; expected .*, got b'tokens'",
      ),
      (
          "mllog_file_under_a_file",
          lambda t: {"mllog_file": os.path.join(t.file, "mllog.log")},
          r"config\.mllog_file='.*/a_file/mllog\.log': .*/a_file is a regular "
          r"file, not a directory",
      ),
  )
  def test_mistake_is_one_line_and_exit_status_2(self, overrides, message):
    fields = overrides(self)
    before = self.listing()
    flags = tiny_configs.tiny_flags(
        fields.pop("base_output_directory", os.path.join(self.tmp, "runs")),
        run_name=fields.pop("run_name", "run"),
        extra=fields,
    )
    proc = runfiles.run_binary(
        "maxtext/train_main", flags, timeout_s=_TIMEOUT_S, cwd=self.tmp
    )
    output = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    self.assertEqual(proc.returncode, 2, output)
    error = process_output.one_line_starting(
        proc.stderr, "train_main: error:", output
    )
    self.assertRegex(error, "^train_main: error: " + message + "$")
    self.assertNotIn("Traceback", proc.stderr)
    self.assertEqual(self.listing(), before)

  def not_numpy(self, name):
    """A file named like a .npy file that is not one."""
    return self.tempdir.create_file(name, b"tokens, not NumPy\n").full_path


if __name__ == "__main__":
  absltest.main()
