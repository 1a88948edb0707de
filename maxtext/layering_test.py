"""The packages of maxtext/ sit on layers; imports point down, never round.

docs/ARCHITECTURE.md's rule table (`LAYERS`, which the docs' package table
must equal): each package of `maxtext/` sits on one layer. A module may
import modules of its own package, of packages on lower layers, and of other
packages on its own layer as long as no cycle between packages forms.
Nothing under `maxtext/` imports `testing/`. The imports are read statically
(`ast`) from every non-test module under `maxtext/` in this test's runfiles
(each package's `sources` filegroup), lazy imports inside functions
included.

The layers below the MLPerf log (`maxtext/mllog/`) never load
`mlperf_logging`: each of their modules is imported in a fresh interpreter,
one after another, and the first one that brings it into `sys.modules` is
named.
"""

import ast
import collections
import glob
import os
import re
from typing import Mapping

from absl.testing import absltest

from testing import runfiles

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# docs/ARCHITECTURE.md's "Packages" table: package -> layer, 0 the lowest.
LAYERS = {
    "maxtext.core": 0,
    "maxtext.configs": 0,
    "maxtext.config": 1,
    "maxtext.runtime": 1,
    "maxtext.text": 1,
    "maxtext.listeners": 1,
    "maxtext.metrics": 2,
    "maxtext.storage": 2,
    "maxtext.data": 2,
    "maxtext.model": 3,
    "maxtext.engine": 4,
    "maxtext.generation": 4,
    "maxtext.hf": 4,
    "maxtext.mllog": 5,
    "maxtext.env": 5,
    "maxtext.run": 6,
    "maxtext.grpo.loss": 7,
    "maxtext.grpo.rewards": 7,
    "maxtext.sft": 7,
    "maxtext.grpo.rollout": 8,
    "maxtext.grpo.tasks": 9,
    "maxtext.grpo": 10,
    "maxtext": 11,
}


def source_modules(root: str = _ROOT) -> dict[str, str]:
  """Every non-test module under root/maxtext: dotted name -> file path."""
  modules = {}
  for path in glob.glob(
      os.path.join(root, "maxtext", "**", "*.py"), recursive=True
  ):
    relative = os.path.relpath(path, root)[: -len(".py")]
    if relative.endswith("_test") or relative.endswith("__init__"):
      continue
    modules[relative.replace(os.sep, ".")] = path
  return modules


def imports_of(source: str, known: set[str]) -> set[str]:
  """The maxtext and testing modules (or packages) `source` imports.

  `from maxtext.pkg import name` is the module `maxtext.pkg.name` when that
  is a known module, else the package `maxtext.pkg` (a name in it).
  """
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names = [
          f"{node.module}.{alias.name}"
          if f"{node.module}.{alias.name}" in known
          else node.module
          for alias in node.names
      ]
    else:
      continue
    found.update(
        name for name in names if name.split(".")[0] in ("maxtext", "testing")
    )
  return found


def import_graph(modules: Mapping[str, str]) -> dict[str, set[str]]:
  """Module -> the maxtext/testing modules it imports, read from its file."""
  known = set(modules)
  graph = {}
  for name, path in modules.items():
    with open(path, encoding="utf-8") as f:
      graph[name] = imports_of(f.read(), known)
  return graph


def package_of(module: str, packages) -> str:
  """The package (directory) of `module`; `module` itself if it is one of
  `packages` (an import of a name from a package's namespace)."""
  if module in packages:
    return module
  return module.rsplit(".", 1)[0]


def _cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one node (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for succ in sorted(edges.get(node, ())):
      if succ not in index:
        visit(succ)
        low[node] = min(low[node], low[succ])
      elif succ in on_stack:
        low[node] = min(low[node], index[succ])
    if low[node] == index[node]:
      component = []
      while True:
        top = stack.pop()
        on_stack.discard(top)
        component.append(top)
        if top == node:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for node in sorted(edges):
    if node not in index:
      visit(node)
  return found


def layering_problems(
    graph: Mapping[str, set[str]], layers: Mapping[str, int]
) -> list[str]:
  """Every import of `graph` that breaks the rule of `layers`, one line each.

  Args:
    graph: module -> the modules (or packages) it imports.
    layers: package -> layer.

  Returns:
    Lines naming: a module of a package without a layer; an import of
    `testing`; an import that points up a layer; each cycle between
    packages, with the imports that close it. Empty when the rule holds.
  """
  problems = []
  package_edges = collections.defaultdict(set)
  witnesses = {}
  for module in sorted(graph):
    source = package_of(module, layers)
    if source not in layers:
      problems.append(f"{module}: package {source} has no layer")
      continue
    for imported in sorted(graph[module]):
      if imported.split(".")[0] == "testing":
        problems.append(
            f"{module} imports {imported}: maxtext/ never imports testing/"
        )
        continue
      target = package_of(imported, layers)
      if target == source:
        continue
      if target not in layers:
        problems.append(
            f"{module} imports {imported}: package {target} has no layer"
        )
        continue
      if layers[target] > layers[source]:
        problems.append(
            f"{module} imports {imported}: {target} (layer "
            f"{layers[target]}) is above {source} (layer {layers[source]})"
        )
      package_edges[source].add(target)
      witnesses.setdefault((source, target), f"{module} -> {imported}")
  for component in _cycles(package_edges):
    members = set(component)
    closing = sorted(
        witness
        for (source, target), witness in witnesses.items()
        if source in members and target in members
    )
    problems.append(
        f"cycle between packages {', '.join(component)}: {'; '.join(closing)}"
    )
  return problems


def _docs_table() -> dict[str, int]:
  """docs/ARCHITECTURE.md's package table: `| `maxtext/pkg/` | layer | ...`."""
  with open(
      os.path.join(_ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8"
  ) as f:
    text = f.read()
  rows = re.findall(r"^\| `(maxtext(?:/\w+)*)/` \| (\d+) \|", text, re.M)
  return {path.replace("/", "."): int(layer) for path, layer in rows}


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


def _below_mllog() -> list[str]:
  """Every module of the packages on layers below the MLPerf log's."""
  below = {p for p, layer in LAYERS.items() if layer < LAYERS["maxtext.mllog"]}
  return sorted(m for m in source_modules() if package_of(m, LAYERS) in below)


def _first_loader(modules) -> str:
  """The first of `modules` whose import loads mlperf_logging, or ""."""
  proc = runfiles.run_python(_SCRIPT, modules, timeout_s=300)
  if proc.returncode not in (0, 3):
    raise AssertionError(f"importing {modules} failed:\n{proc.stderr}")
  return proc.stdout.strip() if proc.returncode == 3 else ""


class LayeringTest(absltest.TestCase):

  def test_docs_table_is_the_rule_table(self):
    self.assertEqual(_docs_table(), LAYERS)

  def test_every_package_has_a_layer_and_every_layer_a_package(self):
    modules = source_modules()
    self.assertIn("maxtext.run.trainer", modules)
    self.assertIn("maxtext.workloads", modules)
    packages = {package_of(m, LAYERS) for m in modules}
    self.assertEqual(packages, set(LAYERS))

  def test_imports_point_down_and_never_round(self):
    graph = import_graph(source_modules())
    self.assertIn("maxtext.core.checks", graph["maxtext.config.config_lib"])
    self.assertEqual(layering_problems(graph, LAYERS), [])

  def test_no_two_modules_share_a_name(self):
    names = collections.defaultdict(list)
    for module in source_modules():
      names[module.rsplit(".", 1)[-1]].append(module)
    self.assertEqual({n: m for n, m in names.items() if len(m) > 1}, {})

  def test_the_check_sees_an_upward_import_and_a_cycle(self):
    layers = {"maxtext.low": 0, "maxtext.a": 1, "maxtext.b": 1, "maxtext": 2}
    graph = {
        "maxtext.low.base": {"maxtext.a.x"},  # Up a layer.
        "maxtext.a.x": {"maxtext.b.y"},
        "maxtext.b.y": {"maxtext.a"},  # Closes a -> b -> a.
        "maxtext.main": {"maxtext.a.x", "testing.fake"},
        "maxtext.odd.z": set(),
    }
    self.assertEqual(
        layering_problems(graph, layers),
        [
            "maxtext.low.base imports maxtext.a.x: maxtext.a (layer 1) is "
            "above maxtext.low (layer 0)",
            "maxtext.main imports testing.fake: maxtext/ never imports "
            "testing/",
            "maxtext.odd.z: package maxtext.odd has no layer",
            "cycle between packages maxtext.a, maxtext.b: "
            "maxtext.a.x -> maxtext.b.y; maxtext.b.y -> maxtext.a",
        ],
    )
    # Without the upward edge and the cycle, the same graph passes.
    graph["maxtext.low.base"] = set()
    graph["maxtext.b.y"] = set()
    graph["maxtext.main"] = {"maxtext.a.x"}
    del graph["maxtext.odd.z"]
    self.assertEqual(layering_problems(graph, layers), [])

  def test_imports_are_read_statically_lazy_ones_included(self):
    source = (
        "from maxtext.core import checks\n"
        "import maxtext.model.transformer\n"
        "from maxtext.data import dataset as d\n"
        "def f():\n"
        "  from maxtext.run import trainer\n"
        "  from maxtext.data import Thing\n"
    )
    known = {
        "maxtext.core.checks",
        "maxtext.data.dataset",
        "maxtext.run.trainer",
    }
    self.assertEqual(
        imports_of(source, known),
        {
            "maxtext.core.checks",
            "maxtext.model.transformer",
            "maxtext.data.dataset",
            "maxtext.run.trainer",
            "maxtext.data",
        },
    )

  def test_lower_layers_do_not_load_mlperf_logging(self):
    lower = _below_mllog()
    self.assertIn("maxtext.storage.run_record", lower)
    self.assertIn("maxtext.model.transformer", lower)
    self.assertIn("maxtext.engine.engine", lower)
    self.assertNotIn("maxtext.mllog.rules", lower)
    self.assertEqual(_first_loader(lower), "")

  def test_the_check_sees_a_module_that_loads_it(self):
    self.assertEqual(
        _first_loader(["maxtext.config.optimizer", "maxtext.mllog.rules"]),
        "maxtext.mllog.rules",
    )


if __name__ == "__main__":
  absltest.main()
