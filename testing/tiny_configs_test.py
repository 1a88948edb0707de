"""Tests for testing/tiny_configs.py's model_config and its presets."""

from absl.testing import absltest

from maxtext.config import config_lib
from maxtext.configs import base
from testing import tiny_configs


class ModelConfigTest(absltest.TestCase):

  def test_base_with_the_tiny_model_then_presets_then_overrides(self):
    config = tiny_configs.model_config(
        tiny_configs.TINY_MLA,
        tiny_configs.TINY_MOE,
        dict(num_experts=8),
        num_layers=3,
    )
    for key, value in tiny_configs.TINY_MLA.items():
      self.assertEqual(config[key], value, key)
    self.assertEqual(config.num_experts, 8)
    self.assertEqual(config.num_layers, 3)
    self.assertEqual(config.emb_dim, tiny_configs.TINY_MODEL["emb_dim"])
    self.assertEqual(config.steps, base.get_config().steps)

  def test_presets_are_valid_configs(self):
    for presets in (
        (),
        (tiny_configs.TINY_MLA, tiny_configs.TINY_MOE),
        (tiny_configs.TINY_QWEN3,),
        (tiny_configs.TINY_QWEN3_MOE,),
    ):
      config_lib.validate(tiny_configs.model_config(*presets))

  def test_unknown_field_is_refused(self):
    with self.assertRaisesRegex(KeyError, "model_config.*'num_expert'"):
      tiny_configs.model_config(dict(num_expert=4))
    with self.assertRaisesRegex(KeyError, "model_config.*'stpes'"):
      tiny_configs.model_config(stpes=4)


if __name__ == "__main__":
  absltest.main()
