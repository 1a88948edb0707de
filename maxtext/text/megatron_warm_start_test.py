"""The deepseekv3_671b path, tiny: a Hugging Face DeepSeek-V3 checkpoint
imported, then trained from on Megatron indexed datasets.

The checkpoint is a random tiny model with every DeepSeek-V3 feature the
import reads (latent attention, a dense first layer, grouped biased sigmoid
routing, routed scaling), written in the published layout by the project's
exporter; `maxtext.hf.importer` imports it against the run's config, and
`trainer.run` starts from it (`load_parameters_path`) on a blend of two
indexed datasets, evaluating on the validation prefix's first 8 rows.
"""

import os

from absl.testing import absltest
import jax
import numpy as np

from maxtext import workloads
from maxtext.config import config_lib
from maxtext.hf import exporter
from maxtext.hf import importer
from maxtext.model import transformer
from maxtext.storage import run_record
from maxtext.generation import generate
from maxtext.text import megatron_index
from testing import run_layout
from testing import tiny_configs

_VOCAB = 32


def _documents(seed, count):
  rng = np.random.default_rng(seed)
  return [
      [
          rng.integers(0, _VOCAB - 1, int(rng.integers(5, 40))).tolist()
          + [_VOCAB - 1]
      ]
      for _ in range(count)
  ]


class MegatronWarmStartTest(absltest.TestCase):

  def test_import_then_train_on_indexed_data(self):
    root = tiny_configs.fresh_output_dir("megatron_warm_start_test_")
    prefixes = {}
    for name, seed, count in (("a", 1, 50), ("b", 2, 50), ("val", 3, 20)):
      prefixes[name] = os.path.join(root, f"{name}_text_document")
      megatron_index.write(prefixes[name], _documents(seed, count), np.uint16)
    config = tiny_configs.tiny_config(
        root,
        run_name="warm_start",
        steps=2,
        **tiny_configs.TINY_MLA,
        **tiny_configs.TINY_MOE,
        num_layers=2,
        router_score="sigmoid",
        router_bias=True,
        num_expert_groups=2,
        expert_groups_per_token=1,
        routed_scaling_factor=2.5,
        dataset_type="megatron",
        train_data_path=f"0.5 {prefixes['a']} 0.5 {prefixes['b']}",
        eval_data_path=prefixes["val"],
        megatron_eval_samples=8,
        eval_interval=2,
        learning_rate=1e-5,
        warmup_steps=1,
        enable_mllog=False,
    )
    params = transformer.init_params(config, jax.random.PRNGKey(7))
    hf = os.path.join(root, "hf")
    exporter.export_checkpoint(config, params, hf, "float32")
    imported = os.path.join(root, "imported")
    importer.import_checkpoint(
        hf, imported, config_lib.to_json_dict(config), log=lambda line: None
    )

    config.load_parameters_path = imported
    result = workloads.run(config)
    self.assertEqual((result.start_step, result.final_step), (0, 2))

    # It trained from the import: two steps at 1e-5 move no weight by more
    # than 1e-4, while the run's own initialisation is far from it.
    trained = generate.load_run(result.run_dir).params
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
      got = trained
      for key in path:
        got = got[key.key]
      np.testing.assert_allclose(
          np.asarray(got), np.asarray(leaf), atol=1e-4, err_msg=str(path)
      )
    fresh = transformer.init_params(config, jax.random.PRNGKey(config.seed))
    self.assertGreater(
        float(np.max(np.abs(fresh["embedding"] - params["embedding"]))), 0.1
    )

    # On the indexed data: both prefixes recorded, and an eval over the
    # eval set.
    data = run_record.recorded_data(result.run_dir)
    self.assertEqual(
        [entry["prefix"] for entry in data["megatron"]["blend"]],
        [prefixes["a"], prefixes["b"]],
    )
    self.assertEqual(data["megatron"]["eval"]["samples"], 8)
    evals = [
        r
        for r in run_layout.untimed_records(result.run_dir)
        if r["kind"] == "eval"
    ]
    self.assertLen(evals, 1)
    self.assertTrue(np.isfinite(evals[0]["eval_loss"]))


if __name__ == "__main__":
  absltest.main()
