"""GrpoConfig: its components' settings, its stop ids, the attempt's seed."""

import dataclasses

from absl.testing import absltest

from maxtext.config import config_lib
from maxtext.configs import base
from maxtext.grpo import grpo_config


def _seeds(settings, where="settings") -> dict[str, int]:
  """Every field named `seed` in `settings` and its nested settings, by
  path."""
  found = {}
  for field in dataclasses.fields(settings):
    value = getattr(settings, field.name)
    if field.name == "seed":
      found[where] = value
    elif dataclasses.is_dataclass(value):
      found.update(_seeds(value, f"{where}.{field.name}"))
  return found


class GrpoConfigTest(absltest.TestCase):

  def test_stop_ids_are_config_libs(self):
    config = base.get_config()
    self.assertEqual(grpo_config.GrpoConfig.from_config(config).stop_ids, ())
    config.grpo_stop_ids = "3, 7"
    self.assertEqual(
        grpo_config.GrpoConfig.from_config(config).stop_ids,
        config_lib.stop_ids(config),
    )
    self.assertEqual(config_lib.stop_ids(config), (3, 7))

  def test_a_stop_id_outside_the_vocabulary_is_refused(self):
    config = base.get_config()
    config.grpo_stop_ids = f"{config.vocab_size}"
    settings = grpo_config.GrpoConfig.from_config(config)
    with self.assertRaisesRegex(ValueError, "config.grpo_stop_ids="):
      _ = settings.stop_ids

  def test_components_are_the_configs(self):
    config = base.get_config()
    config.seed = 11
    config.global_batch_size = 32
    settings = grpo_config.GrpoConfig.from_config(config)
    self.assertEqual(settings.engine.seed, 11)
    self.assertEqual(settings.task.seed, 11)
    self.assertEqual(settings.rollout.global_batch_size, 32)
    self.assertEqual(settings.engine.model, settings.rollout.model)

  def test_with_seed_sets_every_seed(self):
    config = base.get_config()
    config.seed = -1  # Drawn at the first attempt.
    settings = grpo_config.GrpoConfig.from_config(config)
    seeds = _seeds(settings)
    # Its own, the engine's, the task's.
    self.assertGreaterEqual(len(seeds), 3, seeds)
    self.assertEqual(set(seeds.values()), {-1})
    seeded = settings.with_seed(1234)
    self.assertEqual(set(_seeds(seeded).values()), {1234}, _seeds(seeded))
    self.assertEqual(
        seeded,
        grpo_config.GrpoConfig.from_config(config_lib.with_seed(config, 1234)),
    )

  def test_with_seed_refuses_a_negative_seed(self):
    with self.assertRaisesRegex(ValueError, "seed"):
      grpo_config.GrpoConfig().with_seed(-1)


if __name__ == "__main__":
  absltest.main()
