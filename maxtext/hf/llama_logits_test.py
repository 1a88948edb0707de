"""Llama checkpoints through transformers and back, logits compared.

Tiny random `LlamaForCausalLM` models (grouped-query heads, Llama 3.1's
rope scaling, tied and untied embeddings) are built with transformers on
the CPU and saved (also in several shards), imported, restored through
`checkpointing.restore_params_only` (the `load_parameters_path` reader),
and run by `transformer.apply` in float32 on a batch of ids; the logits
must match transformers' to 1e-5 of the logits' scale (their largest
magnitude). Then the parameters are exported, loaded back with
`AutoModelForCausalLM.from_pretrained`, and compared again.
"""

import dataclasses
import glob
import os

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import torch

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

from maxtext.config import config_lib
from maxtext.hf import exporter
from maxtext.hf import hf_directory
from maxtext.hf import importer
from maxtext.hf import logits_check
from maxtext.model import model_config
from maxtext.model import transformer

_VOCAB = 96
_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so the scaling changes the frequencies the test's positions
    # reach.
    "original_max_position_embeddings": 16,
}


def _hf_model(tie: bool, seed: int):
  """A tiny random Llama with weights large enough for peaked logits."""
  torch.manual_seed(seed)
  config = transformers.LlamaConfig(
      vocab_size=_VOCAB,
      hidden_size=64,
      intermediate_size=112,
      num_hidden_layers=3,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=16,
      max_position_embeddings=128,
      rms_norm_eps=1e-5,
      rope_theta=10000.0,
      rope_scaling=dict(_LLAMA3),
      tie_word_embeddings=tie,
      attn_implementation="eager",
  )
  model = transformers.LlamaForCausalLM(config).float().eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.normal_(0.0, 0.25)
  return model


def _ids(seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, _VOCAB, (3, 40))


def _hf_logits(model, ids: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor(ids)).logits.float().numpy()


def _logits(params, config, ids) -> np.ndarray:
  return np.asarray(transformer.apply(params, ids, config))


class LlamaLogitsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("untied", False, None),
      ("tied", True, None),
      ("untied_sharded", False, "40KB"),
  )
  def test_import_then_export_matches_transformers(self, tie, shard_size):
    tmp = self.create_tempdir().full_path
    model = _hf_model(tie, seed=3)
    hf_dir = os.path.join(tmp, "hf")
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(hf_dir, **kwargs)
    shards = glob.glob(os.path.join(hf_dir, "*.safetensors"))
    if shard_size:
      self.assertGreater(len(shards), 2)
    ids = _ids(0)
    expected = _hf_logits(model, ids)

    printed = []
    out = os.path.join(tmp, "imported")
    config = importer.import_checkpoint(hf_dir, out, log=printed.append)
    self.assertIn("config.tie_word_embeddings = %r" % tie, printed)
    self.assertIn("config.rope_scaling = 'llama3'", printed)
    self.assertEqual(config.num_kv_heads, 2)
    params = logits_check.restore_on_one_device(out, config)
    self.assertEqual("unembedding" in params, not tie)
    logits_check.assert_close_to_scale(
        self, _logits(params, config, ids), expected
    )

    # The config file written beside the checkpoint is the same config.
    written = config_lib.load_config_file(os.path.join(out, "config.py"))
    self.assertEqual(model_config.of(written), config)

    # The sharded case exports in shards of its own (40 kB) too.
    exported = os.path.join(tmp, "exported")
    exporter.export_checkpoint(
        config,
        params,
        exported,
        "float32",
        **({"max_shard_bytes": 40_000} if shard_size else {}),
    )
    if shard_size:
      self.assertGreater(
          len(glob.glob(os.path.join(exported, "model-*.safetensors"))), 2
      )
      self.assertTrue(
          os.path.isfile(os.path.join(exported, hf_directory.INDEX_FILE))
      )
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        exported, attn_implementation="eager"
    ).eval()
    self.assertEqual(type(reloaded).__name__, "LlamaForCausalLM")
    self.assertEqual(reloaded.config.tie_word_embeddings, tie)
    logits_check.assert_close_to_scale(
        self, _hf_logits(reloaded, ids), expected
    )

  def test_rope_scaling_matters_at_these_positions(self):
    # Without llama3 scaling the same weights give other logits: the
    # comparison above checks the scaling, not only the matrices.
    tmp = self.create_tempdir().full_path
    model = _hf_model(False, seed=5)
    model.save_pretrained(os.path.join(tmp, "hf"))
    config = importer.import_checkpoint(
        os.path.join(tmp, "hf"), os.path.join(tmp, "out"), log=lambda s: None
    )
    params = logits_check.restore_on_one_device(
        os.path.join(tmp, "out"), config
    )
    ids = _ids(1)
    expected = _hf_logits(model, ids)
    unscaled = dataclasses.replace(config, rope_scaling="none")
    diff = np.abs(_logits(params, unscaled, ids) - expected).max()
    self.assertGreater(
        diff, 100 * logits_check.RELATIVE * np.abs(expected).max()
    )

  def test_bfloat16_export_loads_as_bfloat16(self):
    tmp = self.create_tempdir().full_path
    model = _hf_model(True, seed=7)
    model.save_pretrained(os.path.join(tmp, "hf"))
    config = importer.import_checkpoint(
        os.path.join(tmp, "hf"), os.path.join(tmp, "out"), log=lambda s: None
    )
    params = logits_check.restore_on_one_device(
        os.path.join(tmp, "out"), config
    )
    exporter.export_checkpoint(
        config, params, os.path.join(tmp, "bf16"), "bfloat16"
    )
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(tmp, "bf16")
    )
    self.assertEqual(reloaded.model.embed_tokens.weight.dtype, torch.bfloat16)
    np.testing.assert_array_equal(
        reloaded.model.layers[1].mlp.down_proj.weight.detach().float().numpy(),
        model.model.layers[1]
        .mlp.down_proj.weight.detach()
        .to(torch.bfloat16)
        .float()
        .numpy(),
    )


if __name__ == "__main__":
  absltest.main()
