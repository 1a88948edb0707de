"""DeepSeek-V3 checkpoints through transformers, logits and experts compared.

A tiny random `DeepseekV3ForCausalLM` (multi-head latent attention with a
query bottleneck, one dense layer then two mixture-of-experts layers with a
shared expert and 8 routed experts in 4 groups of which a token uses 2, a
random non-zero `e_score_correction_bias`, `routed_scaling_factor`, YaRN
with DeepSeek's mscale fields, the interleaved rotary layout) is built
with transformers on the CPU, saved with `save_pretrained`, imported,
restored through `checkpointing.restore_params_only`, and run by
`transformer.apply` in float32 on a batch of ids: the logits must match
transformers' to 1e-5 of the logits' scale (their largest magnitude).

The routed experts are compared directly too: the input of a MoE layer's
router in transformers (a forward hook) goes through `moe.route` with the
imported router and bias, and each token's set of experts must be the one
transformers chose. A token whose choice is within `_NEAR_TIE` of flipping
(between the k-th and next expert, or the last kept and next group) is a
near tie: it is reported, and a disagreement there fails with that
diagnosis instead of a bare mismatch.

The imported parameters are then exported (float32) and loaded back with
`AutoModelForCausalLM.from_pretrained`: its logits must match again, and
every exported tensor must equal transformers' original bit for bit (the
rotary reordering undone on the query and `kv_a` projections); a bfloat16
export holds the originals rounded to bfloat16, the correction bias kept
in float32.

Then the same model stored as DeepSeek-V3's published checkpoint stores
it: FP8 (e4m3) matrices with per-block `weight_scale_inv`, imported and
compared with transformers running the dequantised weights.
"""

import json
import os

from absl import logging
from absl.testing import absltest
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import torch

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

from maxtext.hf import deepseek
from maxtext.hf import exporter
from maxtext.hf import fp8
from maxtext.hf import importer
from maxtext.hf import logits_check
from maxtext.hf import safetensors_io
from maxtext.model import moe
from maxtext.model import transformer

# A routing choice closer than this (in biased sigmoid scores) to flipping
# is a near tie: float32 rounding differences may flip it.
_NEAR_TIE = 1e-5
_VOCAB = 96
_TOP_K = 2
_GROUPS, _TOPK_GROUP = 4, 2
_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    # Small, so the scaling changes the frequencies the test's positions
    # reach.
    "original_max_position_embeddings": 16,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def _hf_model(seed: int):
  """A tiny random DeepSeek-V3 with weights large enough for peaked logits."""
  torch.manual_seed(seed)
  config = transformers.DeepseekV3Config(
      vocab_size=_VOCAB,
      hidden_size=64,
      intermediate_size=96,
      moe_intermediate_size=32,
      num_hidden_layers=3,
      num_attention_heads=4,
      num_key_value_heads=4,
      n_shared_experts=1,
      n_routed_experts=8,
      num_experts_per_tok=_TOP_K,
      n_group=_GROUPS,
      topk_group=_TOPK_GROUP,
      routed_scaling_factor=2.5,
      norm_topk_prob=True,
      first_k_dense_replace=1,
      q_lora_rank=24,
      kv_lora_rank=16,
      qk_nope_head_dim=16,
      qk_rope_head_dim=8,
      v_head_dim=12,
      max_position_embeddings=256,
      rms_norm_eps=1e-6,
      rope_parameters=dict(_YARN),
      attn_implementation="eager",
  )
  model = transformers.DeepseekV3ForCausalLM(config).float().eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.normal_(0.0, 0.25)
    for layer in model.model.layers[1:]:
      layer.mlp.gate.e_score_correction_bias.copy_(
          0.1 * torch.randn(config.n_routed_experts)
      )
  return model


def _ids(seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, _VOCAB, (3, 40))


def _hf_forward(model, ids: np.ndarray, layer: int):
  """(logits, the router's input and chosen experts of MoE layer `layer`)."""
  seen = {}

  def hook(module, inputs, outputs):
    del module
    seen["x"] = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).numpy()
    seen["experts"] = outputs[2].detach().numpy()

  handle = model.model.layers[layer].mlp.gate.register_forward_hook(hook)
  try:
    with torch.no_grad():
      logits = model(torch.tensor(ids)).logits.float().numpy()
  finally:
    handle.remove()
  return logits, seen["x"], seen["experts"]


def _margins(scores_for_choice: np.ndarray) -> np.ndarray:
  """Per token, how far its choice is from flipping: the smaller of the gap
  between the last kept and the first dropped group score and the gap
  between the k-th and (k+1)-th eligible expert score."""
  t, x = scores_for_choice.shape
  grouped = scores_for_choice.reshape(t, _GROUPS, x // _GROUPS)
  group_score = np.sort(grouped, axis=-1)[..., -2:].sum(-1)  # [T, G]
  ranked = -np.sort(-group_score, axis=-1)
  group_gap = ranked[:, _TOPK_GROUP - 1] - ranked[:, _TOPK_GROUP]
  keep = np.argsort(-group_score, axis=-1)[:, :_TOPK_GROUP]
  mask = np.zeros((t, _GROUPS), bool)
  np.put_along_axis(mask, keep, True, axis=-1)
  eligible = np.where(mask[:, :, None], grouped, -np.inf).reshape(t, x)
  ranked = -np.sort(-eligible, axis=-1)
  expert_gap = ranked[:, _TOP_K - 1] - ranked[:, _TOP_K]
  return np.minimum(group_gap, expert_gap)


class DeepseekLogitsTest(absltest.TestCase):

  def assert_same_experts(self, params, config, x, hf_experts, layer):
    """`moe.route` on transformers' router input of MoE layer `layer`
    (index into moe_layers) chooses transformers' experts, token by token;
    a disagreement at a near tie is named as such."""
    router = np.asarray(params["moe_layers"]["router"][layer])
    bias = np.asarray(params["moe_layers"]["router_bias"][layer])
    self.assertGreater(np.abs(bias).max(), 0.0)  # The bias was imported.
    logits = x.astype(np.float32) @ router
    _, _, ours = moe.route(jnp.asarray(logits), config, jnp.asarray(bias))
    ours = np.sort(np.asarray(ours), axis=-1)
    theirs = np.sort(hf_experts, axis=-1)
    margins = _margins(1.0 / (1.0 + np.exp(-logits)) + bias)
    near = np.flatnonzero(margins < _NEAR_TIE)
    logging.info(
        "routing: %d tokens, smallest margin %.3g, %d near ties %s",
        len(margins),
        margins.min(),
        len(near),
        near.tolist(),
    )
    differ = np.flatnonzero(np.any(ours != theirs, axis=-1))
    for token in differ:
      kind = "a near tie" if token in near else "NOT a near tie"
      self.fail(
          f"token {token}: experts {ours[token].tolist()} here, "
          f"{theirs[token].tolist()} in transformers; margin "
          f"{margins[token]:.3g} ({kind})"
      )
    # The bias matters for these tokens: without it some choices differ,
    # so the agreement above checks the bias, not only the router matrix.
    _, _, unbiased = moe.route(jnp.asarray(logits), config)
    self.assertTrue(np.any(np.sort(np.asarray(unbiased), axis=-1) != theirs))

  def test_import_then_export_matches_transformers(self):
    tmp = self.create_tempdir().full_path
    model = _hf_model(seed=3)
    hf_dir = os.path.join(tmp, "hf")
    model.save_pretrained(hf_dir)
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
      written = json.load(f)
    # transformers writes the multi-token-prediction count of the published
    # config (with no such layers): the import says it skips them.
    self.assertGreater(written.get("num_nextn_predict_layers", 0), 0)
    ids = _ids(0)
    expected, x, hf_experts = _hf_forward(model, ids, layer=2)

    printed = []
    out = os.path.join(tmp, "imported")
    config = importer.import_checkpoint(hf_dir, out, log=printed.append)
    for line in (
        "config.attention_type = 'mla'",
        "config.num_dense_layers = 1",
        "config.router_bias = True",
        "config.num_expert_groups = 4",
        "config.expert_groups_per_token = 2",
        "config.routed_scaling_factor = 2.5",
        "config.rope_scaling = 'yarn'",
        "config.rope_yarn_mscale_all_dim = 1.0",
    ):
      self.assertIn(line, printed)
    self.assertTrue(
        any("multi-token-prediction" in line for line in printed), printed
    )
    params = logits_check.restore_on_one_device(out, config)
    self.assertEqual(params["moe_layers"]["w_gate"].shape, (2, 8, 64, 32))
    self.assertEqual(params["moe_layers"]["router_bias"].dtype, jnp.float32)
    logits_check.assert_close_to_scale(
        self, np.asarray(transformer.apply(params, ids, config)), expected
    )
    self.assert_same_experts(params, config, x, hf_experts, layer=1)

    # Without the rotary de-interleave the same weights give other logits:
    # the comparison above checks the permutation.
    inverse = np.argsort(
        deepseek.interleave_permutation(config.qk_rope_head_dim)
    )
    undone = jax.tree_util.tree_map(np.array, params)
    for stack in ("layers", "moe_layers"):
      for name, start in (
          ("wq_b", config.qk_nope_head_dim),
          ("wkv_a", config.kv_lora_rank),
      ):
        w = undone[stack][name]
        w[..., start:] = w[..., start:][..., inverse]
    diff = np.abs(
        np.asarray(transformer.apply(undone, ids, config)) - expected
    ).max()
    self.assertGreater(
        diff, 100 * logits_check.RELATIVE * np.abs(expected).max()
    )

    # Export: transformers loads it, computes the same logits, and every
    # tensor is the original's, bit for bit.
    exported = os.path.join(tmp, "exported")
    exporter.export_checkpoint(config, params, exported, "float32")
    with open(os.path.join(exported, "config.json"), encoding="utf-8") as f:
      document = json.load(f)
    self.assertEqual(
        deepseek.config_fields(document, "exported"),
        deepseek.config_fields(written, "original"),
    )
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        exported, attn_implementation="eager"
    ).eval()
    self.assertEqual(type(reloaded).__name__, "DeepseekV3ForCausalLM")
    again, _, again_experts = _hf_forward(reloaded, ids, layer=2)
    logits_check.assert_close_to_scale(self, again, expected)
    np.testing.assert_array_equal(again_experts, hf_experts)
    original = safetensors_io.SafetensorsFile(
        os.path.join(hf_dir, "model.safetensors")
    )
    back = safetensors_io.SafetensorsFile(
        os.path.join(exported, "model.safetensors")
    )
    self.assertEqual(sorted(back.names()), sorted(original.names()))
    for name in original.names():
      ours = np.asarray(back.array(name))
      self.assertEqual(ours.dtype, np.float32, name)
      np.testing.assert_array_equal(
          ours, np.asarray(original.array(name)), err_msg=name
      )
    # The permuted tensors differ from a plain transpose of the project's
    # matrices: the bitwise equality above checks the inverse reordering.
    self.assertTrue(
        np.any(
            np.asarray(params["layers"]["wkv_a"][0]).T
            != np.asarray(
                back.array("model.layers.0.self_attn.kv_a_proj_with_mqa.weight")
            )
        )
    )

    half = os.path.join(tmp, "bf16")
    exporter.export_checkpoint(config, params, half, "bfloat16")
    back = safetensors_io.SafetensorsFile(
        os.path.join(half, "model.safetensors")
    )
    name = "model.layers.2.mlp.experts.5.down_proj.weight"
    np.testing.assert_array_equal(
        np.asarray(back.array(name)),
        np.asarray(original.array(name)).astype(ml_dtypes.bfloat16),
    )
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    self.assertEqual(back.array(bias).dtype, np.float32)
    np.testing.assert_array_equal(
        np.asarray(back.array(bias)), np.asarray(original.array(bias))
    )

  def test_fp8_checkpoint_dequantised(self):
    tmp = self.create_tempdir().full_path
    model = _hf_model(seed=5)
    saved = os.path.join(tmp, "saved")
    model.save_pretrained(saved)
    source = safetensors_io.SafetensorsFile(
        os.path.join(saved, "model.safetensors")
    )
    block = (16, 16)  # Smaller than the matrices: several blocks each.
    quantized, dequantized = {}, {}
    for name in source.names():
      array = np.array(source.array(name), np.float32)
      # As published: the projections in FP8; embeddings, norms, the router
      # and its bias in their own dtype.
      if array.ndim == 2 and "proj" in name and "layernorm" not in name:
        weight, scale = _quantize(array, block)
        quantized[name] = weight
        quantized[name + fp8.SCALE_SUFFIX] = scale
        dequantized[name] = fp8.dequantize(weight, scale, block)
      else:
        quantized[name] = dequantized[name] = array
    self.assertGreater(sum(n.endswith(fp8.SCALE_SUFFIX) for n in quantized), 30)
    with open(os.path.join(saved, "config.json"), encoding="utf-8") as f:
      hf_config = json.load(f)
    fp8_dir, plain_dir = os.path.join(tmp, "fp8"), os.path.join(tmp, "plain")
    for path, tensors, extra in (
        (
            fp8_dir,
            quantized,
            {
                "quantization_config": {
                    "quant_method": "fp8",
                    "fmt": "e4m3",
                    "activation_scheme": "dynamic",
                    "weight_block_size": list(block),
                }
            },
        ),
        (plain_dir, dequantized, {}),
    ):
      os.makedirs(path)
      with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump({**hf_config, **extra}, f)
      safetensors_io.write(
          os.path.join(path, "model.safetensors"), tensors, {"format": "pt"}
      )
    reference = (
        transformers.AutoModelForCausalLM.from_pretrained(
            plain_dir, attn_implementation="eager"
        )
        .float()
        .eval()
    )
    ids = _ids(1)
    expected, _, _ = _hf_forward(reference, ids, layer=1)
    # Quantisation changed the function: the comparison below is against
    # the dequantised weights, not the originals.
    original, _, _ = _hf_forward(model, ids, layer=1)
    self.assertGreater(np.abs(original - expected).max(), 1e-3)

    out = os.path.join(tmp, "imported")
    config = importer.import_checkpoint(fp8_dir, out, log=lambda s: None)
    params = logits_check.restore_on_one_device(out, config)
    logits_check.assert_close_to_scale(
        self, np.asarray(transformer.apply(params, ids, config)), expected
    )


def _quantize(weight: np.ndarray, block):
  """(float8_e4m3fn weight, float32 scale_inv) with each block scaled so its
  largest magnitude is e4m3's maximum, 448."""
  shape = fp8.scale_shape(weight.shape, block)
  scale = np.ones(shape, np.float32)
  quantized = np.zeros(weight.shape, np.float32)
  for i in range(shape[0]):
    for j in range(shape[1]):
      rows = slice(i * block[0], (i + 1) * block[0])
      cols = slice(j * block[1], (j + 1) * block[1])
      scale[i, j] = np.abs(weight[rows, cols]).max() / 448.0
      quantized[rows, cols] = weight[rows, cols] / scale[i, j]
  return quantized.astype(ml_dtypes.float8_e4m3fn), scale


if __name__ == "__main__":
  absltest.main()
