"""Damaged and hostile Hugging Face directories through the real binaries.

Each case runs `//tools:import_checkpoint` (or `//tools:export_checkpoint`)
on a real model directory (a tiny random model written by
the project's exporter) damaged on disk the way the case says: a header
whose offsets point into the header or into another tensor, an index that
names files outside the directory, fields of the wrong JSON type, a layer
count no checkpoint holds, NaN weights, what a killed import left, a
symbolically linked output directory. Refusals are one line, exit status
2, nothing written.

A refusal of damaged input runs the import's `main` in this process
(`testing/absl_main.py`): what it checks is the importer's reading, not the
process. What is about the process starts the real binary: a refusal
through it (exit status 2, no traceback), a kill, what a killed run left,
and each import that must succeed.
"""

import glob
import json
import os
import shutil
import struct
import subprocess
import time

from absl.testing import absltest
import jax
import numpy as np

from maxtext.hf import exporter
from maxtext.model import transformer
from testing import absl_main
from testing import runfiles
from testing import tiny_configs
from tools import import_checkpoint

_ERROR = "import_checkpoint: error: "


def _run(binary, *args):
  return runfiles.run_binary(f"tools/{binary}", list(args), timeout_s=300)


def _read(path):
  """(header dict, data bytes) of a safetensors file."""
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
    return header, f.read()


def _write(path, header, data):
  text = json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)


def _edit_json(path, edit):
  with open(path, encoding="utf-8") as f:
    document = json.load(f)
  document = edit(document) or document
  with open(path, "w", encoding="utf-8") as f:
    json.dump(document, f)


class ImportCheckpointErrorsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tiny_configs.fresh_output_dir("import_errors_test_")
    config = tiny_configs.tiny_config(cls.root, num_layers=2)
    params = transformer.init_params(config, jax.random.PRNGKey(1))
    cls.hf_dir = os.path.join(cls.root, "hf")
    exporter.export_checkpoint(config, params, cls.hf_dir, "float32")

  def copy(self, name="hf"):
    path = os.path.join(self.create_tempdir().full_path, name)
    shutil.copytree(self.hf_dir, path)
    return path

  def shard(self, hf):
    return os.path.join(hf, "model.safetensors")

  def assert_refused(self, hf, message, *extra):
    """Imports `hf`; checks the one-line refusal holding `message`."""
    out = os.path.join(self.create_tempdir().full_path, "out")
    code, stdout, stderr = absl_main.run(
        import_checkpoint,
        import_checkpoint.main,
        [f"--input={hf}", f"--output_dir={out}", *extra],
    )
    self.assertEqual(code, 2, stdout + stderr)
    lines = stderr.strip().splitlines()
    self.assertLen(lines, 1, stderr)
    self.assertStartsWith(lines[0], _ERROR)
    self.assertIn(message, lines[0])
    self.assertFalse(os.path.exists(out))
    self.assertEqual(os.listdir(os.path.dirname(out)), [])
    return lines[0]

  # --- 2: offsets into the header or another tensor --------------------------

  def test_negative_offsets_are_refused(self):
    hf = self.copy()
    header, data = _read(self.shard(hf))
    name = "model.norm.weight"
    size = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
    header[name]["data_offsets"] = [-size, 0]
    _write(self.shard(hf), header, data)
    self.assert_refused(
        hf,
        f"{self.shard(hf)}: tensor {name}: data_offsets [-{size}, 0] are not "
        "[begin, end] with 0 <= begin <= end",
    )

  def test_two_tensors_over_the_same_bytes_are_refused(self):
    hf = self.copy()
    header, data = _read(self.shard(hf))
    first = "model.layers.0.self_attn.q_proj.weight"
    second = "model.layers.1.self_attn.q_proj.weight"
    header[second]["data_offsets"] = list(header[first]["data_offsets"])
    _write(self.shard(hf), header, data)
    line = self.assert_refused(hf, f"{self.shard(hf)}: tensor ")
    self.assertRegex(line, r"overlaps tensor model\.layers\.[01]\.self_attn")

  # --- 3: shard names outside the input directory ----------------------------

  def write_index(self, hf, shard_name):
    header, _ = _read(self.shard(hf))
    index = {
        "metadata": {},
        "weight_map": {n: shard_name for n in header if n != "__metadata__"},
    }
    with open(
        os.path.join(hf, "model.safetensors.index.json"), "w", encoding="utf-8"
    ) as f:
      json.dump(index, f)

  def test_an_index_naming_a_file_outside_is_refused(self):
    hf = self.copy()
    self.write_index(hf, "../outside.safetensors")
    shutil.move(
        self.shard(hf), os.path.join(os.path.dirname(hf), "outside.safetensors")
    )
    self.assert_refused(
        hf, "shard '../outside.safetensors' is outside the model directory"
    )

  def test_an_absolute_path_is_refused_without_printing_the_file(self):
    hf = self.copy()
    secret = os.path.join(self.create_tempdir().full_path, "passwd")
    with open(secret, "w", encoding="utf-8") as f:
      f.write("root:x:0:0:root:/root:/bin/bash\n")
    self.write_index(hf, secret)
    line = self.assert_refused(
        hf, f"shard {secret!r} is outside the model directory"
    )
    self.assertNotIn("root:", line)
    self.assertNotIn(str(struct.unpack("<Q", b"root:x:0")[0]), line)

  def test_symlinked_shards_as_in_the_hugging_face_cache_import(self):
    # snapshots/<rev>/model.safetensors -> ../../blobs/<hash>.
    cache = self.create_tempdir().full_path
    blobs = os.path.join(cache, "blobs")
    snapshot = os.path.join(cache, "snapshots", "abc")
    os.makedirs(blobs)
    shutil.copytree(self.hf_dir, snapshot)
    for name in os.listdir(snapshot):
      os.rename(os.path.join(snapshot, name), os.path.join(blobs, name + "0"))
      os.symlink(
          os.path.join("..", "..", "blobs", name + "0"),
          os.path.join(snapshot, name),
      )
    out = os.path.join(self.create_tempdir().full_path, "out")
    done = _run(
        "import_checkpoint", f"--input={snapshot}", f"--output_dir={out}"
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertTrue(os.path.isdir(os.path.join(out, "0")))

  # --- 4: malformed types -----------------------------------------------------

  def test_malformed_types_are_one_line_naming_the_field(self):
    def header_edit(edit):
      def damage(hf):
        header, data = _read(self.shard(hf))
        edit(header["model.norm.weight"])
        _write(self.shard(hf), header, data)

      return damage

    def config_edit(edit):
      return lambda hf: _edit_json(os.path.join(hf, "config.json"), edit)

    cases = [
        (
            "config.json a list",
            config_edit(lambda d: [d]),
            "config.json: a JSON list, not an object",
        ),
        (
            "a list where an object belongs",
            config_edit(lambda d: d.update(rope_scaling=[8.0])),
            "config.json: rope_scaling is a list ([8.0]), not an object",
        ),
        (
            "a string where an integer belongs",
            config_edit(lambda d: d.update(hidden_size="32")),
            "config.json: hidden_size is a string ('32'), not an integer",
        ),
        (
            "an int dtype",
            header_edit(lambda e: e.update(dtype=5)),
            "tensor model.norm.weight: unsupported dtype 5",
        ),
        (
            "a missing shape",
            header_edit(lambda e: e.pop("shape")),
            "model.safetensors: tensor model.norm.weight: header entry has no "
            "'shape'",
        ),
    ]
    for name, damage, message in cases:
      with self.subTest(name):
        hf = self.copy()
        damage(hf)
        self.assert_refused(hf, message)

  # --- 5: a layer count no checkpoint holds ----------------------------------

  def test_a_huge_layer_count_is_refused_before_the_plan(self):
    hf = self.copy()
    _edit_json(
        os.path.join(hf, "config.json"),
        lambda d: d.update(num_hidden_layers=1_000_000),
    )
    began = time.monotonic()
    self.assert_refused(
        hf,
        "the config has 1000000 layers (num_hidden_layers / num_layers) but "
        "the tensors hold 2",
    )
    # Refused before a plan of 9 million tensors: a binary start, no more.
    self.assertLess(time.monotonic() - began, 60)

  # --- 9: non-finite weights --------------------------------------------------

  def test_nan_weights_are_refused_unless_allowed(self):
    hf = self.copy()
    header, data = _read(self.shard(hf))
    name = "model.layers.1.mlp.down_proj.weight"
    begin = header[name]["data_offsets"][0]
    data = bytearray(data)
    data[begin : begin + 4] = np.array([np.nan], np.float32).tobytes()
    _write(self.shard(hf), header, bytes(data))
    self.assert_refused(
        hf,
        f"{self.shard(hf)}: tensor {name} holds non-finite values (NaN or Inf",
    )
    out = os.path.join(self.create_tempdir().full_path, "out")
    done = _run(
        "import_checkpoint",
        f"--input={hf}",
        f"--output_dir={out}",
        "--allow_non_finite",
    )
    self.assertEqual(done.returncode, 0, done.stderr)

  def test_an_output_under_a_regular_file_is_refused(self):
    parent = os.path.join(self.create_tempdir().full_path, "a_file")
    with open(parent, "w", encoding="utf-8") as f:
      f.write("not a directory")
    out = os.path.join(parent, "out")
    # An import is a run directory the export reads.
    imported = os.path.join(self.create_tempdir().full_path, "imported")
    done = _run(
        "import_checkpoint",
        f"--input={self.hf_dir}",
        f"--output_dir={imported}",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    for binary, args in (
        ("import_checkpoint", [f"--input={self.hf_dir}"]),
        ("export_checkpoint", [f"--run_dir={imported}"]),
    ):
      done = _run(binary, *args, f"--output_dir={out}")
      self.assertEqual(done.returncode, 2, done.stdout + done.stderr)
      self.assertNotIn("Traceback", done.stderr)
      self.assertIn(
          f"{binary}: error: --output_dir {out}: {parent} above it is not a "
          "directory",
          done.stderr,
      )

  def test_tensors_the_model_has_no_place_for_are_refused_unless_allowed(self):
    hf = self.copy()
    header, data = _read(self.shard(hf))
    # A bias beside a projection, and a third layer of a two-layer model.
    size = len(data)
    extra = np.arange(4, dtype=np.float32).tobytes()
    header["model.layers.0.mlp.down_proj.bias"] = {
        "dtype": "F32", "shape": [4], "data_offsets": [size, size + 16],
    }  # fmt: skip
    header["model.layers.2.input_layernorm.weight"] = {
        "dtype": "F32", "shape": [4], "data_offsets": [size + 16, size + 32],
    }  # fmt: skip
    _write(self.shard(hf), header, data + extra + extra)
    self.assert_refused(
        hf,
        f"{hf}: 2 tensor(s) the model has no place for "
        "(model.layers.0.mlp.down_proj.bias, "
        "model.layers.2.input_layernorm.weight): another architecture or more "
        "layers than the config's? (--allow_unused_tensors imports without "
        "them)",
    )
    out = os.path.join(self.create_tempdir().full_path, "out")
    done = _run(
        "import_checkpoint",
        f"--input={hf}",
        f"--output_dir={out}",
        "--allow_unused_tensors",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn("are not imported (allow_unused_tensors)", done.stdout)

  # --- 10 and 11: a killed run's staging, a symlinked output -----------------

  def test_an_import_killed_with_sigkill_is_cleaned_up_by_the_next(self):
    parent = self.create_tempdir().full_path
    out = os.path.join(parent, "out")
    command = runfiles.binary_command("tools/import_checkpoint")
    # Killed below; a with-statement would wait for it instead.
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        command + [f"--input={self.hf_dir}", f"--output_dir={out}"],
        env=runfiles.binary_environ(command),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    staging = []
    while not staging and time.monotonic() < deadline:
      staging = glob.glob(os.path.join(parent, "out.importing-*"))
      time.sleep(0.005)
    proc.kill()
    proc.wait()
    self.assertLen(staging, 1, "the import never made its staging directory")
    self.assertTrue(os.path.isdir(staging[0]))
    self.assertFalse(os.path.exists(out))
    done = _run(
        "import_checkpoint", f"--input={self.hf_dir}", f"--output_dir={out}"
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(f"removed {staging[0]}", done.stdout)
    self.assertEqual(os.listdir(parent), ["out"])

  def test_staging_left_by_a_killed_run_is_removed_and_links_resolved(self):
    parent = self.create_tempdir().full_path
    target = os.path.join(parent, "real")
    os.mkdir(target)
    link = os.path.join(parent, "link")
    os.symlink(target, link)
    leftover = os.path.join(parent, "real.importing-killed")
    os.makedirs(os.path.join(leftover, "scratch"))
    done = _run(
        "import_checkpoint", f"--input={self.hf_dir}", f"--output_dir={link}"
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(
        f"removed {leftover}, left by an interrupted run of this tool",
        done.stdout,
    )
    self.assertFalse(os.path.exists(leftover))
    self.assertTrue(os.path.islink(link))
    self.assertTrue(os.path.isdir(os.path.join(target, "0")))

    # The import is a run directory: export it through a link too.
    exported = os.path.join(parent, "exported")
    os.mkdir(exported)
    export_link = os.path.join(parent, "export_link")
    os.symlink(exported, export_link)
    leftover = os.path.join(parent, "exported.exporting-killed")
    os.mkdir(leftover)
    done = _run(
        "export_checkpoint", f"--run_dir={link}", f"--output_dir={export_link}"
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(f"removed {leftover}", done.stdout)
    self.assertTrue(os.path.isfile(os.path.join(exported, "config.json")))
    self.assertEqual(
        sorted(os.listdir(parent)),
        ["export_link", "exported", "link", "real"],
    )


if __name__ == "__main__":
  absltest.main()
