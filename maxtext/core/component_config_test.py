"""Tests for maxtext/core/component_config.py: the one builder of settings."""

import dataclasses

from absl.testing import absltest
import ml_collections

from maxtext.core import component_config


@dataclasses.dataclass(frozen=True)
class _Settings(component_config.ComponentConfig):
  size: int = 2
  name: str = "a"
  derived: int = 0

  def validate(self) -> None:
    if self.size < 1:
      raise component_config.fail("size", self.size, "must be >= 1")


@dataclasses.dataclass(frozen=True)
class _Holder(component_config.ComponentConfig):
  name: str = "h"
  inner: _Settings = dataclasses.field(default_factory=_Settings)


def _config(**values):
  config = ml_collections.ConfigDict({"size": 3, "name": "b", "other": 1.5})
  config.update(values)
  return config


class FromConfigTest(absltest.TestCase):

  def test_fields_come_from_the_config_by_name(self):
    self.assertEqual(
        _Settings.from_config(_config()), _Settings(size=3, name="b")
    )

  def test_a_field_the_config_lacks_is_given_or_its_default(self):
    self.assertEqual(_Settings.from_config(_config()).derived, 0)
    self.assertEqual(
        _Settings.from_config(_config(), derived=4),
        _Settings(size=3, name="b", derived=4),
    )
    self.assertEqual(_Settings.from_config({"name": "c"}), _Settings(name="c"))

  def test_field_references_are_resolved(self):
    linked = ml_collections.ConfigDict({"base": 5})
    linked.size = linked.get_ref("base")
    self.assertEqual(_Settings.from_config(linked).size, 5)

  def test_frozen_configs_and_plain_mappings_work(self):
    expected = _Settings(size=3, name="b")
    self.assertEqual(
        _Settings.from_config(ml_collections.FrozenConfigDict(_config())),
        expected,
    )
    self.assertEqual(_Settings.from_config(dict(_config())), expected)

  def test_a_field_of_a_settings_class_is_built_from_the_same_config(self):
    self.assertEqual(
        _Holder.from_config(_config()),
        _Holder(name="b", inner=_Settings(size=3, name="b")),
    )
    given = _Settings(size=7)
    self.assertIs(_Holder.from_config(_config(), inner=given).inner, given)
    with self.assertRaisesRegex(ValueError, r"^config\.size=0: must be >= 1$"):
      _Holder.from_config(_config(size=0))

  def test_a_bad_value_is_one_line_naming_the_field(self):
    with self.assertRaisesRegex(ValueError, r"^config\.size=0: must be >= 1$"):
      _Settings.from_config(_config(size=0))

  def test_a_given_name_the_dataclass_lacks_is_refused(self):
    with self.assertRaisesRegex(TypeError, r"_Settings has no field\(s\)"):
      _Settings.from_config(_config(), sizes=4)

  def test_the_settings_are_frozen(self):
    settings = _Settings.from_config(_config())
    with self.assertRaises(dataclasses.FrozenInstanceError):
      settings.size = 4

  def test_defaults(self):
    self.assertEqual(
        component_config.defaults(_Settings),
        {"size": 2, "name": "a", "derived": 0},
    )


if __name__ == "__main__":
  absltest.main()
