"""The lower layers never load the MLPerf logging package.

docs/ARCHITECTURE.md's dependency rule: the config, the optimizer, the
engine, the model, the data and the storage sit below the MLPerf log
(`maxtext/mllog/`) and import nothing of it. Each module is imported in a
fresh interpreter, one after another, and the first one that brings
`mlperf_logging` into `sys.modules` is named.
"""

import glob
import os

from absl.testing import absltest

from testing import runfiles

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Imports each module named on the command line in turn; exits 3 naming the
# first one after which `mlperf_logging` is loaded.
_SCRIPT = """
import importlib
import sys
for name in sys.argv[1:]:
  importlib.import_module(name)
  if "mlperf_logging" in sys.modules:
    print(name)
    sys.exit(3)
"""


def _package_modules(package: str) -> list[str]:
  """Every module of a maxtext package directory but its tests."""
  directory = os.path.join(_ROOT, *package.split("."))
  return sorted(
      f"{package}.{os.path.basename(path)[:-3]}"
      for path in glob.glob(os.path.join(directory, "*.py"))
      if not path.endswith("_test.py") and not path.endswith("__init__.py")
  )


# The modules below the MLPerf log.
_LOWER = (
    "maxtext.checks",
    "maxtext.choices",
    "maxtext.config_lib",
    "maxtext.optimizer",
    "maxtext.data",
    "maxtext.engine",
    *_package_modules("maxtext.model"),
    *_package_modules("maxtext.storage"),
)


def _first_loader(modules) -> str:
  """The first of `modules` whose import loads mlperf_logging, or ""."""
  proc = runfiles.run_python(_SCRIPT, modules, timeout_s=300)
  if proc.returncode not in (0, 3):
    raise AssertionError(f"importing {modules} failed:\n{proc.stderr}")
  return proc.stdout.strip() if proc.returncode == 3 else ""


class LayeringTest(absltest.TestCase):

  def test_lower_layers_do_not_load_mlperf_logging(self):
    self.assertIn("maxtext.storage.run_record", _LOWER)
    self.assertIn("maxtext.model.transformer", _LOWER)
    self.assertEqual(_first_loader(_LOWER), "")

  def test_the_check_sees_a_module_that_loads_it(self):
    self.assertEqual(
        _first_loader(["maxtext.optimizer", "maxtext.mllog.rules"]),
        "maxtext.mllog.rules",
    )


if __name__ == "__main__":
  absltest.main()
