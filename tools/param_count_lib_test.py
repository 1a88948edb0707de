"""Parameter counts: tiny configs by hand, DeepSeek-V3 against its paper."""

import os

from absl.testing import absltest
import jax

from maxtext.model import transformer
from maxtext.configs import deepseekv3_671b
from maxtext.configs import default
from maxtext.configs import moe_tiny
from testing import runfiles
from tools import param_count_lib

# DeepSeek-V3's published totals (main model, the multi-token-prediction
# module excluded): 671B parameters (and 37B activated per token).
_PUBLISHED_TOTAL = 671e9


def _moe_tiny_by_hand():
  """moe_tiny's parts: vocab 256, emb 128, 2 layers (layer 0 dense), 4
  query heads, 2 kv heads of 32, MLP 512, 4 experts of 128, 1 shared."""
  e = 128
  attention = e * 4 * 32 + 2 * (e * 2 * 32) + 4 * 32 * e  # wq, wk, wv, wo
  return {
      "embedding": 256 * e,
      "attention": 2 * attention,
      "norms": 2 * 2 * e + e,  # attn_norm, mlp_norm per layer; final_norm
      "dense_mlp": 3 * e * 512,
      "router": e * 4,
      "shared_experts": 3 * e * 128,
      "routed_experts": 4 * 3 * e * 128,
      "unembedding": e * 256,
  }


def _deepseek_by_hand():
  """DeepSeek-V3's parts from its config.json's numbers."""
  e, layers, dense, vocab, heads = 7168, 61, 3, 129280, 128
  moe_layers = layers - dense
  mla = (
      e * 1536  # q down-projection
      + 1536 * heads * (128 + 64)  # q up-projection (nope + rope)
      + e * (512 + 64)  # kv latent and the shared rope key
      + 512 * heads * (128 + 128)  # k nope and v from the latent
      + heads * 128 * e  # output
  )
  expert = 3 * e * 2048
  return {
      "embedding": vocab * e,
      "attention": layers * mla,
      # attn_norm, mlp_norm, q and kv latent norms per layer; final_norm.
      "norms": layers * (2 * e + 1536 + 512) + e,
      "dense_mlp": dense * 3 * e * 18432,
      # The router's weights and its correction bias.
      "router": moe_layers * (e + 1) * 256,
      "shared_experts": moe_layers * expert,
      "routed_experts": moe_layers * 256 * expert,
      "unembedding": e * vocab,
  }


class ParamCountTest(absltest.TestCase):

  def test_moe_tiny_by_hand(self):
    counts = param_count_lib.count(moe_tiny.get_config())
    parts = _moe_tiny_by_hand()
    self.assertEqual(counts.parts, parts)
    self.assertEqual(counts.total, sum(parts.values()))
    self.assertEqual(counts.total, 607_360)
    # 2 of 4 routed experts: half of them is idle for a token.
    self.assertEqual(counts.active, 607_360 - 4 * 3 * 128 * 128 // 2)
    self.assertEqual(counts.active_without_embedding, 509_056 - 32_768)

  def test_dense_model_is_all_active_and_matches_num_params(self):
    config = default.get_config()
    counts = param_count_lib.count(config)
    params = transformer.init_params(config, jax.random.PRNGKey(0))
    self.assertEqual(counts.total, transformer.num_params(params))
    self.assertEqual(counts.active, counts.total)
    self.assertEqual(counts.parts["routed_experts"], 0)

  def test_deepseek_v3_matches_its_published_shape(self):
    counts = param_count_lib.count(deepseekv3_671b.get_config())
    parts = _deepseek_by_hand()
    self.assertEqual(counts.parts, parts)
    self.assertEqual(
        counts.active,
        sum(parts.values()) - parts["routed_experts"] * 248 // 256,
    )
    # Total: within 1% of the published 671B.
    self.assertLess(abs(counts.total / _PUBLISHED_TOTAL - 1), 0.01)
    # Active: "37B" is a rounded figure. The count without the input
    # embedding table (a lookup, not a matmul: DeepSeek's convention; with it
    # DeepSeek-V2-Lite would be 2.66B, not its published 2.4B) rounds to it
    # (36.63B); with the table it is 37.55B.
    self.assertEqual(round(counts.active_without_embedding / 1e9), 37)

  def test_binary_prints_the_counts(self):
    proc = runfiles.run_binary(
        "tools/param_count",
        [f"--config={os.path.join(_configs_dir(), 'moe_tiny.py')}"],
        timeout_s=300,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = {l.split()[0]: l for l in proc.stdout.splitlines()}
    self.assertIn("607,360", lines["total"])
    self.assertIn("509,056", lines["active"])
    self.assertIn("routed experts 2 of 4", lines["active"])

  def test_binary_names_a_bad_field_in_one_line(self):
    proc = runfiles.run_binary(
        "tools/param_count",
        [
            f"--config={os.path.join(_configs_dir(), 'default.py')}",
            "--config.attention_type=mla",
        ],
        timeout_s=300,
    )
    self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
    self.assertEqual(
        proc.stderr.strip().splitlines()[-1],
        "param_count: error: config.kv_lora_rank=0: must be >= 1",
    )
    self.assertNotIn("Traceback", proc.stderr)


def _configs_dir():
  return os.path.dirname(os.path.abspath(moe_tiny.__file__))


if __name__ == "__main__":
  absltest.main()
