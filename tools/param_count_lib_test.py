"""Parameter counts: tiny configs by hand."""

import os

from absl.testing import absltest
import jax

from maxtext import model
from maxtext.configs import default
from maxtext.configs import moe_tiny
from testing import runfiles
from tools import param_count_lib


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
    params = model.init_params(config, jax.random.PRNGKey(0))
    self.assertEqual(counts.total, model.num_params(params))
    self.assertEqual(counts.active, counts.total)
    self.assertEqual(counts.parts["routed_experts"], 0)

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


def _configs_dir():
  return os.path.dirname(os.path.abspath(moe_tiny.__file__))


if __name__ == "__main__":
  absltest.main()
