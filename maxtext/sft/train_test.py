"""SFT end to end: a Hugging Face checkpoint in, fine-tuned on chat examples.

The SFT workload (`workload="sft"`, `maxtext/configs/sft_tiny.py`) through
the one training loop, in-process and through `//maxtext:train_main`.

A tiny random `LlamaForCausalLM` of `maxtext/configs/sft_tiny.py`'s shape is
built with transformers beside the shipped tokenizer and chat template,
imported with `//tools:import_checkpoint` (which copies the tokenizer files),
and fine-tuned on the shipped chat examples: the first step's loss is the
checkpoint's own assistant-token loss as transformers computes it, the
held-out eval loss falls, and a run stopped by `//maxtext:train_main` and
resumed writes the records of an uninterrupted run.
"""

import json
import os
import shutil

from absl.testing import absltest
import numpy as np

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import torch

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

from maxtext.data import data_config
from maxtext.data import dataset_kinds
from maxtext import workloads
from maxtext.configs import sft_tiny
from maxtext.metrics import jsonl
from testing import run_layout
from testing import runfiles
from testing import tiny_configs

_STEPS = 8
_HALF = 4
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
# The fields every run here sets (both halves of the resumed run too).
_FIELDS = {
    "lr_schedule_steps": _STEPS,  # Fixed, so a resume may raise steps.
    "eval_interval": _HALF,
    "checkpoint_period": _HALF,
    "log_period": 1,
    "tokenizer_path": "",  # The checkpoint's own, copied by the import.
}


class SftTrainTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tiny_configs.fresh_output_dir("sft_train_test_")
    config = sft_tiny.get_config()
    hf_dir = os.path.join(cls.root, "hf")
    os.makedirs(hf_dir)
    torch.manual_seed(0)
    cls.model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.emb_dim,
            intermediate_size=config.mlp_dim,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            max_position_embeddings=config.max_sequence_length,
            rms_norm_eps=config.norm_epsilon,
            rope_theta=config.rope_theta,
            tie_word_embeddings=False,
        )
    )
    cls.model.save_pretrained(hf_dir)
    for name in _TOKENIZER_FILES:
      shutil.copy(os.path.join(sft_tiny.DATA_DIR, name), hf_dir)
    cls.imported = os.path.join(cls.root, "imported")
    done = runfiles.run_binary(
        "tools/import_checkpoint",
        [
            f"--input={hf_dir}",
            f"--output_dir={cls.imported}",
            f"--config={sft_tiny.__file__}",
        ],
        timeout_s=300,
    )
    assert done.returncode == 0, done.stderr
    cls.import_stdout = done.stdout

  def _config(self, run_name, steps):
    """sft_tiny.py from the import, writing under this test's directory."""
    config = sft_tiny.get_config()
    config.update(
        dict(
            _FIELDS,
            base_output_directory=os.path.join(self.root, "runs"),
            run_name=run_name,
            steps=steps,
            load_parameters_path=self.imported,
            jax_compilation_cache_dir=tiny_configs.compilation_cache_dir(),
        )
    )
    return config

  def test_import_copies_the_chat_template(self):
    self.assertIn("chat_template.jinja", self.import_stdout)
    for name in _TOKENIZER_FILES:
      self.assertTrue(os.path.isfile(os.path.join(self.imported, name)), name)

  def test_fine_tunes_evaluates_and_resumes(self):
    reference = workloads.run(self._config("reference", _STEPS))
    self.assertEqual(reference.final_step, _STEPS)
    records = run_layout.untimed_records(reference.run_dir)
    train = [r for r in records if r["kind"] == jsonl.TRAIN]
    evals = [r[jsonl.EVAL_LOSS_KEY] for r in records if r["kind"] == jsonl.EVAL]
    self.assertLen(evals, 2)
    self.assertLess(evals[1], evals[0])
    self.assertLess(train[-1]["loss"], train[0]["loss"])
    self.assertTrue(
        {"config.json", "metrics.jsonl", "tensorboard", "checkpoints"}
        <= set(os.listdir(reference.run_dir))
    )
    with open(
        os.path.join(reference.run_dir, "config.json"), encoding="utf-8"
    ) as f:
      document = json.load(f)
    self.assertEqual(document["config"]["workload"], "sft")
    provenance = document["provenance"]["data"]
    self.assertEqual(
        provenance["chat_files"]["tokenizer_path"]["path"], self.imported
    )

    # Step 0 trains the imported parameters on the assistant's tokens only:
    # its loss is transformers' mean cross entropy over those tokens.
    batch = dataset_kinds.make_dataset(
        data_config.DataConfig.from_config(self._config("reference", 1))
    ).get_batch(0)
    with torch.no_grad():
      logits = self.model(torch.tensor(batch["inputs"])).logits.double()
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        torch.tensor(batch["targets"]).reshape(-1).long(),
        reduction="none",
    ).numpy()
    weights = batch["weights"].reshape(-1)
    expected = float(np.sum(nll * weights) / np.sum(weights))
    self.assertAlmostEqual(train[0]["loss"], expected, delta=1e-4 * expected)

    # The documented command, stopped after half the steps, then resumed.
    flags = [f"--config={sft_tiny.__file__}"] + [
        f"--config.{key}={value}"
        for key, value in self._config("resumed", _HALF).items()
        if key
        in (
            *_FIELDS,
            "base_output_directory",
            "run_name",
            "steps",
            "load_parameters_path",
            "jax_compilation_cache_dir",
        )
    ]
    proc = runfiles.run_binary(
        "maxtext/train_main", flags, timeout_s=600, cache_compilations=True
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn(f"train_main: completed after step {_HALF}", proc.stdout)
    resumed = workloads.run(self._config("resumed", _STEPS))
    self.assertEqual(resumed.start_step, _HALF)
    self.assertEqual(run_layout.untimed_records(resumed.run_dir), records)

  def test_bad_example_is_one_line_before_any_device_work(self):
    bad = os.path.join(self.create_tempdir().full_path, "bad.jsonl")
    with open(sft_tiny.DATA_DIR + "/train.jsonl", encoding="utf-8") as f:
      lines = f.readlines()[:3]
    lines.append('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with open(bad, "w", encoding="utf-8") as f:
      f.writelines(lines)
    runs = os.path.join(self.root, "bad_runs")
    proc = runfiles.run_binary(
        "maxtext/train_main",
        [
            f"--config={sft_tiny.__file__}",
            f"--config.train_data_path={bad}",
            f"--config.base_output_directory={runs}",
        ],
        timeout_s=300,
    )
    self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
    self.assertEqual(
        proc.stderr.strip().splitlines()[-1],
        f"train_main: error: config.train_data_path='{bad}': line 4: no "
        "assistant message: nothing to train on",
    )
    self.assertFalse(os.path.exists(os.path.join(runs, "sft_tiny")))


if __name__ == "__main__":
  absltest.main()
