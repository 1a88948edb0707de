"""Tests of write_build_info: workspace status files -> build_info.json."""

import json
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized

from tools.zipapp import write_build_info

_COMMIT = "0123456789abcdef0123456789abcdef01234567"


class BuildInfoTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("clean", "false", f"{_COMMIT}", False),
      ("dirty", "true", f"{_COMMIT}+dirty", True),
      ("dirty_unknown", "unknown", f"{_COMMIT}", None),
  )
  def test_revision_and_dirty_flag(self, dirty, revision, flag):
    info = write_build_info.build_info(
        {"STABLE_GIT_COMMIT": _COMMIT, "STABLE_GIT_DIRTY": dirty},
        {"BUILD_TIMESTAMP": "1700000000"},
    )
    self.assertEqual(info["git_revision"], revision)
    self.assertEqual(info["git_commit"], _COMMIT)
    self.assertEqual(info["git_dirty"], flag)
    self.assertEqual(info["build_time_utc"], "2023-11-14T22:13:20+00:00")

  @parameterized.named_parameters(
      ("unknown", "unknown"),
      ("missing", None),
      ("short", "abc123"),
      ("upper_case", _COMMIT.upper()),
  )
  def test_anything_but_a_commit_is_unknown(self, commit):
    stable = {"STABLE_GIT_DIRTY": "true"}
    if commit is not None:
      stable["STABLE_GIT_COMMIT"] = commit
    info = write_build_info.build_info(stable, {})
    self.assertEqual(info["git_revision"], "unknown")
    self.assertEqual(info["git_commit"], "unknown")
    self.assertIsNone(info["git_dirty"])
    self.assertIsNone(info["build_time_utc"])

  def test_main_reads_status_files_and_writes_json(self):
    directory = self.create_tempdir()
    stable = directory.create_file(
        "stable-status.txt",
        f"BUILD_EMBED_LABEL \nBUILD_HOST h\nSTABLE_GIT_COMMIT {_COMMIT}\n"
        "STABLE_GIT_DIRTY true\n",
    ).full_path
    volatile = directory.create_file(
        "volatile-status.txt", "BUILD_TIMESTAMP 1700000000\n"
    ).full_path
    output = os.path.join(directory.full_path, "build_info.json")
    subprocess.run(
        [
            sys.executable,
            write_build_info.__file__,
            "--stable_status",
            stable,
            "--volatile_status",
            volatile,
            "--output",
            output,
        ],
        check=True,
    )
    with open(output, encoding="utf-8") as f:
      self.assertEqual(
          json.load(f),
          {
              "git_revision": f"{_COMMIT}+dirty",
              "git_commit": _COMMIT,
              "git_dirty": True,
              "build_time_utc": "2023-11-14T22:13:20+00:00",
          },
      )


if __name__ == "__main__":
  absltest.main()
