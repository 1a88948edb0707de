"""Tests for the pip repository's BUILD generator."""

import os
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import packaging

from third_party.py import generate_build


class _FakeDist:

  def __init__(self, files):
    self.files = files


class GenerateBuildTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("dash", "absl-py", "absl_py"),
      ("dots_and_case", "Zope.Interface", "zope_interface"),
      ("runs", "a-_.b", "a_b"),
  )
  def test_normalize(self, name, expected):
    self.assertEqual(generate_build.normalize(name), expected)

  def test_break_cycles_drops_only_closing_edges(self):
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}
    # Cycle breaking is a private step of main(), tested here on its own.
    # pylint: disable-next=protected-access
    acyclic, dropped = generate_build._break_cycles(graph)
    self.assertEqual(dropped, [("c", "a")])
    self.assertEqual(acyclic, {"a": ["b"], "b": ["c"], "c": [], "d": ["a"]})

  def test_files_skip_outside_and_unsafe_paths(self):
    dist = _FakeDist(
        ["pkg/a.py", "../../bin/tool", "pkg/with space.txt", "pkg/a.py"]
    )
    # File selection is a private step of main(), tested here on its own.
    # pylint: disable-next=protected-access
    kept, skipped = generate_build._files(dist)
    self.assertEqual(kept, ["site-packages/pkg/a.py"])
    self.assertEqual(skipped, ["pkg/with space.txt"])

  def test_generates_library_per_installed_distribution(self):
    root = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    site = os.path.join(root, "site-packages")
    # Hand-written distributions: "alpha" requires "beta" unconditionally, an
    # absent package, and "gamma" and "delta" only under extras (ignored unless
    # asked for).
    for name, requires in (
        (
            "alpha",
            [
                "beta>=1",
                "missing",
                'gamma; extra == "x"',
                'delta; extra == "y"',
            ],
        ),
        ("beta", []),
        ("gamma", []),
        ("delta", []),
    ):
      info = os.path.join(site, "%s-1.0.dist-info" % name)
      os.makedirs(info)
      os.makedirs(os.path.join(site, name), exist_ok=True)
      with open(os.path.join(site, name, "__init__.py"), "w", encoding="utf-8"):
        pass
      with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write("Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n" % name)
        for req in requires:
          f.write("Requires-Dist: %s\n" % req)
      with open(os.path.join(info, "RECORD"), "w", encoding="utf-8") as f:
        f.write(
            "%s/__init__.py,,\n%s-1.0.dist-info/METADATA,,\n" % (name, name)
        )
    # The generator imports `packaging` from the tree it scans; make one
    # visible there.
    os.symlink(
        os.path.dirname(packaging.__file__), os.path.join(site, "packaging")
    )
    output = os.path.join(root, "BUILD")
    subprocess.run(
        [sys.executable, generate_build.__file__, site, output], check=True
    )
    with open(output, encoding="utf-8") as f:
      build = f.read()
    self.assertIn('name = "alpha"', build)
    self.assertIn('name = "beta"', build)
    self.assertIn('deps = [":beta"],', build)
    self.assertNotIn(":missing", build)
    self.assertNotIn(":gamma", build)
    self.assertIn('"site-packages/alpha/__init__.py"', build)
    # Asking for alpha's extra "y" (as the TPU set asks for jax[tpu]) adds
    # delta.
    subprocess.run(
        [
            sys.executable,
            generate_build.__file__,
            site,
            output,
            '{"Alpha": ["y"]}',
        ],
        check=True,
    )
    with open(output, encoding="utf-8") as f:
      self.assertIn('deps = [":beta", ":delta"],', f.read())


if __name__ == "__main__":
  absltest.main()
