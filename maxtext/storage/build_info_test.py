"""Tests of build_info: the stamped revision, and git's when there is none."""

import json
import os
import subprocess

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.storage import build_info

_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _git(directory, *args):
  return subprocess.run(
      ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
      cwd=directory,
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()


def _checkout(directory):
  """A real git checkout at `directory` with one commit; returns the commit."""
  _git(directory, "init", "-q", ".")
  with open(os.path.join(directory, "README.md"), "w", encoding="utf-8") as f:
    f.write("sources\n")
  _git(directory, "add", "README.md")
  _git(directory, "commit", "-q", "-m", "first")
  return _git(directory, "rev-parse", "HEAD")


def _write_stamp(root, document):
  path = os.path.join(root, build_info.STAMP_PATH)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(document if isinstance(document, str) else json.dumps(document))
  return path


class StampTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("clean", _COMMIT),
      ("dirty", _COMMIT + "+dirty"),
      ("built_without_git", "unknown"),
  )
  def test_stamp_is_read_before_git(self, revision):
    root = self.create_tempdir().full_path
    _checkout(root)  # The stamp names the build; git would name this repo.
    _write_stamp(
        root,
        {
            "git_revision": revision,
            "git_commit": _COMMIT,
            "git_dirty": False,
            "build_time_utc": "2023-11-14T22:13:20+00:00",
        },
    )
    info = build_info.current({}, loaded_root=root, source_root=root)
    self.assertEqual(
        info,
        build_info.BuildInfo(
            git_revision=revision,
            source="stamped",
            build_time_utc="2023-11-14T22:13:20+00:00",
        ),
    )
    self.assertEqual(
        info.provenance(),
        {
            "git_revision": revision,
            "git_revision_source": "stamped",
            "build_time_utc": "2023-11-14T22:13:20+00:00",
        },
    )

  @parameterized.named_parameters(
      ("not_json", "{", "not JSON"),
      ("not_object", "[]", "not a JSON object"),
      ("short_revision", {"git_revision": "abc123"}, "git_revision='abc123'"),
      ("no_revision", {"build_time_utc": None}, "git_revision=None"),
      (
          "bad_time",
          {"git_revision": _COMMIT, "build_time_utc": 5},
          "build_time_utc=5",
      ),
  )
  def test_broken_stamp_is_an_error(self, document, message):
    root = self.create_tempdir().full_path
    path = _write_stamp(root, document)
    with self.assertRaisesRegex(ValueError, message) as raised:
      build_info.current({}, loaded_root=root, source_root=root)
    self.assertIn(path, str(raised.exception))

  def test_missing_stamp_reads_as_none(self):
    self.assertIsNone(
        build_info.read_stamp(
            os.path.join(self.create_tempdir().full_path, "build_info.json")
        )
    )


class GitFallbackTest(absltest.TestCase):

  def test_checkout_root_gives_its_revision_and_dirty_flag(self):
    root = self.create_tempdir().full_path
    commit = _checkout(root)
    info = build_info.current({}, loaded_root=root, source_root=root)
    self.assertEqual(info, build_info.BuildInfo(commit, "git"))
    self.assertRegex(commit, r"^[0-9a-f]{40}$")
    # Untracked files (build outputs, scratch) leave the tree unmodified.
    with open(os.path.join(root, "scratch.txt"), "w", encoding="utf-8") as f:
      f.write("x")
    self.assertEqual(build_info.git_revision(root), commit)
    with open(os.path.join(root, "README.md"), "a", encoding="utf-8") as f:
      f.write("edited\n")
    self.assertEqual(
        build_info.current({}, root, root).git_revision, commit + "+dirty"
    )

  def test_bazel_run_workspace_comes_first(self):
    workspace = self.create_tempdir().full_path
    commit = _checkout(workspace)
    other = self.create_tempdir().full_path
    _checkout(other)
    info = build_info.current(
        {"BUILD_WORKSPACE_DIRECTORY": workspace},
        loaded_root=other,
        source_root=other,
    )
    self.assertEqual(info.git_revision, commit)

  def test_copy_inside_another_repository_is_unknown(self):
    outer = self.create_tempdir().full_path
    _checkout(outer)
    copy = os.path.join(outer, "benchmarks", "implementations", "maxtext")
    os.makedirs(copy)
    self.assertIsNone(build_info.git_revision(copy))
    self.assertEqual(
        build_info.current({}, loaded_root=copy, source_root=copy),
        build_info.BuildInfo("unknown", "unknown"),
    )

  def test_no_checkout_is_unknown(self):
    root = self.create_tempdir().full_path
    info = build_info.current(
        {"BUILD_WORKSPACE_DIRECTORY": root}, loaded_root=root, source_root=root
    )
    self.assertEqual(
        info.provenance(),
        {
            "git_revision": "unknown",
            "git_revision_source": "unknown",
            "build_time_utc": None,
        },
    )

  def test_this_unstamped_test_reads_git_or_unknown(self):
    # A test target is never stamped: no build_info.json beside the module.
    info = build_info.current({})
    self.assertIn(info.source, ("git", "unknown"))
    self.assertRegex(
        info.git_revision, r"^(?:[0-9a-f]{40}(?:\+dirty)?|unknown)$"
    )

  def test_the_loaded_code_keeps_its_first_answer(self):
    first = build_info.loaded()
    self.assertIs(build_info.loaded(), first)
    self.assertIn(first.source, ("git", "unknown"))
    # The first answer is what `current` said; asking again later may differ
    # once the checkout changes, the loaded code does not.
    self.assertEqual(build_info.loaded.cache_info().misses, 1)


if __name__ == "__main__":
  absltest.main()
