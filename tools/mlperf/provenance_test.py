"""Tests of the provenance rules: runs' recorded revisions vs the packager's.

Runs here are RunLogs as `run_logs.read_run` returns them; reading real run
directories, and the packager binary on them, is package_test's.
"""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.storage import build_info
from tools.mlperf import provenance
from tools.mlperf import run_logs

_A = "a" * 40
_B = "b" * 40


def fake_run(i, revision=_A, division="open", log_revision=None):
  """Run `i` as read_run returns it, recorded under `revision`."""
  return run_logs.RunLog(
      run_dir=f"/runs/run_{i}",
      log_path=f"/runs/run_{i}/mllog.log",
      org="acme",
      system="box",
      division=division,
      status="onprem",
      benchmark="llama31_8b",
      ruleset="6.1.0",
      seed=i,
      config={},
      provenance={} if revision is None else {"git_revision": revision},
      log_revision=revision if log_revision is None else log_revision,
  )


def runs(count=3, **fields):
  return [fake_run(i, **fields) for i in range(count)]


def build(revision=_A, source=build_info.SOURCE_STAMPED):
  return build_info.BuildInfo(revision, source, "2025-01-02T03:04:05Z")


class CheckRunsTest(parameterized.TestCase):

  @parameterized.named_parameters(("open", "open"), ("closed", "closed"))
  def test_runs_of_the_packagers_clean_revision_pass(self, division):
    self.assertEqual(
        provenance.check_runs(runs(division=division), build()), []
    )

  @parameterized.named_parameters(
      (
          "different",
          dict(revision=_B),
          build(),
          f"'{_B}', the packaged implementation is '{_A}': a different",
      ),
      (
          "run_unknown",
          dict(revision="unknown"),
          build(),
          f"'unknown', the packaged implementation is '{_A}': the revision "
          f"is unknown",
      ),
      (
          "nothing_recorded",
          dict(revision=None, log_revision="unknown"),
          build(),
          "'unknown', the packaged implementation is",
      ),
      (
          "packager_unknown",
          {},
          build("unknown", build_info.SOURCE_UNKNOWN),
          f"'{_A}', the packaged implementation is 'unknown': the revision "
          f"is unknown",
      ),
      (
          "dirty",
          dict(revision=_A + "+dirty"),
          build(_A + "+dirty"),
          r"implementation is '" + _A + r"\+dirty': built from a modified",
      ),
      (
          "log_disagrees",
          dict(log_revision=_B),
          build(),
          f"its MLPerf log names git_revision '{_B}' but its config.json "
          f"records '{_A}'",
      ),
  )
  def test_open_warns_and_closed_refuses(self, fields, packager, pattern):
    warnings = provenance.check_runs(runs(**fields), packager)
    self.assertLen(warnings, 3)
    for i, warning in enumerate(warnings):
      self.assertRegex(warning, rf"^/runs/run_{i}: .*{pattern}")
      self.assertNotIn("\n", warning)

    with self.assertRaisesRegex(
        provenance.ProvenanceError,
        rf"^closed division: 3 of 3 runs do not name the packaged "
        rf"implementation's clean revision.*\n  /runs/run_0: .*{pattern}",
    ) as raised:
      provenance.check_runs(runs(division="closed", **fields), packager)
    lines = str(raised.exception).splitlines()[1:]
    self.assertEqual(
        [line.split(":")[0].strip() for line in lines],
        ["/runs/run_0", "/runs/run_1", "/runs/run_2"],
    )

  @parameterized.named_parameters(("open", "open"), ("closed", "closed"))
  def test_runs_of_different_revisions_are_refused(self, division):
    mixed = [
        fake_run(0, division=division),
        fake_run(1, _B, division=division),
        fake_run(2, division=division),
    ]
    with self.assertRaisesRegex(
        provenance.ProvenanceError,
        rf"built from 2 different revisions.*\n  {_A}: /runs/run_0, "
        rf"/runs/run_2\n  {_B}: /runs/run_1$",
    ):
      provenance.check_runs(mixed, build())

  def test_unknown_and_a_revision_differ(self):
    mixed = [fake_run(0), fake_run(1, "unknown")]
    with self.assertRaisesRegex(provenance.ProvenanceError, "2 different"):
      provenance.check_runs(mixed, build())

  def test_build_must_be_build_info(self):
    with self.assertRaisesRegex(TypeError, "build must be a build_info"):
      provenance.check_runs(runs(), {"git_revision": _A})


class BuildInfoFileTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("clean", _A, (_A, False)),
      ("dirty", _A + "+dirty", (_A, True)),
      ("unknown", "unknown", ("unknown", None)),
  )
  def test_split_revision(self, revision, expected):
    self.assertEqual(provenance.split_revision(revision), expected)

  def test_writes_the_packagers_build_and_the_runs_revision(self):
    impl = self.create_tempdir().full_path
    path = provenance.write_build_info(
        impl,
        build(_A + "+dirty", build_info.SOURCE_GIT),
        runs(revision=_B),
        ["w1", "w2"],
    )
    self.assertEqual(path, os.path.join(impl, "build_info.json"))
    with open(path, encoding="utf-8") as f:
      document = json.load(f)
    self.assertEqual(
        document,
        {
            "git_revision": _A + "+dirty",
            "commit": _A,
            "modified": True,
            "git_revision_source": "git",
            "build_time_utc": "2025-01-02T03:04:05Z",
            "runs_git_revision": _B,
            "warnings": ["w1", "w2"],
        },
    )

  def test_a_written_file_reads_back_as_the_stamp_it_names(self):
    # The implementation's build_info.json is a build_info document: the
    # stamp reader accepts it and gets the same revision.
    impl = self.create_tempdir().full_path
    path = provenance.write_build_info(impl, build(), runs())
    stamp = build_info.read_stamp(path)
    self.assertEqual(stamp.git_revision, _A)
    self.assertEqual(stamp.build_time_utc, "2025-01-02T03:04:05Z")


if __name__ == "__main__":
  absltest.main()
