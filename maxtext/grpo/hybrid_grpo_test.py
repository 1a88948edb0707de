"""GRPO on the Qwen3.5 hybrid model (Gated DeltaNet beside gated attention).

A tiny hybrid (`tiny_configs.TINY_QWEN35`: two groups of one Gated DeltaNet
layer and one attention layer, every layer MoE) is pretrained briefly, then
post-trained through the one loop with the qwen35_397b_grpo config's
reference choices that apply to it (frozen router, the leave-one-out
normalised advantage). The rollouts run on the paged decoder, whose
per-slot DeltaNet states must give the same log-probabilities the trained
model computes over the whole sequence (the importance ratio starts at 1);
the DeltaNet and attention parameters move, the router does not.
"""

import os

from absl.testing import absltest
import jax
import numpy as np

from maxtext import workloads
from maxtext.configs import qwen35_397b_a17b
from maxtext.configs import qwen35_397b_grpo
from maxtext.metrics import jsonl
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.storage import checkpointing
from testing import grpo_start
from testing import tiny_configs

# The hybrid's fields on top of the tiny config (its vocabulary of 32 holds
# the progression task's prompts).
_HYBRID = {
    key: value
    for key, value in tiny_configs.TINY_QWEN35.items()
    if key != "vocab_size"
}


def _params(checkpoints, config):
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return checkpointing.restore_params_only(
      checkpoints, transformer.abstract_params(config, device)
  )


class HybridGrpoTest(absltest.TestCase):

  def test_the_grpo_config_trains_the_qwen35_model(self):
    grpo = qwen35_397b_grpo.get_config()
    model = qwen35_397b_a17b.get_config()
    # Every model field is the 397B's, but the row length (the rules').
    for field in model_config.FIELDS:
      if field != "max_sequence_length":
        self.assertEqual(grpo[field], model[field], field)
    self.assertEqual(grpo.max_sequence_length, qwen35_397b_grpo.SEQUENCE)
    self.assertEqual(grpo.full_attention_interval, 4)
    self.assertLess(qwen35_397b_grpo.STOP_ID, grpo.vocab_size)

  def test_grpo_trains_the_hybrid_model(self):
    root = self.create_tempdir().full_path
    workloads.run(
        tiny_configs.tiny_config(
            root,
            run_name="pretrain",
            steps=grpo_start.PRETRAIN_STEPS,
            **_HYBRID,
        )
    )
    start = os.path.join(root, "pretrain", "checkpoints")
    config = tiny_configs.tiny_config(
        root,
        run_name="grpo",
        steps=2,
        **{
            **_HYBRID,
            **grpo_start.RUN_FIELDS,
            "load_parameters_path": start,
            "checkpoint_period": 1,
            "grpo_freeze_router": True,
            "grpo_advantage_estimator": "rloo_normalized",
            "grpo_decoder": "paged",
        },
    )
    result = workloads.run(config)
    self.assertEqual(result.final_step, 2)
    train = [
        r
        for r in jsonl.read_jsonl(os.path.join(result.run_dir, "metrics.jsonl"))
        if r["kind"] == "train"
    ]
    self.assertEqual([r["step"] for r in train], [0, 1])
    for record in train:
      for name in ("loss", "grad_norm", "rewards/mean", "kl"):
        self.assertTrue(np.isfinite(record[name]), (record["step"], name))
    # The rollout's log-probabilities (paged decoder, recurrent states per
    # slot) are the trained model's: the first step's ratio is 1.
    self.assertAlmostEqual(train[0]["is_ratio/mean"], 1.0, places=3)
    self.assertGreater(train[0]["grad_norm"], 0.0)

    before = _params(start, config)
    after = _params(os.path.join(result.run_dir, "checkpoints"), config)

    def moved(stack, name):
      return not np.array_equal(
          np.asarray(before[stack][name]), np.asarray(after[stack][name])
      )

    for name in ("wq", "wk", "wv", "wz", "wo", "a_log", "conv_q"):
      self.assertTrue(moved("linear_layers", name), name)
    for name in ("wq", "wq_gate", "wo"):
      self.assertTrue(moved("moe_layers", name), name)
    for stack in ("linear_layers", "moe_layers"):
      self.assertFalse(moved(stack, "router"), stack)


if __name__ == "__main__":
  absltest.main()
