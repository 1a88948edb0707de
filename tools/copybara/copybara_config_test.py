"""Checks copy.bara.sky against the real tree, using the Copybara stand-ins."""

import os

from absl.testing import absltest

from tools.copybara import copybara_standins

_CONFIG = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "copy.bara.sky"
)


def _workspace_root():
  """The source tree: the runfile of the config is a link into it."""
  real = os.path.realpath(_CONFIG)
  return os.path.dirname(os.path.dirname(os.path.dirname(real)))


class CopybaraConfigTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workflows, cls.env = copybara_standins.evaluate(_CONFIG)
    cls.root = _workspace_root()
    cls.tree = copybara_standins.read_tree(cls.root)

  def test_root_is_the_workspace(self):
    self.assertIn("WORKSPACE", self.tree)
    self.assertIn("tools/copybara/copy.bara.sky", self.tree)

  def test_declares_git_export_and_local_folder_workflows(self):
    self.assertCountEqual(self.workflows, ["export", "export_local"])
    self.assertEqual(self.workflows["export"].origin.kind, "git.origin")
    self.assertEqual(
        self.workflows["export"].destination.kind, "git.destination"
    )
    self.assertEqual(
        self.workflows["export_local"].origin.kind, "folder.origin"
    )
    self.assertEqual(
        self.workflows["export_local"].destination.kind, "folder.destination"
    )

  def test_every_glob_pattern_matches_an_existing_file(self):
    for name, workflow in self.workflows.items():
      for kind, pattern in workflow.origin_files.patterns():
        alone = copybara_standins.Glob([([pattern], [])])
        with self.subTest(workflow=name, pattern=pattern):
          self.assertTrue(
              any(alone.matches(p) for p in self.tree),
              "%s pattern %r of %s matches no file" % (kind, pattern, name),
          )

  def test_every_move_names_a_real_path_and_a_free_destination(self):
    for name, workflow in self.workflows.items():
      moves = [
          t
          for t in workflow.transformations
          if isinstance(t, copybara_standins.Move)
      ]
      self.assertNotEmpty(moves)
      for move in moves:
        with self.subTest(workflow=name, move=move.before):
          self.assertTrue(
              move.before in self.tree
              or any(
                  p.startswith(move.before.rstrip("/") + "/") for p in self.tree
              ),
              "move source %r does not exist" % move.before,
          )
          self.assertNotIn(move.after, self.tree)

  def test_local_export_ships_the_product_without_internal_files(self):
    exported = self.workflows["export_local"].export(self.tree)
    paths = sorted(exported)
    for path in (
        "WORKSPACE",
        "README.md",
        "CONTRIBUTING.md",
        ".bazelrc",
        "third_party/py/requirements_lock.txt",
        "maxtext/BUILD",
    ):
      self.assertIn(path, paths)
    self.assertEqual(
        [p for p in paths if p.startswith((".ci/", "tools/copybara/"))], []
    )
    self.assertEqual(
        exported["CONTRIBUTING.md"],
        self.tree["tools/copybara/PUBLIC_CONTRIBUTING.md"],
    )

  def test_strip_markers_remove_lines_and_blocks_but_not_prose(self):
    source = {
        "pkg/a.py": (
            "keep = 1\n"
            "secret = 2  # copybara:strip\n"
            "# copybara:strip_begin\n"
            "internal_only()\n"
            "# copybara:strip_end\n"
            "also_keep = 3\n"
        ),
        "README.md": (
            "Mark a line with `# copybara:strip` at its end to drop it.\n"
        ),
    }
    out = source
    for transformation in self.env["STRIP_TRANSFORMATIONS"]:
      out = transformation.apply(out)
    self.assertEqual(out["pkg/a.py"], "keep = 1\nalso_keep = 3\n")
    self.assertEqual(out["README.md"], source["README.md"])

  def test_scrubber_removes_internal_trailers(self):
    scrubbers = [
        t
        for t in self.workflows["export"].transformations
        if isinstance(t, copybara_standins.Scrubber)
    ]
    self.assertLen(scrubbers, 1)
    message = "Fix the flush.\n\nInternal-Change: 1234\nReviewed-by: someone\n"
    self.assertNotIn("Internal-Change", scrubbers[0].scrub(message))
    self.assertIn("Fix the flush.", scrubbers[0].scrub(message))


if __name__ == "__main__":
  absltest.main()
