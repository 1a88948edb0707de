"""run_settings: the loop's settings from a run's config, and an attempt's."""

import dataclasses

from absl.testing import absltest

from maxtext.config import config_lib
from maxtext.configs import base
from maxtext.core import component_config
from maxtext.run import run_settings


def _seeds(settings, where="settings") -> dict[str, int]:
  """Every field named `seed` in `settings` and its nested settings, by
  where it is."""
  found = {}
  for field in dataclasses.fields(settings):
    value = getattr(settings, field.name)
    if field.name == "seed":
      found[where] = value
    elif isinstance(value, component_config.ComponentConfig):
      found.update(_seeds(value, f"{where}.{field.name}"))
  return found


class RunSettingsTest(absltest.TestCase):

  def test_built_from_the_config_with_its_components(self):
    config = base.get_config()
    config.steps, config.run_name, config.checkpoint_period = 700, "r", 3
    config.base_output_directory = "/tmp/runs"
    settings = run_settings.RunSettings.from_config(
        config, record=config_lib.to_json_dict(config)
    )
    self.assertEqual((settings.steps, settings.run_name), (700, "r"))
    self.assertEqual(settings.checkpoint.checkpoint_period, 3)
    self.assertEqual(settings.run_dir.base_output_directory, "/tmp/runs")
    self.assertEqual(settings.eval_schedule.steps, 700)
    self.assertEqual(settings.record["steps"], 700)

  def test_a_component_check_names_its_field(self):
    config = base.get_config()
    config.checkpoint_period = -2
    with self.assertRaisesRegex(ValueError, r"checkpoint_period"):
      run_settings.RunSettings.from_config(config)

  def test_with_seed_sets_every_seed_and_the_record(self):
    config = base.get_config()
    config.seed = -1  # Drawn at the first attempt.
    settings = run_settings.RunSettings.from_config(
        config, record=config_lib.to_json_dict(config)
    )
    seeded = settings.with_seed(1234)
    seeds = _seeds(seeded)
    self.assertGreaterEqual(len(seeds), 3)  # Its own, the data's, the log's.
    self.assertEqual(set(seeds.values()), {1234}, seeds)
    self.assertEqual(seeded.record["seed"], 1234)
    self.assertEqual(
        dict(seeded.record),
        config_lib.to_json_dict(config_lib.with_seed(config, 1234)),
    )
    # The settings it was made from are unchanged.
    self.assertEqual(set(_seeds(settings).values()), {-1})
    self.assertEqual(settings.record["seed"], -1)

  def test_with_seed_refuses_a_negative_seed(self):
    with self.assertRaisesRegex(ValueError, "seed"):
      run_settings.RunSettings().with_seed(-1)


if __name__ == "__main__":
  absltest.main()
