"""Each converted package reads only its own settings, never the whole config.

docs/ARCHITECTURE.md, "Component configs": a package with settings owns a
frozen dataclass of them (`maxtext/core/component_config.py`), and its
modules take that dataclass, not the run's `ConfigDict`. Read statically
(`ast`) from every non-test module under `maxtext/` (the sources of
`layering_test`), a converted module:

- never names `ml_collections` (no import, no `ConfigDict` annotation);
- has no parameter `config` or `cfg` (the run config's names) unless it is
  annotated with a settings class: one of its package's, or another
  package's that the caller passes whole (the model's `ModelConfig` to the
  checkpoint converters);
- reads from a parameter annotated with a settings class, or named
  `config`/`cfg`/`settings`, only the fields, properties and methods that
  class declares (its package's classes, for one named but not annotated)
  (`x.field`, `getattr(x, "field")`; a computed name or `x["field"]` is
  refused).

The config files, the top (`maxtext/`'s binaries and `workloads`), the
validator (`config_lib`) and the builder hold the whole config by design.
`NOT_CONVERTED` lists the other modules that still take it (none: every
package is converted): each must fail the check (a module that passes leaves
the list), every other module must pass.
"""

import ast
from typing import Iterable, Mapping, Optional

from absl.testing import absltest

from maxtext import layering_test

# Package -> the settings classes it owns, by the module that declares them.
SETTINGS = {
    "maxtext.config": {
        "maxtext.config.eval_schedule": ("EvalSchedule",),
        "maxtext.config.optimizer": ("OptimizerConfig",),
    },
    "maxtext.data": {"maxtext.data.data_config": ("DataConfig",)},
    "maxtext.engine": {
        "maxtext.engine.compile_config": ("CompileConfig",),
        "maxtext.engine.engine_config": ("EngineConfig",),
    },
    "maxtext.env": {
        "maxtext.env.executor": ("ExecutorConfig",),
    },
    "maxtext.grpo": {
        "maxtext.grpo.grpo_config": ("GrpoConfig",),
        "maxtext.grpo.mlperf_header": ("GrpoMlperfConfig",),
    },
    "maxtext.grpo.loss": {"maxtext.grpo.loss.loss_config": ("LossConfig",)},
    "maxtext.grpo.rollout": {
        "maxtext.grpo.rollout.rollout_config": ("RolloutConfig",)
    },
    "maxtext.grpo.tasks": {"maxtext.grpo.tasks.task_config": ("TaskConfig",)},
    "maxtext.metrics": {"maxtext.metrics.throughput": ("ThroughputConfig",)},
    "maxtext.mllog": {"maxtext.mllog.mlperf_config": ("MlperfConfig",)},
    "maxtext.model": {"maxtext.model.model_config": ("ModelConfig",)},
    "maxtext.run": {
        "maxtext.run.preflight": ("PreflightConfig",),
        "maxtext.run.run_settings": ("RunSettings",),
    },
    "maxtext.runtime": {
        "maxtext.runtime.distributed": ("DistributedConfig",),
        "maxtext.runtime.mesh": ("MeshConfig", "BatchLayout"),
    },
    "maxtext.sft": {"maxtext.sft.sft_workload": ("SftConfig",)},
    "maxtext.storage": {
        "maxtext.storage.checkpoint_config": ("CheckpointConfig",),
        "maxtext.storage.run_dir": ("RunDirConfig",),
    },
}

# What holds the run's config by design: the config files, the top (the
# binaries and `workloads`, which build every settings class from it), the
# validator, and the one builder of settings from it.
DICT_PACKAGES = ("maxtext.configs", "maxtext")
DICT_MODULES = ("maxtext.config.config_lib", "maxtext.core.component_config")

# Names of a parameter that holds the run's config (unless annotated with
# a settings class) or a package's settings.
_CONFIG_NAMES = ("config", "cfg")
_SETTINGS_NAMES = _CONFIG_NAMES + ("settings",)

# Modules that still take the run's whole config (none: every package is
# converted). A module may be listed only while it fails the check, so the
# list never grows back silently: `stale_entries`.
NOT_CONVERTED = frozenset()


def _class_members(tree: ast.Module, names: Iterable[str]) -> set[str]:
  """The fields, properties and methods of the classes `names` in `tree`."""
  wanted = set(names)
  members = set()
  for node in tree.body:
    if isinstance(node, ast.ClassDef) and node.name in wanted:
      for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(
            item.target, ast.Name
        ):
          members.add(item.target.id)
        elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
          members.add(item.name)
  # Every settings class inherits these from ComponentConfig.
  return members | {"validate", "from_config"}


def owned_members(
    sources: Mapping[str, str], settings: Mapping[str, Mapping[str, tuple]]
) -> dict[str, tuple[set[str], set[str]]]:
  """Package -> (its settings classes' names, their members)."""
  owned = {}
  for package, declared in settings.items():
    classes, members = set(), set()
    for module, names in declared.items():
      classes.update(names)
      members |= _class_members(ast.parse(sources[module]), names)
    owned[package] = (classes, members)
  return owned


def class_members(
    sources: Mapping[str, str],
    settings: Mapping[str, Mapping[str, tuple]],
    name: str,
) -> set[str]:
  """The members of the one settings class `name` that `settings` lists."""
  for declared in settings.values():
    for module, names in declared.items():
      if name in names:
        return _class_members(ast.parse(sources[module]), (name,))
  raise KeyError(name)


def _annotation_names(annotation) -> set[str]:
  """Every identifier an annotation mentions (`a.B[C]` -> a, B, C)."""
  if annotation is None:
    return set()
  found = set()
  for node in ast.walk(annotation):
    if isinstance(node, ast.Name):
      found.add(node.id)
    elif isinstance(node, ast.Attribute):
      found.add(node.attr)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      found.update(node.value.replace(".", " ").replace("[", " ").split())
  return found


def _settings_params(
    function,
    classes: set[str],
    members: set[str],
    others: Mapping[str, set[str]],
) -> tuple[dict[str, tuple[str, set[str]]], list[str]]:
  """({parameter holding settings: (what holds it, the members it may
  read)}, problems) of `function`; `classes` and `others` as for
  `read_problems`."""
  args = function.args
  params = args.posonlyargs + args.args + args.kwonlyargs
  params += [a for a in (args.vararg, args.kwarg) if a is not None]
  held, problems = {}, []
  own = f"its package's settings ({', '.join(sorted(classes)) or 'none'})"
  for arg in params:
    mentioned = _annotation_names(arg.annotation)
    foreign = sorted(mentioned & set(others))
    if mentioned & {"ConfigDict", "FrozenConfigDict", "ml_collections"}:
      problems.append(
          f"{function.name}({arg.arg}) takes the run's config "
          f"(annotated {ast.unparse(arg.annotation)})"
      )
    elif mentioned & classes:
      held[arg.arg] = (own, members)
    elif foreign:
      readable = set().union(*(others[name] for name in foreign))
      held[arg.arg] = (", ".join(foreign), readable)
    elif arg.arg in _CONFIG_NAMES:
      problems.append(
          f"{function.name}({arg.arg}) takes the run's config (a parameter "
          f"{arg.arg!r} not annotated with a settings class)"
      )
    elif arg.arg in _SETTINGS_NAMES:
      held[arg.arg] = (own, members)
  return held, problems


def _read(node, held: Mapping[str, tuple]):
  """(parameter name, field read or None for an unreadable one), or None
  when `node` reads nothing from a held parameter."""
  if (
      isinstance(node, ast.Attribute)
      and isinstance(node.value, ast.Name)
      and node.value.id in held
  ):
    return node.value.id, node.attr
  if (
      isinstance(node, ast.Subscript)
      and isinstance(node.value, ast.Name)
      and node.value.id in held
  ):
    return node.value.id, None
  if (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Name)
      and node.func.id in ("getattr", "hasattr")
      and node.args
      and isinstance(node.args[0], ast.Name)
      and node.args[0].id in held
  ):
    name = node.args[1] if len(node.args) > 1 else None
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
      return node.args[0].id, name.value
    return node.args[0].id, None
  return None


def read_problems(
    module: str,
    source: str,
    classes: set[str],
    members: set[str],
    others: Optional[Mapping[str, set[str]]] = None,
) -> list[str]:
  """Every way `source` takes the run's config or reads a field its
  settings do not hold, one line each (empty: the module is converted).

  Args:
    module: the module's dotted name, for the lines.
    source: its text.
    classes: its package's settings classes.
    members: their fields, properties and methods.
    others: the settings classes of other packages, which a caller may pass
      whole, by name -> each one's members.
  """
  tree = ast.parse(source)
  problems = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import) and any(
        a.name.split(".")[0] == "ml_collections" for a in node.names
    ):
      problems.append("imports ml_collections")
    elif (
        isinstance(node, ast.ImportFrom)
        and (node.module or "").split(".")[0] == "ml_collections"
    ):
      problems.append("imports ml_collections")
  for function in ast.walk(tree):
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    held, found = _settings_params(function, classes, members, others or {})
    problems += found
    for node in ast.walk(function):
      read = _read(node, held)
      if read is None:
        continue
      name, field = read
      holder, readable = held[name]
      if field is None:
        problems.append(
            f"{function.name} reads {name} by a computed name or as a dict"
        )
      elif field not in readable:
        problems.append(
            f"{function.name} reads {name}.{field}, a field {holder} do "
            "not hold"
        )
  return [f"{module}: {p}" for p in dict.fromkeys(problems)]


def _sources() -> dict[str, str]:
  sources = {}
  for module, path in layering_test.source_modules().items():
    with open(path, encoding="utf-8") as f:
      sources[module] = f.read()
  return sources


def _problems_of(sources: Mapping[str, str]) -> dict[str, list[str]]:
  """Module -> its problems, for every module below the top but the
  validator and the builder."""
  owned = owned_members(sources, SETTINGS)
  problems = {}
  for module, source in sorted(sources.items()):
    package = layering_test.package_of(module, layering_test.LAYERS)
    if package in DICT_PACKAGES or module in DICT_MODULES:
      continue
    classes, members = owned.get(package, (set(), set()))
    others = {
        name: class_members(sources, SETTINGS, name)
        for other, (names, _) in owned.items()
        if other != package
        for name in names
    }
    problems[module] = read_problems(module, source, classes, members, others)
  return problems


def unlisted_problems(
    problems: Mapping[str, list[str]], not_converted: frozenset
) -> list[str]:
  """The problem lines of every module `not_converted` does not list."""
  return [
      line
      for module, lines in problems.items()
      if module not in not_converted
      for line in lines
  ]


def stale_entries(
    problems: Mapping[str, list[str]], not_converted: frozenset
) -> list[str]:
  """The entries of `not_converted` that are no module the check reads, or
  a module it passes (converted: the entry must go)."""
  return sorted(m for m in not_converted if not problems.get(m))


class ConfigReadsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.sources = _sources()
    cls.problems = _problems_of(cls.sources)

  def test_converted_modules_read_only_their_own_settings(self):
    self.assertIn("maxtext.runtime.mesh", self.problems)
    self.assertIn("maxtext.config.optimizer", self.problems)
    self.assertIn("maxtext.storage.checkpointing", self.problems)
    self.assertEqual(unlisted_problems(self.problems, NOT_CONVERTED), [])

  def test_not_converted_lists_only_modules_that_still_take_the_config(self):
    self.assertEqual(
        stale_entries(self.problems, NOT_CONVERTED),
        [],
        "converted or unknown: remove them from NOT_CONVERTED",
    )

  def test_settings_classes_exist(self):
    owned = owned_members(self.sources, SETTINGS)
    self.assertIn("generation_devices", owned["maxtext.runtime"][1])
    self.assertIn("schedule_steps", owned["maxtext.config"][1])
    self.assertIn("save_period", owned["maxtext.storage"][1])
    self.assertIn("base_output_directory", owned["maxtext.storage"][1])
    for package, declared in SETTINGS.items():
      for module, names in declared.items():
        with self.subTest(module):
          self.assertEqual(
              layering_test.package_of(module, layering_test.LAYERS), package
          )
          tree = ast.parse(self.sources[module])
          classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
          self.assertLessEqual(set(names), classes)


class NotConvertedTest(absltest.TestCase):
  """The list of modules not converted, on problems made up for it."""

  _PROBLEMS = {
      "pkg.old": ["pkg.old: imports ml_collections"],
      "pkg.new": [],
  }

  def test_a_listed_module_that_fails_is_excused(self):
    listed = frozenset({"pkg.old"})
    self.assertEqual(unlisted_problems(self._PROBLEMS, listed), [])
    self.assertEqual(stale_entries(self._PROBLEMS, listed), [])

  def test_an_unlisted_module_that_fails_is_named(self):
    self.assertEqual(
        unlisted_problems(self._PROBLEMS, frozenset()),
        ["pkg.old: imports ml_collections"],
    )

  def test_a_converted_or_unknown_entry_is_stale(self):
    listed = frozenset({"pkg.old", "pkg.new", "pkg.gone"})
    self.assertEqual(
        stale_entries(self._PROBLEMS, listed), ["pkg.gone", "pkg.new"]
    )


class CheckSeesOffendersTest(absltest.TestCase):
  """The check on sources written to break it."""

  _CLASSES = {"MeshConfig"}
  _MEMBERS = {"data_parallelism", "validate", "from_config"}

  _OTHERS = {"ModelConfig": {"num_layers", "validate", "from_config"}}

  def _problems(self, source):
    return read_problems(
        "pkg.mod", source, self._CLASSES, self._MEMBERS, self._OTHERS
    )

  def test_own_fields_pass(self):
    source = (
        "def f(settings: MeshConfig, n: int):\n"
        "  return settings.data_parallelism * n\n"
        "def g(mesh_config: 'mesh.MeshConfig'):\n"
        "  return getattr(mesh_config, 'data_parallelism')\n"
        "def h(config: model_config.ModelConfig):\n"
        "  return config.num_layers\n"
    )
    self.assertEqual(self._problems(source), [])

  def test_another_packages_settings_are_read_by_their_own_fields(self):
    source = (
        "def a(config: model_config.ModelConfig):\n"
        "  return config.data_parallelism\n"
        "def b(model: 'ModelConfig', settings: MeshConfig):\n"
        "  return model.num_layers, settings.num_layers\n"
    )
    self.assertEqual(
        self._problems(source),
        [
            "pkg.mod: a reads config.data_parallelism, a field ModelConfig"
            " do not hold",
            "pkg.mod: b reads settings.num_layers, a field its package's"
            " settings (MeshConfig) do not hold",
        ],
    )

  def test_offenders_are_named(self):
    source = (
        "import ml_collections\n"
        "def a(config):\n"
        "  return config.data_parallelism\n"
        "def b(c: ml_collections.ConfigDict):\n"
        "  return c\n"
        "def d(settings: MeshConfig):\n"
        "  return settings.grpo_num_generations\n"
        "def e(settings: MeshConfig, key: str):\n"
        "  return getattr(settings, key), settings['workload']\n"
        "def f(settings):\n"
        "  return getattr(settings, 'workload', 'grpo')\n"
        "def g(config: Any):\n"
        "  return config\n"
    )
    self.assertEqual(
        self._problems(source),
        [
            "pkg.mod: imports ml_collections",
            "pkg.mod: a(config) takes the run's config (a parameter 'config'"
            " not annotated with a settings class)",
            "pkg.mod: b(c) takes the run's config (annotated"
            " ml_collections.ConfigDict)",
            "pkg.mod: d reads settings.grpo_num_generations, a field its"
            " package's settings (MeshConfig) do not hold",
            "pkg.mod: e reads settings by a computed name or as a dict",
            "pkg.mod: f reads settings.workload, a field its package's"
            " settings (MeshConfig) do not hold",
            "pkg.mod: g(config) takes the run's config (a parameter 'config'"
            " not annotated with a settings class)",
        ],
    )


if __name__ == "__main__":
  absltest.main()
