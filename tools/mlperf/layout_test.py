"""Tests of the submission tree's paths and the files written into it."""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized

from tools.mlperf import layout


class LayoutTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path

  def test_paths_are_the_ones_the_checkers_walk(self):
    self.assertEqual(
        layout.system_json("o", "acme", "box"), "o/acme/systems/box.json"
    )
    self.assertEqual(
        layout.result_file("o", "acme", "box", "llama31_8b", 3),
        "o/acme/results/box/llama31_8b/result_3.txt",
    )
    self.assertEqual(
        layout.implementation_dir("o", "acme", "llama31_8b", "impl"),
        "o/acme/benchmarks/llama31_8b/implementations/impl",
    )

  @parameterized.named_parameters(
      ("empty", ""), ("dot", "."), ("dotdot", ".."), ("slash", "a/b")
  )
  def test_bad_names(self, name):
    with self.assertRaisesRegex(ValueError, "org="):
      layout.check_name("org", name)

  def test_write_results_copies_logs_in_order_and_refuses_a_second_time(self):
    logs = []
    for i in range(3):
      logs.append(os.path.join(self.tmp, f"log{i}"))
      with open(logs[-1], "w", encoding="utf-8") as f:
        f.write(f"log {i}\n")
    out = os.path.join(self.tmp, "out")
    written = layout.write_results(out, "acme", "box", "b", logs)
    self.assertEqual(
        [os.path.basename(p) for p in written],
        ["result_0.txt", "result_1.txt", "result_2.txt"],
    )
    with open(written[2], encoding="utf-8") as f:
      self.assertEqual(f.read(), "log 2\n")
    with self.assertRaisesRegex(FileExistsError, "not empty"):
      layout.write_results(out, "acme", "box", "b", logs)

  def test_write_system_json(self):
    path = os.path.join(self.tmp, "o", "acme", "systems", "box.json")
    layout.write_system_json(path, {"a": "1"})
    with open(path, encoding="utf-8") as f:
      self.assertEqual(json.load(f), {"a": "1"})

  def test_copy_implementation_follows_links_and_skips_caches(self):
    root = os.path.join(self.tmp, "root")
    os.makedirs(os.path.join(root, "maxtext", "__pycache__"))
    os.makedirs(os.path.join(root, "tools", "mlperf"))
    target = os.path.join(self.tmp, "real.py")
    with open(target, "w", encoding="utf-8") as f:
      f.write("x = 1\n")
    os.symlink(target, os.path.join(root, "maxtext", "trainer.py"))
    for name in (
        "maxtext/__pycache__/t.pyc",
        "maxtext/a.pyc",
        "README.md",
        "tools/mlperf/package.py",
        "tools/other.py",
    ):
      with open(os.path.join(root, name), "w", encoding="utf-8") as f:
        f.write("")
    dest = os.path.join(self.tmp, "impl")
    copied = layout.copy_implementation(dest, root)
    self.assertEqual(copied, ["README.md", "maxtext", "tools/mlperf"])
    trainer = os.path.join(dest, "maxtext", "trainer.py")
    self.assertFalse(os.path.islink(trainer))
    with open(trainer, encoding="utf-8") as f:
      self.assertEqual(f.read(), "x = 1\n")
    self.assertFalse(os.path.exists(os.path.join(dest, "maxtext", "a.pyc")))
    self.assertFalse(
        os.path.exists(os.path.join(dest, "maxtext", "__pycache__"))
    )
    self.assertFalse(os.path.exists(os.path.join(dest, "tools", "other.py")))
    with self.assertRaisesRegex(FileExistsError, "exists"):
      layout.copy_implementation(dest, root)

  def test_copy_implementation_needs_the_maxtext_package(self):
    with self.assertRaisesRegex(FileNotFoundError, "no maxtext/"):
      layout.copy_implementation(os.path.join(self.tmp, "impl"), self.tmp)

  def test_copies_this_programs_own_sources(self):
    dest = os.path.join(self.tmp, "impl")
    copied = layout.copy_implementation(dest)
    self.assertIn("maxtext", copied)
    # The configs are in every tree this module runs from (runfiles too).
    self.assertTrue(
        os.path.isfile(os.path.join(dest, "maxtext", "configs", "default.py"))
    )
    self.assertTrue(
        os.path.isfile(os.path.join(dest, "tools", "mlperf", "layout.py"))
    )

  def test_source_root_prefers_the_workspace_under_bazel_run(self):
    os.makedirs(os.path.join(self.tmp, "maxtext"))
    self.assertEqual(
        layout.source_root({"BUILD_WORKSPACE_DIRECTORY": self.tmp}), self.tmp
    )
    self.assertNotEqual(layout.source_root({}), self.tmp)


if __name__ == "__main__":
  absltest.main()
