"""End-to-end test of //tools:prepare_data on the stdlib's sources."""

import os
import subprocess

from absl.testing import absltest

from maxtext.text import metadata
from testing import stdlib_corpus
from testing import runfiles


def _run(*args):
  command = runfiles.binary_command("tools/prepare_data")
  return subprocess.run(
      command + list(args),
      capture_output=True,
      text=True,
      env=runfiles.binary_environ(command),
      check=False,
      timeout=300,
  )


class PrepareDataTest(absltest.TestCase):

  def test_prepares_a_directory_of_text_files(self):
    source = self.create_tempdir()
    for path in stdlib_corpus.files(4):
      with open(path, "rb") as f:
        source.create_file(os.path.basename(path), f.read(), mode="wb")
    out = os.path.join(self.create_tempdir().full_path, "data")
    done = _run(
        f"--input={source.full_path}",
        f"--output_dir={out}",
        "--train_tokenizer_vocab_size=400",
        "--eval_every=2",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    # Progress goes to stderr (not a terminal here: plain lines), its last
    # line always; stdout holds only the tool's own lines.
    self.assertRegex(
        done.stderr,
        r"(?m)^prepare_data: done, [\d.]+ kB in \d+ s \([\d.]+ [kM]?B/s\); "
        r"files 4/4, documents 4, tokens [\d,]+ \([\d,]+ tokens/s\)$",
    )
    self.assertNotIn("prepare_data:", done.stdout)
    meta = metadata.load(out)
    self.assertEqual(meta["input"]["files"], 4)
    self.assertEqual(meta["splits"]["eval"]["documents"], 2)

  def test_entries_that_are_not_readable_files_are_skipped_naming_them(self):
    source = self.create_tempdir()
    for path in stdlib_corpus.files(4):
      with open(path, "rb") as f:
        source.create_file(os.path.basename(path), f.read(), mode="wb")
    broken = os.path.join(source.full_path, "broken_link.py")
    os.symlink(os.path.join(source.full_path, "absent"), broken)
    fifo = os.path.join(source.full_path, "pipe")
    os.mkfifo(fifo)
    out = os.path.join(self.create_tempdir().full_path, "data")
    done = _run(
        f"--input={source.full_path}",
        f"--output_dir={out}",
        "--train_tokenizer_vocab_size=400",
        "--eval_every=2",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(
        "skipped 2 entries that are not readable regular files: "
        f"{broken}, {fifo}",
        done.stdout,
    )
    self.assertEqual(metadata.load(out)["input"]["files"], 4)

    # Nothing readable left: refused, naming what was skipped.
    empty = self.create_tempdir().full_path
    os.mkfifo(os.path.join(empty, "pipe"))
    done = _run(
        f"--input={empty}",
        f"--output_dir={out}2",
        "--train_tokenizer_vocab_size=400",
    )
    self.assertEqual(done.returncode, 2, done.stderr)
    self.assertEqual(
        done.stderr.strip().splitlines(),
        [
            f"prepare_data: error: input=[{empty!r}]: holds no readable "
            f"regular file (skipped: {empty}/pipe)"
        ],
    )
    self.assertFalse(os.path.exists(f"{out}2"))

  def test_bad_input_is_a_one_line_error(self):
    out = os.path.join(self.create_tempdir().full_path, "data")
    done = _run(
        "--input=/nonexistent/corpus",
        f"--output_dir={out}",
        "--train_tokenizer_vocab_size=400",
    )
    self.assertEqual(done.returncode, 2)
    self.assertEqual(
        done.stderr.strip().splitlines(),
        ["prepare_data: error: input='/nonexistent/corpus': does not exist"],
    )


if __name__ == "__main__":
  absltest.main()
