"""//tools:import_checkpoint and //tools:export_checkpoint through their
binaries: bad input, shape checks, and a run that starts from an import.

A refusal of bad input runs the import's `main` in this process
(`testing/absl_main.py`): the line it prints and its exit status are the
program's, without a fresh interpreter each; every import that must succeed,
and the export's refusals, start the binary.

The Hugging Face directories are written with the project's own exporter
from a random tiny model (no torch here; llama_logits_test checks the
layout against transformers).
"""

import itertools
import json
import os
import shutil

from absl.testing import absltest
import jax
import numpy as np

from maxtext.core import progress
from maxtext.hf import exporter
from maxtext.hf import hf_directory
from maxtext.hf import importer
from maxtext.hf import safetensors_io
from maxtext.model import model_config
from maxtext.model import transformer
from maxtext.generation import generate
from maxtext.generation import sampling
from testing import absl_main
from testing import runfiles
from testing import tiny_configs
from tools import import_checkpoint


def _get(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


def _run(binary, *args):
  return runfiles.run_binary(f"tools/{binary}", list(args), timeout_s=300)


class ImportCheckpointTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tiny_configs.fresh_output_dir("import_checkpoint_test_")
    cls.config = tiny_configs.tiny_config(cls.root, num_layers=2)
    cls.params = transformer.init_params(cls.config, jax.random.PRNGKey(1))
    cls.hf_dir = os.path.join(cls.root, "hf")
    exporter.export_checkpoint(cls.config, cls.params, cls.hf_dir, "float32")

  def _copy(self, name):
    path = os.path.join(self.create_tempdir().full_path, name)
    shutil.copytree(self.hf_dir, path)
    return path

  def refuse(self, args, output_dir):
    """Imports in this process; returns the refusal's stderr."""
    code, _, stderr = absl_main.run(
        import_checkpoint,
        import_checkpoint.main,
        [*args, f"--output_dir={output_dir}"],
    )
    self.assertEqual(code, 2, stderr)
    return stderr

  def assert_refused(self, args, message, output_dir):
    stderr = self.refuse(args, output_dir)
    lines = stderr.strip().splitlines()
    self.assertLen(lines, 1, stderr)
    self.assertEqual(lines[0], "import_checkpoint: error: " + message)
    self.assertFalse(os.path.exists(output_dir))
    parent = os.path.dirname(output_dir)
    self.assertEqual([n for n in os.listdir(parent) if n.startswith("out")], [])

  def test_directory_without_config_json(self):
    hf = self._copy("no_config")
    os.remove(os.path.join(hf, "config.json"))
    out = os.path.join(self.create_tempdir().full_path, "out")
    self.assert_refused(
        [f"--input={hf}"],
        f"{hf}/config.json: missing (not a Hugging Face model?)",
        out,
    )

  def test_unsupported_architecture(self):
    hf = self._copy("mixtral")
    path = os.path.join(hf, "config.json")
    with open(path, encoding="utf-8") as f:
      document = json.load(f)
    document["architectures"] = ["MixtralForCausalLM"]
    with open(path, "w", encoding="utf-8") as f:
      json.dump(document, f)
    out = os.path.join(self.create_tempdir().full_path, "out")
    self.assert_refused(
        [f"--input={hf}"],
        f"{path}: architecture 'MixtralForCausalLM' is not supported "
        "(supported: LlamaForCausalLM, DeepseekV3ForCausalLM, "
        "Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3_5MoeForCausalLM, "
        "Qwen3_5MoeForConditionalGeneration)",
        out,
    )

  def test_missing_tensor(self):
    hf = self._copy("missing")
    path = os.path.join(hf, "model.safetensors")
    source = safetensors_io.SafetensorsFile(path)
    kept = {
        n: np.array(source.array(n))
        for n in source.names()
        if n != "model.layers.1.mlp.up_proj.weight"
    }
    del source
    safetensors_io.write(path, kept)
    out = os.path.join(self.create_tempdir().full_path, "out")
    self.assert_refused(
        [f"--input={hf}"],
        f"{hf}: tensor model.layers.1.mlp.up_proj.weight missing "
        "(expected shape (64, 32))",
        out,
    )

  def test_truncated_shard(self):
    hf = self._copy("truncated")
    path = os.path.join(hf, "model.safetensors")
    os.truncate(path, os.path.getsize(path) - 100)
    out = os.path.join(self.create_tempdir().full_path, "out")
    # Tensors are written in name order: the last one is cut.
    last = "model.norm.weight"
    self.assertRegex(
        self.refuse([f"--input={hf}"], out),
        rf"^import_checkpoint: error: {path}: truncated: tensor "
        rf"{last} ends at byte \d+ of a \d+-byte file\n$",
    )
    self.assertFalse(os.path.exists(out))

  def test_config_given_is_checked_and_differences_reported(self):
    config_file = os.path.join(self.create_tempdir().full_path, "eps.py")
    with open(config_file, "w", encoding="utf-8") as f:
      f.write(
          "from testing import tiny_configs\n"
          "def get_config():\n"
          "  return tiny_configs.tiny_config('/tmp', num_layers=2, "
          "norm_epsilon=1e-6)\n"
      )
    out = os.path.join(self.create_tempdir().full_path, "out")
    done = _run(
        "import_checkpoint",
        f"--input={self.hf_dir}",
        f"--config={config_file}",
        f"--output_dir={out}",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(
        "warning: config.norm_epsilon = 1e-06 but config.json gives 1e-05\n",
        done.stdout,
    )
    self.assertNotIn("config.num_layers = 2", done.stdout)
    self.assertTrue(os.path.isdir(os.path.join(out, "0")))

  def test_config_shape_mismatch_names_tensor_and_both_shapes(self):
    config_file = os.path.join(self.create_tempdir().full_path, "wide.py")
    with open(config_file, "w", encoding="utf-8") as f:
      f.write(
          "from testing import tiny_configs\n"
          "def get_config():\n"
          "  return tiny_configs.tiny_config('/tmp', num_layers=2, "
          "mlp_dim=48)\n"
      )
    out = os.path.join(self.create_tempdir().full_path, "out")
    self.assert_refused(
        [f"--input={self.hf_dir}", f"--config={config_file}"],
        f"{self.hf_dir}/model.safetensors: tensor "
        "model.layers.0.mlp.gate_proj.weight has shape (64, 32), the config "
        "expects (48, 32)",
        out,
    )

  def test_progress_counts_tensors_then_parameters_and_ends_each(self):
    ticks = itertools.count(0.0)  # Each reading of the clock 1 s later.
    lines = []
    reporter = progress.Reporter(
        progress.Lines(lines.append), interval_s=1.0, clock=lambda: next(ticks)
    )
    out = os.path.join(self.create_tempdir().full_path, "imported")
    importer.import_checkpoint(
        self.hf_dir, out, log=lambda _: None, progress=reporter
    )
    hf = hf_directory.HfDirectory(self.hf_dir)
    _, tensors = importer.plan(hf, model_config.of(self.config))
    tensor_bytes = sum(
        int(np.prod(hf.shape(t.hf_name))) * hf.dtype(t.hf_name).itemsize
        for t in tensors
    )
    leaves = jax.tree_util.tree_leaves(self.params)
    converting = [l for l in lines if l.startswith("import_checkpoint: conv")]
    writing = [l for l in lines if l.startswith("import_checkpoint: writ")]
    self.assertLen(lines, len(converting) + len(writing))
    # One line per tensor read (a second passes between two), then the end.
    self.assertLen(converting, len(tensors) + 1)
    for i, line in enumerate(converting[:-1], 1):
      self.assertRegex(
          line,
          rf"ETA [\dms ]+; tensors {i}/{len(tensors)}, shard "
          r"model.safetensors$",
      )
    self.assertRegex(
        converting[-1],
        r"^import_checkpoint: converting: done, "
        rf"{progress.format_bytes(tensor_bytes)} in \d+ s \(.*/s\); tensors "
        rf"{len(tensors)}/{len(tensors)}, shard model.safetensors$",
    )
    self.assertLen(writing, len(leaves) + 1)
    self.assertRegex(
        writing[-1],
        r"^import_checkpoint: writing: done, "
        rf"{progress.format_bytes(sum(x.nbytes for x in leaves))} in \d+ s "
        rf"\(.*/s\); parameters {len(leaves)}/{len(leaves)}$",
    )

  def test_train_main_starts_from_the_import_and_export_round_trips(self):
    out = os.path.join(self.root, "imported")
    done = _run(
        "import_checkpoint", f"--input={self.hf_dir}", f"--output_dir={out}"
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn("config.num_layers = 2\n", done.stdout)
    self.assertIn(f"import_checkpoint: wrote {out}\n", done.stdout)
    # Progress on stderr (not a terminal: its last lines), never on stdout.
    self.assertRegex(
        done.stderr, r"(?m)^import_checkpoint: converting: done, .*; tensors "
    )
    self.assertRegex(
        done.stderr, r"(?m)^import_checkpoint: writing: done, .*; parameters "
    )
    self.assertNotIn("converting", done.stdout)

    # tools/generate reads the import as a run directory.
    imported = generate.load_run(out)
    self.assertEqual(imported.step, 0)
    for path, leaf in jax.tree_util.tree_leaves_with_path(self.params):
      np.testing.assert_array_equal(
          np.asarray(_get(imported.params, path)), np.asarray(leaf)
      )
    options = sampling.SamplingOptions(max_new_tokens=5, temperature=0.0)
    expected = generate.generate_ids(imported, [3, 1, 4], options)[0]
    done = _run(
        "generate",
        f"--run_dir={out}",
        "--prompt_ids=3,1,4",
        "--max_new_tokens=5",
        "--temperature=0",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertEqual(
        done.stdout.splitlines()[-1], ",".join(str(i) for i in expected)
    )

    # Two steps at a small learning rate: the trained parameters stay
    # within a few learning rates of the imported ones, far from any fresh
    # initialisation.
    learning_rate = 1e-4
    runs = os.path.join(self.root, "runs")
    flags = tiny_configs.tiny_flags(
        runs,
        run_name="from_import",
        steps=2,
        extra={
            "num_layers": 2,
            "learning_rate": learning_rate,
            "warmup_steps": 1,
            # Fixed, so that the resume below may raise the step budget.
            "lr_schedule_steps": 3,
        },
    )
    proc = runfiles.run_binary(
        "maxtext/train_main",
        [f"--config={out}/config.py", f"--config.load_parameters_path={out}"]
        + flags,
        timeout_s=600,
        cache_compilations=True,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn("train_main: completed after step 2", proc.stdout)
    run = generate.load_run(os.path.join(runs, "from_import"))
    self.assertEqual(run.step, 2)
    # The same command with a larger budget resumes the run from its own
    # step-2 checkpoint (load_parameters_path only starts a fresh run).
    proc = runfiles.run_binary(
        "maxtext/train_main",
        [f"--config={out}/config.py", f"--config.load_parameters_path={out}"]
        + [f for f in flags if not f.startswith("--config.steps=")]
        + ["--config.steps=3"],
        timeout_s=600,
        cache_compilations=True,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn("train_main: completed after step 3", proc.stdout)
    resumed = generate.load_run(os.path.join(runs, "from_import"), 3)
    self.assertGreater(
        np.abs(
            np.asarray(resumed.params["embedding"])
            - np.asarray(run.params["embedding"])
        ).max(),
        0.0,
    )
    fresh = transformer.init_params(self.config, jax.random.PRNGKey(0))
    for name in ("embedding", "unembedding"):
      trained = np.asarray(run.params[name])
      moved = np.abs(trained - np.asarray(self.params[name])).max()
      self.assertGreater(moved, 0.0)
      self.assertLess(moved, 10 * learning_rate * 2)
      self.assertGreater(np.abs(trained - np.asarray(fresh[name])).max(), 0.1)
    np.testing.assert_array_less(
        np.abs(
            np.asarray(run.params["layers"]["wq"])
            - np.asarray(self.params["layers"]["wq"])
        ),
        10 * learning_rate * 2,
    )

    # Export the trained run (its newest step, 3) and import it again.
    exported = os.path.join(self.root, "exported")
    done = _run(
        "export_checkpoint",
        f"--run_dir={run.run_dir}",
        f"--output_dir={exported}",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    reimported = os.path.join(self.root, "reimported")
    done = _run(
        "import_checkpoint", f"--input={exported}", f"--output_dir={reimported}"
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    again = generate.load_run(reimported)
    for path, leaf in jax.tree_util.tree_leaves_with_path(resumed.params):
      np.testing.assert_array_equal(
          np.asarray(_get(again.params, path)), np.asarray(leaf)
      )
    back = safetensors_io.SafetensorsFile(
        os.path.join(exported, "model.safetensors")
    )
    np.testing.assert_array_equal(
        np.asarray(back.array("model.layers.1.self_attn.o_proj.weight")),
        np.asarray(resumed.params["layers"]["wo"][1]).reshape(-1, 32).T,
    )

  def test_deepseek_and_tokenizer_files_round_trip_through_the_binaries(self):
    # A latent-attention mixture-of-experts model with everything
    # DeepSeek-V3 adds (dense first layer, grouped biased sigmoid routing,
    # routed scaling, YaRN), exported, imported and exported again by the
    # binaries: every parameter and tensor comes back bit for bit, and the
    # tokenizer files travel with it.
    config = tiny_configs.model_config(
        tiny_configs.TINY_MLA,
        tiny_configs.TINY_MOE,
        num_layers=3,
        router_score="sigmoid",
        router_bias=True,
        num_expert_groups=2,
        expert_groups_per_token=1,
        routed_scaling_factor=2.5,
        rope_scaling="yarn",
        rope_scaling_factor=4.0,
        rope_original_max_position=8,
        rope_yarn_mscale=1.0,
        rope_yarn_mscale_all_dim=1.0,
    )
    params = transformer.init_params(config, jax.random.PRNGKey(2))
    params["moe_layers"]["router_bias"] = jax.random.normal(
        jax.random.PRNGKey(3), params["moe_layers"]["router_bias"].shape
    )
    root = self.create_tempdir().full_path
    hf = os.path.join(root, "hf")
    exporter.export_checkpoint(config, params, hf, "float32")
    tokenizer = {
        "tokenizer.json": '{"model": {"type": "BPE"}}',
        "tokenizer_config.json": '{"eos_token": "</s>"}',
        "generation_config.json": '{"eos_token_id": 1}',
    }
    for name, text in tokenizer.items():
      with open(os.path.join(hf, name), "w", encoding="utf-8") as f:
        f.write(text)

    imported = os.path.join(root, "imported")
    done = _run(
        "import_checkpoint", f"--input={hf}", f"--output_dir={imported}"
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    for line in (
        "config.attention_type = 'mla'",
        "config.num_dense_layers = 1",
        "config.num_expert_groups = 2",
        "config.rope_scaling = 'yarn'",
        "tokenizer files copied: tokenizer.json, tokenizer_config.json, "
        "generation_config.json",
    ):
      self.assertIn(line + "\n", done.stdout)
    loaded = generate.load_run(imported)
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
      np.testing.assert_array_equal(
          np.asarray(_get(loaded.params, path)), np.asarray(leaf)
      )

    # train_main starts from the import (the config it wrote, the run's
    # own fields given) with DeepSeek-V3's router bias updates at its
    # pre-training rate: every bias entry moves by -rate, 0 or +rate a step.
    rate = 1e-3
    runs = os.path.join(root, "runs")
    proc = runfiles.run_binary(
        "maxtext/train_main",
        [
            f"--config={imported}/config.py",
            f"--config.load_parameters_path={imported}",
            f"--config.base_output_directory={runs}",
            "--config.run_name=ds_from_import",
            "--config.steps=2",
            "--config.global_batch_size=4",
            "--config.gradient_accumulation_steps=2",
            "--config.eval_batch_size=4",
            "--config.eval_interval=2",
            "--config.eval_steps=1",
            "--config.target_eval_loss=0.0",
            "--config.learning_rate=1e-4",
            "--config.warmup_steps=1",
            "--config.enable_mllog=False",
            f"--config.router_bias_update_rate={rate}",
            f"--config.jax_compilation_cache_dir="
            f"{tiny_configs.compilation_cache_dir()}",
        ],
        timeout_s=600,
        cache_compilations=True,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn("train_main: completed after step 2", proc.stdout)
    trained = generate.load_run(os.path.join(runs, "ds_from_import"))
    moves = (
        np.asarray(trained.params["moe_layers"]["router_bias"])
        - np.asarray(params["moe_layers"]["router_bias"])
    ) / rate
    np.testing.assert_allclose(moves, np.round(moves), atol=1e-2)
    self.assertLessEqual(float(np.max(np.abs(moves))), 2 + 1e-2)
    self.assertGreater(np.count_nonzero(np.round(moves)), 0)

    # Exported again in shards of at most 20 kB (several tensors each).
    exported = os.path.join(root, "exported")
    done = _run(
        "export_checkpoint",
        f"--run_dir={imported}",
        f"--output_dir={exported}",
        "--max_shard_bytes=20000",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    for name, text in tokenizer.items():
      self.assertIn(
          f"export_checkpoint: copied {name} from "
          f"{os.path.join(imported, name)}\n",
          done.stdout,
      )
      with open(os.path.join(exported, name), encoding="utf-8") as f:
        self.assertEqual(f.read(), text)
    with open(os.path.join(exported, "config.json"), encoding="utf-8") as f:
      document = json.load(f)
    self.assertEqual(document["architectures"], ["DeepseekV3ForCausalLM"])
    first = safetensors_io.SafetensorsFile(
        os.path.join(hf, "model.safetensors")
    )
    second = hf_directory.HfDirectory(exported)
    with open(
        os.path.join(exported, hf_directory.INDEX_FILE), encoding="utf-8"
    ) as f:
      index = json.load(f)
    shards = sorted(set(index["weight_map"].values()))
    self.assertGreater(len(shards), 2)
    # The export's progress, on stderr: its last line counts every tensor
    # and names the last shard.
    count = len(index["weight_map"])
    self.assertRegex(
        done.stderr,
        r"(?m)^export_checkpoint: writing: done, "
        rf"{progress.format_bytes(index['metadata']['total_size'])} in \d+ s "
        rf"\(.*/s\); tensors {count}/{count}, shard {shards[-1]}$",
    )
    self.assertNotIn("writing", done.stdout)
    self.assertFalse(
        os.path.exists(os.path.join(exported, "model.safetensors"))
    )
    total = 0
    for shard in shards:
      tensors = safetensors_io.SafetensorsFile(os.path.join(exported, shard))
      nbytes = sum(
          np.prod(tensors.shape(n)) * tensors.dtype(n).itemsize
          for n in tensors.names()
      )
      # A shard over the limit holds one tensor larger than it.
      self.assertTrue(nbytes <= 20000 or len(tensors.names()) == 1, shard)
      total += nbytes
    self.assertEqual(index["metadata"]["total_size"], total)
    self.assertEqual(sorted(index["weight_map"]), sorted(first.names()))
    self.assertIn(
        "model.layers.2.mlp.experts.3.down_proj.weight", first.names()
    )
    for name in first.names():
      np.testing.assert_array_equal(
          np.asarray(second.array(name)),
          np.asarray(first.array(name)),
          err_msg=name,
      )

  def test_export_refuses_a_model_deepseek_cannot_hold(self):
    config = tiny_configs.model_config(
        tiny_configs.TINY_MLA, tiny_configs.TINY_MOE, num_layers=2
    )  # A softmax router: DeepSeek-V3's is a sigmoid.
    params = transformer.abstract_params(config)
    out = os.path.join(self.create_tempdir().full_path, "out")
    with self.assertRaisesRegex(
        ValueError,
        r"^config.router_score='softmax': a DeepseekV3ForCausalLM needs "
        r"'sigmoid'$",
    ):
      exporter.export_checkpoint(config, params, out, "float32")
    self.assertFalse(os.path.exists(out))

  def test_export_refuses_a_bad_dtype_and_a_used_output_dir(self):
    used = self.create_tempdir().full_path
    with open(os.path.join(used, "x"), "w", encoding="utf-8") as f:
      f.write("x")
    for args, message in (
        (
            ["--run_dir=/nonexistent", f"--output_dir={used}", "--dtype=int8"],
            "export_checkpoint: error: --dtype='int8': must be one of "
            "['bfloat16', 'float32']",
        ),
    ):
      done = _run("export_checkpoint", *args)
      self.assertEqual(done.returncode, 2, done.stderr)
      self.assertEqual(done.stderr.strip(), message)
    self.assertEqual(os.listdir(used), ["x"])


if __name__ == "__main__":
  absltest.main()
