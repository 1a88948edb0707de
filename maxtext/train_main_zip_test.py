"""The self-contained train_main files, run as a user would: plain python3.

Each file is copied into an empty directory and started with the host's
`python3` in an environment without any Bazel variable, JAX settings or import
path.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
import zipfile

from absl.testing import absltest

from testing import runfiles
from testing import tiny_configs

_SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"
_TIMEOUT_S = 600
# A release file's revision: a commit, maybe modified, or "unknown" when it
# was built outside a git checkout (tools/workspace_status.sh).
_STAMPED_REVISION = r"^(?:[0-9a-f]{40}(?:\+dirty)?|unknown)$"


def _artifact(name):
  path = runfiles.find(f"maxtext/{name}")
  if path is None:
    raise FileNotFoundError(f"{name} is not in this test's runfiles")
  return path


class ZipappTest(absltest.TestCase):

  def _copy(self, name):
    """Copies the artifact into a new, empty directory; returns (dir, path)."""
    directory = self.create_tempdir().full_path
    path = os.path.join(directory, name)
    shutil.copy(_artifact(name), path)
    return directory, path

  def _env(self, directory):
    # What a plain login on another machine has: a PATH and a HOME, no more.
    return {
        "PATH": _SEARCH_PATH,
        "HOME": os.path.join(directory, "home"),
        "MAXTEXT_ZIPAPP_CACHE": os.path.join(
            os.environ.get("TEST_TMPDIR", directory), "zipapp_cache"
        ),
    }

  def _start(self, name, flags):
    """Starts the artifact; returns (directory, process, output log path)."""
    directory, path = self._copy(name)
    python3 = shutil.which("python3", path=_SEARCH_PATH)
    self.assertIsNotNone(python3)
    # The log outlives this method: the process writes to it until it ends.
    log = open(  # pylint: disable=consider-using-with
        os.path.join(directory, "output.log"), "wb"
    )
    self.addCleanup(log.close)
    # The caller waits for or signals the process; cleanup kills a leftover.
    process = subprocess.Popen(  # pylint: disable=consider-using-with
        [python3, path] + flags,
        cwd=directory,
        env=self._env(directory),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    self.addCleanup(lambda: process.poll() is None and process.kill())
    return directory, process, os.path.join(directory, "output.log")

  def _flags(self, directory, **extra):
    run_name = extra.pop("run_name", "z")
    return tiny_configs.tiny_flags(
        os.path.join(directory, "out"),
        run_name=run_name,
        steps=extra.pop("steps", 4),
        extra=extra,
    )

  def _read(self, path):
    with open(path, errors="replace", encoding="utf-8") as f:
      return f.read()

  def _build_info(self, name):
    """The build_info.json packed in the artifact's payload archive."""
    _, path = self._copy(name)
    with zipfile.ZipFile(path) as launcher:  # The last archive of the file.
      manifest = json.loads(launcher.read("zipapp_manifest.json"))
    # Cut the launcher archive off: what is left is the payload archive with
    # the shebang line before it, which zipfile reads.
    os.truncate(path, manifest["payload_offset"] + manifest["payload_length"])
    with zipfile.ZipFile(path) as payload:
      names = [
          n
          for n in payload.namelist()
          if re.fullmatch(r"runfiles/[^/]+/maxtext/build_info\.json", n)
      ]
      self.assertLen(names, 1, "one stamped build_info.json in the payload")
      return json.loads(payload.read(names[0]))

  def test_cpu_file_is_stamped_with_its_revision(self):
    info = self._build_info("train_main.pyz")
    self.assertRegex(info["git_revision"], _STAMPED_REVISION)
    self.assertEqual(
        info["git_revision"].endswith("+dirty"), info["git_dirty"] is True
    )
    self.assertIsNotNone(info["build_time_utc"])

  def test_cpu_file_trains_with_python3_alone(self):
    directory = self.create_tempdir().full_path
    _, process, log = self._start("train_main.pyz", self._flags(directory))
    self.assertEqual(process.wait(_TIMEOUT_S), 0, self._read(log)[-3000:])
    run_dir = os.path.join(directory, "out", "z")
    for name in ("config.json", "metrics.jsonl", "mllog.log", "checkpoints/4"):
      self.assertTrue(os.path.exists(os.path.join(run_dir, name)), name)
    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
      provenance = json.load(f)["provenance"]
    self.assertStartsWith(
        provenance["requirements_lock"], "requirements_lock.txt:sha256:"
    )
    self.assertIn("JAX backend cpu", self._read(log))
    # Unpacked away from any checkout, the run names the stamped revision.
    stamp = self._build_info("train_main.pyz")
    self.assertEqual(provenance["git_revision_source"], "stamped")
    self.assertEqual(provenance["git_revision"], stamp["git_revision"])
    self.assertEqual(provenance["build_time_utc"], stamp["build_time_utc"])

  def test_sigterm_stops_cleanly_with_a_checkpoint(self):
    directory = self.create_tempdir().full_path
    _, process, log = self._start(
        "train_main.pyz",
        self._flags(directory, steps=500, checkpoint_period=1000),
    )
    metrics = os.path.join(directory, "out", "z", "metrics.jsonl")
    deadline = time.monotonic() + _TIMEOUT_S
    while not (
        os.path.exists(metrics) and len(self._read(metrics).splitlines()) >= 3
    ):
      self.assertIsNone(process.poll(), self._read(log)[-3000:])
      self.assertLess(
          time.monotonic(), deadline, "no metrics before the deadline"
      )
      time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    self.assertEqual(process.wait(_TIMEOUT_S), 1, self._read(log)[-3000:])
    output = self._read(log)
    self.assertIn("stopped by SIGTERM", output)
    checkpoints = os.listdir(os.path.join(directory, "out", "z", "checkpoints"))
    self.assertLen(checkpoints, 1)
    stop_step = int(checkpoints[0])
    self.assertIn(
        f"after step {stop_step}; checkpoint step {stop_step} saved", output
    )
    train = [
        json.loads(line)
        for line in self._read(metrics).splitlines()
        if '"kind": "train"' in line
    ]
    self.assertEqual([r["step"] for r in train], list(range(stop_step)))

  def test_tpu_file_reports_the_missing_tpu_and_falls_back_when_allowed(self):
    directory = self.create_tempdir().full_path
    _, process, log = self._start(
        "train_main_tpu.pyz", self._flags(directory, hardware="tpu")
    )
    self.assertNotEqual(process.wait(_TIMEOUT_S), 0)
    output = self._read(log)
    self.assertIn("hardware='tpu' requested but JAX's backend is 'cpu'", output)
    self.assertIn("allow_cpu_fallback=True", output)
    self.assertFalse(
        os.path.exists(os.path.join(directory, "out", "z", "checkpoints"))
    )

    _, process, log = self._start(
        "train_main_tpu.pyz",
        self._flags(
            directory, hardware="tpu", allow_cpu_fallback=True, run_name="f"
        ),
    )
    self.assertEqual(process.wait(_TIMEOUT_S), 0, self._read(log)[-3000:])
    self.assertIn(
        "running on the CPU because allow_cpu_fallback=True", self._read(log)
    )
    with open(
        os.path.join(directory, "out", "f", "config.json"), encoding="utf-8"
    ) as f:
      provenance = json.load(f)["provenance"]
    self.assertStartsWith(
        provenance["requirements_lock"], "requirements_tpu_lock.txt:sha256:"
    )


if __name__ == "__main__":
  absltest.main()
