"""`param_count` totals against transformers' for the Qwen3 config files.

Each config file's model is written as the Hugging Face config.json its
export would write (`maxtext.hf.qwen3.hf_config`), built by transformers
on the meta device (shapes only, nothing allocated) and its parameters
counted, tied embeddings once: the total must equal
`param_count_lib.count`'s. The totals and the active counts are logged.
"""

from absl import logging
from absl.testing import absltest
from absl.testing import parameterized

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import torch

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

from maxtext.configs import qwen3_0_6b
from maxtext.configs import qwen3_30b_a3b
from maxtext.configs import qwen3_8b
from maxtext.hf import qwen3
from tools import param_count_lib

_META_KEYS = ("architectures", "model_type", "torch_dtype", "dtype")


def _transformers_count(config) -> tuple[str, int]:
  """(architecture, parameters) of transformers' model of `config`."""
  document = qwen3.hf_config(config, "float32")
  kwargs = {k: v for k, v in document.items() if k not in _META_KEYS}
  hf_config = transformers.AutoConfig.for_model(
      document["model_type"], **kwargs
  )
  with torch.device("meta"):
    model = transformers.AutoModelForCausalLM.from_config(hf_config)
  # parameters() yields a tied weight once.
  return type(model).__name__, sum(p.numel() for p in model.parameters())


class ParamCountHfTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("qwen3_0_6b", qwen3_0_6b, "Qwen3ForCausalLM", 0.60),
      ("qwen3_8b", qwen3_8b, "Qwen3ForCausalLM", 8.19),
      ("qwen3_30b_a3b", qwen3_30b_a3b, "Qwen3MoeForCausalLM", 30.53),
  )
  def test_total_equals_transformers(self, module, architecture, billions):
    config = module.get_config()
    counts = param_count_lib.count(config)
    name, theirs = _transformers_count(config)
    logging.info(
        "%s: total %d, transformers %d, active %d",
        module.__name__,
        counts.total,
        theirs,
        counts.active,
    )
    self.assertEqual(name, architecture)
    self.assertEqual(counts.total, theirs)
    self.assertAlmostEqual(counts.total / 1e9, billions, places=2)


if __name__ == "__main__":
  absltest.main()
