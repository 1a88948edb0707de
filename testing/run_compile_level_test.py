"""`run_compile_level` drops the compile-level flags and keeps the rest."""

import os
import shlex

from absl.testing import absltest

from testing import run_compile_level


def _bazelrc_xla_flags() -> str:
  """The XLA_FLAGS of `.bazelrc`'s plain `test --test_env=` line."""
  path = os.path.join(os.path.dirname(__file__), "..", ".bazelrc")
  with open(path, encoding="utf-8") as f:
    for line in f:
      words = shlex.split(line, comments=True)
      if words[:1] == ["test"]:
        for word in words[1:]:
          if word.startswith("--test_env=XLA_FLAGS="):
            return word.split("=", 2)[2]
  raise AssertionError(f"{path}: no test --test_env=XLA_FLAGS= line")


class RunCompileLevelTest(absltest.TestCase):

  def test_drops_the_level_flags_and_keeps_the_others(self):
    environ = {
        "XLA_FLAGS": "--xla_backend_optimization_level=0 "
        "--xla_force_host_platform_device_count=2 "
        "--xla_llvm_disable_expensive_passes=true --xla_dump_to=/tmp/x "
        "--xla_cpu_use_fusion_emitters=false"
    }
    run_compile_level.request(environ)
    self.assertEqual(
        environ["XLA_FLAGS"],
        "--xla_force_host_platform_device_count=2 --xla_dump_to=/tmp/x",
    )

  def test_no_flags(self):
    environ = {}
    run_compile_level.request(environ)
    self.assertEqual(environ["XLA_FLAGS"], "")

  def test_undoes_every_flag_the_suite_sets(self):
    # A flag added to .bazelrc's test XLA_FLAGS and not to LEVEL_FLAGS
    # would stay in the comparisons that must compile as runs do.
    flags = _bazelrc_xla_flags()
    self.assertNotEqual(flags, "")
    self.assertEqual(run_compile_level.without_level_flags(flags), "")


if __name__ == "__main__":
  absltest.main()
