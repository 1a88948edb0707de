"""Which tokenizer files an import copies and an export writes."""

import os

from absl.testing import absltest

from maxtext.hf import tokenizer_files


def _write(directory: str, name: str, text: str) -> str:
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, name)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return path


class TokenizerFilesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.imported = os.path.join(self.root, "imported")
    for name in ("tokenizer.json", "tokenizer_config.json"):
      _write(self.imported, name, '{"name": "%s"}' % name)
    _write(self.imported, "generation_config.json", "{}")
    _write(self.imported, "config.json", "{}")  # Not a tokenizer file.

  def test_present_lists_only_tokenizer_files(self):
    self.assertEqual(
        tokenizer_files.present(self.imported),
        ["tokenizer.json", "tokenizer_config.json", "generation_config.json"],
    )

  def test_copy_refuses_to_overwrite(self):
    out = os.path.join(self.root, "out")
    _write(out, "tokenizer.json", "mine")
    with self.assertRaisesRegex(ValueError, r"tokenizer.json: exists"):
      tokenizer_files.copy(
          {"tokenizer.json": os.path.join(self.imported, "tokenizer.json")},
          out,
      )
    with open(os.path.join(out, "tokenizer.json"), encoding="utf-8") as f:
      self.assertEqual(f.read(), "mine")

  def test_export_of_the_import_itself_and_of_a_run_started_from_it(self):
    expected = {
        n: os.path.join(self.imported, n)
        for n in tokenizer_files.present(self.imported)
    }
    selection = tokenizer_files.for_export(self.imported, "", None)
    self.assertEqual(selection.files, expected)
    self.assertEqual(selection.notes, [])
    run = os.path.join(self.root, "run")
    os.makedirs(run)
    for path in (self.imported, self.imported + "/0"):
      selection = tokenizer_files.for_export(run, path, None)
      self.assertEqual(selection.files, expected)

  def test_the_same_data_tokenizer_keeps_the_imported_files(self):
    data = os.path.join(self.root, "data")
    same = _write(data, "tokenizer.json", '{"name": "tokenizer.json"}')
    run = os.path.join(self.root, "run")
    selection = tokenizer_files.for_export(run, self.imported, same)
    self.assertEqual(selection.files["tokenizer.json"], same)
    self.assertIn("tokenizer_config.json", selection.files)
    self.assertEqual(selection.notes, [])

  def test_another_data_tokenizer_replaces_the_imported_one_and_says_so(self):
    data = os.path.join(self.root, "data")
    other = _write(data, "tokenizer.json", '{"other": 1}')
    run = os.path.join(self.root, "run")
    selection = tokenizer_files.for_export(run, self.imported, other)
    self.assertEqual(
        selection.files,
        {
            "generation_config.json": os.path.join(
                self.imported, "generation_config.json"
            ),
            "tokenizer.json": other,
        },
    )
    self.assertEqual(
        selection.notes,
        [
            "warning: not writing tokenizer.json, tokenizer_config.json of "
            f"{self.imported}: the run trained on another tokenizer, "
            f"{other}, written as tokenizer.json"
        ],
    )

  def test_a_run_without_any_says_so(self):
    run = os.path.join(self.root, "run")
    selection = tokenizer_files.for_export(run, "", None)
    self.assertEqual(selection.files, {})
    self.assertLen(selection.notes, 1)
    self.assertStartsWith(selection.notes[0], "no tokenizer files")


if __name__ == "__main__":
  absltest.main()
