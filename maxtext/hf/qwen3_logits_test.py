"""Qwen3 and Qwen3-MoE checkpoints through transformers and back.

Tiny random `Qwen3ForCausalLM` (per-head q/k RMSNorm, head_dim apart from
hidden / heads, grouped kv heads; tied and untied embeddings) and
`Qwen3MoeForCausalLM` (a dense first layer by `mlp_only_layers`, then
softmax-routed experts, top-2 of 8, renormalised by `norm_topk_prob` or
not) models are built with transformers on the CPU, saved, imported,
restored through `checkpointing.restore_params_only`, and run by
`transformer.apply` in float32: the logits must match transformers' to
1e-5 of the logits' scale (their largest magnitude). The parameters are
then exported (float32), loaded back with
`AutoModelForCausalLM.from_pretrained` (logits again) and every exported
tensor must equal transformers' original bit for bit. Config fields the
model lacks are refused with one line naming them.
"""

import dataclasses
import json
import os

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import torch

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

from maxtext.hf import exporter
from maxtext.hf import importer
from maxtext.hf import logits_check
from maxtext.hf import qwen3
from maxtext.model import transformer

_VOCAB = 96


def _randomise(model):
  """Weights large enough for peaked logits; every norm scale (the q/k
  norms' too) away from 1, so a norm left out changes the logits."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn_like(p)
      is_norm = name.endswith("norm.weight")
      p.copy_(1.0 + 0.2 * noise if is_norm else 0.25 * noise)
  return model


_COMMON = dict(
    vocab_size=_VOCAB,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    # Not hidden_size / heads (16): the head width is its own field.
    head_dim=24,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    attn_implementation="eager",
)


def _dense(tie: bool, seed: int):
  """A tiny random Qwen3, its embeddings tied or not."""
  torch.manual_seed(seed)
  config = transformers.Qwen3Config(tie_word_embeddings=tie, **_COMMON)
  return _randomise(transformers.Qwen3ForCausalLM(config).float().eval())


def _moe(norm_topk: bool, seed: int):
  """A tiny random Qwen3-MoE: a dense first layer, then top-2 of 8."""
  torch.manual_seed(seed)
  config = transformers.Qwen3MoeConfig(
      num_experts=8,
      num_experts_per_tok=2,
      moe_intermediate_size=32,
      norm_topk_prob=norm_topk,
      decoder_sparse_step=1,
      mlp_only_layers=[0],
      tie_word_embeddings=False,
      **_COMMON,
  )
  return _randomise(transformers.Qwen3MoeForCausalLM(config).float().eval())


def _ids(seed: int) -> np.ndarray:
  """[2, 48] token ids."""
  return np.random.default_rng(seed).integers(0, _VOCAB, (2, 48))


def _config_json(directory: str) -> dict:
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    return json.load(f)


def _hf_logits(model, ids: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor(ids)).logits.float().numpy()


def _logits(params, config, ids) -> np.ndarray:
  return np.asarray(transformer.apply(params, ids, config))


class Qwen3LogitsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("dense_untied", lambda: _dense(False, 3), "Qwen3ForCausalLM"),
      ("dense_tied", lambda: _dense(True, 4), "Qwen3ForCausalLM"),
      ("moe_norm_topk", lambda: _moe(True, 5), "Qwen3MoeForCausalLM"),
      ("moe_plain_topk", lambda: _moe(False, 6), "Qwen3MoeForCausalLM"),
  )
  def test_import_then_export_matches_transformers(self, build, architecture):
    tmp = self.create_tempdir().full_path
    model = build()
    hf_dir = os.path.join(tmp, "hf")
    model.save_pretrained(hf_dir)
    written = _config_json(hf_dir)
    ids = _ids(0)
    expected = _hf_logits(model, ids)

    printed = []
    out = os.path.join(tmp, "imported")
    config = importer.import_checkpoint(hf_dir, out, log=printed.append)
    self.assertIn("config.qk_norm = True", printed)
    self.assertIn("config.head_dim = 24", printed)
    moe = architecture == qwen3.MOE_ARCHITECTURE
    if moe:
      self.assertIn("config.num_dense_layers = 1", printed)
      self.assertIn(
          "config.router_norm_topk = %r" % written["norm_topk_prob"], printed
      )
    params = logits_check.restore_on_one_device(out, config)
    self.assertEqual(params["layers"]["q_norm"].shape[1:], (24,))
    self.assertEqual(
        "unembedding" in params, not written["tie_word_embeddings"]
    )
    logits_check.assert_close_to_scale(
        self, _logits(params, config, ids), expected
    )

    # Without the q/k norms (or, for the MoE, the renormalisation choice
    # flipped) the same weights give other logits: the comparison above
    # checks them.
    if moe:
      changed = dataclasses.replace(
          config, router_norm_topk=not config.router_norm_topk
      )
    else:
      # The norm scales are then left unread.
      changed = dataclasses.replace(config, qk_norm=False)
    diff = np.abs(_logits(params, changed, ids) - expected).max()
    self.assertGreater(
        diff, 100 * logits_check.RELATIVE * np.abs(expected).max()
    )

    # Export: the same fields back, transformers loads the model and its
    # logits match, and every tensor is the original's bit for bit.
    exported = os.path.join(tmp, "exported")
    exporter.export_checkpoint(config, params, exported, "float32")
    self.assertEqual(
        qwen3.config_fields(_config_json(exported), "exported"),
        qwen3.config_fields(written, "original"),
    )
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        exported, attn_implementation="eager"
    ).eval()
    self.assertEqual(type(reloaded).__name__, architecture)
    logits_check.assert_close_to_scale(
        self, _hf_logits(reloaded, ids), expected
    )
    logits_check.assert_same_tensors(self, hf_dir, exported)

  @parameterized.named_parameters(
      ("sliding", {"use_sliding_window": True}, "use_sliding_window=True"),
      ("bias", {"attention_bias": True}, "attention_bias=True"),
      (
          "layer_types",
          {"layer_types": ["full_attention", "sliding_attention"]},
          "layer_types=",
      ),
      (
          "rope",
          {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
          "rope_type 'yarn'",
      ),
      ("sparse_step", {"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
      ("mlp_only", {"mlp_only_layers": [1]}, r"mlp_only_layers=\[1\]"),
  )
  def test_unsupported_fields_are_refused_in_one_line(self, change, message):
    hf_dir = os.path.join(self.create_tempdir().full_path, "hf")
    _moe(True, 7).save_pretrained(hf_dir)
    logits_check.assert_import_refuses(self, hf_dir, change, message)


if __name__ == "__main__":
  absltest.main()
