"""Every package's settings class has base.py's defaults.

docs/ARCHITECTURE.md, "Component configs": each field of a settings class
(`maxtext/core/component_config.py`) is named as the config's field and
defaults to `maxtext/configs/base.py`'s value, so a settings object made
without a config means what a run of the base config means. The classes
are the ones `config_reads_test.SETTINGS` names, package by package, and
every subclass of `ComponentConfig` their modules define.
"""

import importlib

from absl.testing import absltest

from maxtext import config_reads_test
from maxtext.configs import base
from maxtext.core import component_config

# Fields the caller decides, which the config does not hold: their default.
GIVEN_BY_THE_CALLER = {
    ("MeshConfig", "generation_devices"): 0,
    ("ExecutorConfig", "check_sandbox"): False,
}


def _settings_classes() -> list[type]:
  """The settings classes `SETTINGS` names, and every other subclass of
  ComponentConfig their modules define."""
  classes = []
  for declared in config_reads_test.SETTINGS.values():
    for module_name, names in declared.items():
      module = importlib.import_module(module_name)
      classes += [getattr(module, name) for name in names]
      classes += [
          value
          for value in vars(module).values()
          if isinstance(value, type)
          and issubclass(value, component_config.ComponentConfig)
          and value.__module__ == module_name
          and value not in classes
      ]
  return classes


class ComponentDefaultsTest(absltest.TestCase):

  def test_defaults_are_base_configs(self):
    config = base.get_config()
    classes = _settings_classes()
    self.assertGreaterEqual(len(classes), 9)
    for settings in classes:
      with self.subTest(settings.__name__):
        defaults = component_config.defaults(settings)
        for (owner, field), value in GIVEN_BY_THE_CALLER.items():
          if owner == settings.__name__:
            self.assertNotIn(field, config)
            self.assertEqual(defaults.pop(field), value)
        self.assertEqual(defaults, {name: config[name] for name in defaults})

  def test_a_nested_settings_default_is_its_classes(self):
    checked = 0
    for settings in _settings_classes():
      # The builder's own view of the fields it builds from their classes,
      # not a copy of it.
      nested = component_config._nested(settings)  # pylint: disable=protected-access
      for name, kind in nested.items():
        with self.subTest(f"{settings.__name__}.{name}"):
          self.assertEqual(getattr(settings(), name), kind())
          checked += 1
    self.assertGreaterEqual(checked, 1)


if __name__ == "__main__":
  absltest.main()
