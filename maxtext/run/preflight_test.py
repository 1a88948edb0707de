"""Tests for maxtext/run/preflight.py, on real files, directories and mounts.

Each mistake is made for real in a temp dir (a regular file where a
directory belongs, a name the file system refuses, a malformed .npy file, a
read-only tmpfs mounted in a user namespace) and must come back as one
ValueError line naming the field, with nothing created.
"""

import io
import os
import shutil
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.config import config_lib
from maxtext.run import preflight
from maxtext.configs import base


class PreflightTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tempdir = self.create_tempdir()
    self.tmp = self.tempdir.full_path
    self.out = os.path.join(self.tmp, "runs")
    self.file = self.tempdir.create_file(
        "a_file", "not a directory\n"
    ).full_path

  def config(self, **overrides):
    config = base.get_config()
    config.base_output_directory = self.out
    config.run_name = "run"
    config.update(overrides)
    config_lib.validate(config)
    return config

  def listing(self):
    """Every path under the temp dir (what a check must leave alone)."""
    found = set()
    for root, dirs, files in os.walk(self.tmp):
      found.update(os.path.join(root, n) for n in dirs + files)
    return found

  def assert_refused(self, config, pattern):
    """check(config) raises one line matching `pattern`, creating nothing."""
    before = self.listing()
    with self.assertRaises(ValueError) as raised:
      preflight.check(preflight.PreflightConfig.from_config(config))
    message = str(raised.exception)
    self.assertRegex(message, pattern)
    self.assertNotIn("\n", message)
    self.assertEqual(self.listing(), before)
    return message

  def write_npy(self, name, array, allow_pickle=False):
    path = os.path.join(self.tmp, name)
    np.save(path, array, allow_pickle=allow_pickle)
    return path

  # --- what passes ------------------------------------------------------------

  @parameterized.named_parameters(
      ("new_run", lambda tmp: {}),
      ("unnamed_run", lambda tmp: {"run_name": ""}),
      (
          "mllog_elsewhere",
          lambda tmp: {
              "enable_mllog": True,
              "mllog_file": os.path.join(tmp, "new", "logs.log"),
          },
      ),
      (
          "gs_run",
          lambda tmp: {
              "base_output_directory": "gs://bucket/prefix",
              "local_staging_directory": os.path.join(tmp, "staging"),
              "checkpoint_directory": "gs://bucket/ckpt",
          },
      ),
  )
  def test_good_config_passes_and_creates_nothing(self, overrides):
    before = self.listing()
    preflight.check(
        preflight.PreflightConfig.from_config(
            self.config(**overrides(self.tmp))
        )
    )
    self.assertEqual(self.listing(), before)

  def test_existing_run_directory_passes(self):
    os.makedirs(os.path.join(self.out, "run", "checkpoints"))
    preflight.check(preflight.PreflightConfig.from_config(self.config()))

  # --- output directories -----------------------------------------------------

  @parameterized.named_parameters(
      ("base_output_directory", "base_output_directory", {}),
      (
          "staging_directory_of_a_gs_run",
          "local_staging_directory",
          {"base_output_directory": "gs://bucket/prefix"},
      ),
      ("checkpoint_directory", "checkpoint_directory", {}),
      ("compilation_cache", "jax_compilation_cache_dir", {}),
  )
  def test_directory_under_a_file(self, field, other_fields):
    path = os.path.join(self.file, "sub")
    self.assert_refused(
        self.config(**{field: path}, **other_fields),
        rf"^config\.{field}='{path}': is under {self.file}, which is a "
        "regular file$",
    )

  def test_base_output_directory_is_a_file(self):
    self.assert_refused(
        self.config(base_output_directory=self.file),
        rf"^config\.base_output_directory='{self.file}': is a regular file, "
        "not a directory$",
    )

  def test_relative_base_names_the_resolved_path(self):
    self.addCleanup(os.chdir, os.getcwd())
    os.chdir(self.tmp)
    self.assert_refused(
        self.config(base_output_directory="a_file/runs"),
        rf"^config\.base_output_directory='a_file/runs': {self.file}/runs is "
        rf"under {self.file}, which is a regular file$",
    )

  def test_run_directory_is_a_file(self):
    os.makedirs(self.out)
    shutil.copy(self.file, os.path.join(self.out, "run"))
    self.assert_refused(
        self.config(),
        rf"^config\.run_name='run': {self.out}/run is a regular file, not a "
        "run directory$",
    )

  def test_run_directory_is_a_broken_link(self):
    os.makedirs(self.out)
    gone = os.path.join(self.tmp, "gone")
    os.symlink(gone, os.path.join(self.out, "run"))
    self.assert_refused(
        self.config(),
        rf"^config\.run_name='run': {self.out}/run is a broken symbolic link "
        rf"\(to {gone}\)$",
    )

  def test_run_name_too_long(self):
    name = "r" * 300
    self.assert_refused(
        self.config(run_name=name),
        rf"^config\.run_name='{name}': name too long "
        r"\(300 > 255 characters\)$",
    )

  def test_base_component_too_long(self):
    base_dir = os.path.join(self.tmp, "b" * 256, "runs")
    self.assert_refused(
        self.config(base_output_directory=base_dir),
        r"^config\.base_output_directory='.*': name too long "
        r"\(256 > 255 characters\)$",
    )

  def test_path_too_long(self):
    base_dir = os.path.join(self.tmp, *["d" * 200] * 20)
    self.assert_refused(
        self.config(base_output_directory=base_dir),
        r"^config\.base_output_directory='.*': .*path too "
        r"long \(\d+ characters, .*the limit is 4096\)$",
    )

  def test_checkpoint_directory_under_a_broken_link(self):
    link = os.path.join(self.tmp, "link")
    os.symlink(os.path.join(self.tmp, "gone"), link)
    ckpt = os.path.join(link, "ckpt")
    self.assert_refused(
        self.config(checkpoint_directory=ckpt),
        rf"^config\.checkpoint_directory='{ckpt}': is under {link}, a broken "
        "symbolic link$",
    )

  def test_default_checkpoint_directory_is_a_file(self):
    os.makedirs(os.path.join(self.out, "run"))
    shutil.copy(self.file, os.path.join(self.out, "run", "checkpoints"))
    self.assert_refused(
        self.config(),
        rf"^config\.checkpoint_directory='': {self.out}/run/checkpoints is "
        "a regular file, not a directory$",
    )

  def test_read_only_file_system(self):
    # A read-only tmpfs in a user namespace of its own: the check must see
    # EROFS through a real write, as root would (access() says nothing).
    mount = os.path.join(self.tmp, "ro")
    os.mkdir(mount)
    probe = subprocess.run(
        [
            "unshare",
            "-Urm",
            "sh",
            "-c",
            'mount -t tmpfs -o ro tmpfs "$0"',
            mount,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    self.assertEqual(
        probe.returncode,
        0,
        f"the test needs user namespace mounts: {probe.stderr.strip()}",
    )
    code = (
        "import sys\n"
        "from maxtext.run import preflight\n"
        "from maxtext.configs import base\n"
        "config = base.get_config()\n"
        f"config.base_output_directory = {os.path.join(mount, 'runs')!r}\n"
        "config.run_name = 'run'\n"
        "try:\n"
        "  preflight.check(preflight.PreflightConfig.from_config(config))\n"
        "except ValueError as e:\n"
        "  print(e)\n"
        "  sys.exit(3)\n"
    )
    proc = subprocess.run(
        [
            "unshare",
            "-Urm",
            "sh",
            "-c",
            'mount -t tmpfs -o ro tmpfs "$0" && exec "$1" -c "$2"',
            mount,
            sys.executable,
            code,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    self.assertEqual(proc.returncode, 3, proc.stdout + proc.stderr)
    self.assertEqual(
        proc.stdout.strip(),
        f"config.base_output_directory='{mount}/runs': read-only file system "
        f"({mount})",
    )
    self.assertEqual(os.listdir(mount), [])  # The mount is gone with it.

  # --- the MLPerf log ---------------------------------------------------------

  def test_mllog_file_under_a_file(self):
    log = os.path.join(self.file, "mllog.log")
    self.assert_refused(
        self.config(enable_mllog=True, mllog_file=log),
        rf"^config\.mllog_file='{log}': {self.file} is a regular file, not a "
        "directory$",
    )

  def test_mllog_file_name_too_long(self):
    log = os.path.join(self.tmp, "m" * 252 + ".log")
    self.assert_refused(
        self.config(enable_mllog=True, mllog_file=log),
        r"^config\.mllog_file='.*': .*name too long \(256 characters, and an "
        r"attempt number adds 4; the limit is 255\)$",
    )

  def test_mllog_file_ignored_when_off(self):
    preflight.check(
        preflight.PreflightConfig.from_config(
            self.config(mllog_file=os.path.join(self.file, "mllog.log"))
        )
    )

  def test_submission_fields_checked_when_off(self):
    # Turning the log on later cannot fail on them
    # (maxtext.mllog.mlperf_preflight).
    self.assert_refused(
        self.config(submission_division="semi"),
        r"^config\.submission_division='semi': must be one of",
    )

  def test_closed_config_off_the_reference_is_refused(self):
    self.assert_refused(
        self.config(
            enable_mllog=True,
            submission_division="closed",
            submission_benchmark="llama31_8b",
            global_batch_size=8,
            first_eval_samples=0,
        ),
        r"^closed-division pre-flight .*config\.global_batch_size=8 is "
        r"outside",
    )

  # --- data -------------------------------------------------------------------

  def test_grain_directory_without_metadata(self):
    self.assert_refused(
        self.config(dataset_type="grain", train_data_path=self.tmp),
        rf"^config\.train_data_path='{self.tmp}': has no metadata\.json",
    )

  def tokens_config(self, train, evaluation=None):
    return self.config(
        dataset_type="tokens_file",
        train_data_path=train,
        eval_data_path=evaluation or train,
    )

  def test_good_token_files_pass(self):
    path = self.write_npy("train.npy", np.arange(1000, dtype=np.int32) % 256)
    raw = self.tempdir.create_file(
        "eval.bin", np.arange(100, dtype="<u2").tobytes()
    ).full_path
    preflight.check(
        preflight.PreflightConfig.from_config(self.tokens_config(path, raw))
    )

  def test_missing_train_data(self):
    path = os.path.join(self.tmp, "absent.npy")
    self.assert_refused(
        self.tokens_config(path),
        rf"^config\.train_data_path='{path}': does not exist$",
    )

  def test_directory_as_eval_data(self):
    good = self.write_npy("train.npy", np.arange(1000, dtype=np.int32) % 256)
    directory = os.path.join(self.tmp, "shards")
    os.mkdir(directory)
    self.assert_refused(
        self.tokens_config(good, directory),
        rf"^config\.eval_data_path='{directory}': is a directory, not a token "
        "file$",
    )

  @parameterized.named_parameters(
      ("bad_magic", lambda: b"just text\n" * 10, "magic string is not correct"),
      (
          "truncated_header",
          lambda: _npy_bytes(np.arange(1000, dtype=np.int32))[:30],
          "EOF: reading array header",
      ),
      (
          "pickled_objects",
          lambda: _npy_bytes(np.array([{"token": 1}] * 100), allow_pickle=True),
          r"Python objects \(a pickled array\)",
      ),
  )
  def test_malformed_npy(self, content, detail):
    path = self.tempdir.create_file("train.npy", content()).full_path
    message = self.assert_refused(
        self.tokens_config(path),
        rf"^config\.train_data_path='{path}': malformed \.npy file: .*"
        + detail,
    )
    self.assertNotIn("pickled data", message)

  def test_too_short_token_file(self):
    path = self.write_npy("train.npy", np.arange(10, dtype=np.int32))
    self.assert_refused(
        self.tokens_config(path),
        rf"^config\.train_data_path='{path}': holds 10 tokens; one sequence "
        r"needs max_sequence_length \+ 1 = 65$",
    )

  # --- load_parameters_path ---------------------------------------------------

  def test_load_parameters_path(self):
    missing = os.path.join(self.tmp, "absent")
    self.assert_refused(
        self.config(load_parameters_path=missing),
        rf"^config\.load_parameters_path='{missing}': does not exist$",
    )
    self.assert_refused(
        self.config(load_parameters_path=self.file),
        rf"^config\.load_parameters_path='{self.file}': is a regular file, "
        "not a checkpoint directory$",
    )
    empty = os.path.join(self.tmp, "ckpt")
    os.mkdir(empty)
    self.assert_refused(
        self.config(load_parameters_path=empty),
        rf"^config\.load_parameters_path='{empty}': holds no checkpoint",
    )
    os.mkdir(os.path.join(empty, "500"))
    preflight.check(
        preflight.PreflightConfig.from_config(
            self.config(load_parameters_path=empty)
        )
    )
    preflight.check(
        preflight.PreflightConfig.from_config(
            self.config(load_parameters_path=os.path.join(empty, "500"))
        )
    )
    # Read by orbax at restore time, where GCS trouble is retried.
    preflight.check(
        preflight.PreflightConfig.from_config(
            self.config(load_parameters_path="gs://bucket/ckpt")
        )
    )


def _npy_bytes(array, allow_pickle=False):
  buffer = io.BytesIO()
  np.save(buffer, array, allow_pickle=allow_pickle)
  return buffer.getvalue()


if __name__ == "__main__":
  absltest.main()
