"""The rotary scalings against transformers' own (the published definitions).

Hugging Face checkpoints name their rotary scaling in config.json
(`rope_scaling` / `rope_parameters`); the model must rotate exactly as
transformers does for imported weights to give the same logits. Frequencies,
the cosines' magnitude and DeepSeek-V3's softmax-scale correction are
compared with transformers' functions for Llama 3.1's and DeepSeek-V3's
published settings and for YaRN without its mscale fields.
"""

import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
from transformers import modeling_rope_utils

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
from transformers.models.deepseek_v3 import modeling_deepseek_v3

from maxtext.model import layers


def _transformers_frequencies(config):
  rope_type = config.rope_parameters["rope_type"]
  inv_freq, magnitude = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](
      config, "cpu"
  )
  return inv_freq.numpy(), float(magnitude)


class RopeScalingTest(parameterized.TestCase):

  def test_llama3_frequencies(self):
    config = transformers.LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    want, magnitude = _transformers_frequencies(config)
    scaling = layers.Llama3Scaling(8.0, 1.0, 4.0, 8192)
    got = np.asarray(layers.rope_frequencies(128, 500000.0, scaling))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    self.assertEqual(scaling.magnitude, magnitude)

  @parameterized.named_parameters(
      # DeepSeek-V3 as published: the cosines unscaled, the softmax
      # scale corrected.
      ("deepseek_v3", 40.0, 4096, 1.0, 1.0),
      # YaRN without the mscale fields: the cosines carry the correction.
      ("bare", 4.0, 2048, 0.0, 0.0),
      ("mscale_only", 8.0, 1024, 0.707, 0.0),
  )
  def test_yarn(self, factor, original, mscale, mscale_all_dim):
    parameters = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": factor,
        "original_max_position_embeddings": original,
        "beta_fast": 32,
        "beta_slow": 1,
    }
    if mscale:
      parameters["mscale"] = mscale
    if mscale_all_dim:
      parameters["mscale_all_dim"] = mscale_all_dim
    config = transformers.DeepseekV3Config(
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        max_position_embeddings=int(original * factor),
        rope_parameters=parameters,
    )
    want, magnitude = _transformers_frequencies(config)
    scaling = layers.YarnScaling(
        factor, original, 32.0, 1.0, mscale, mscale_all_dim
    )
    got = np.asarray(layers.rope_frequencies(64, 10000.0, scaling))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # The scaling moved the low frequencies: the comparison is not of two
    # plain sets.
    self.assertAlmostEqual(
        float(np.asarray(layers.rope_frequencies(64, 10000.0))[-1] / got[-1]),
        factor,
        places=3,
    )
    self.assertAlmostEqual(scaling.magnitude, magnitude, places=12)
    width = 192
    self.assertAlmostEqual(
        layers.softmax_scale(width, scaling),
        modeling_deepseek_v3.yarn_apply_mscale(
            config.rope_parameters, width**-0.5
        ),
        places=12,
    )
    self.assertEqual(
        layers.softmax_scale(width, scaling) == 1 / math.sqrt(width),
        not mscale_all_dim,
    )


if __name__ == "__main__":
  absltest.main()
