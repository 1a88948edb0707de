"""Runs in a bucket that never lose or mix data, proved through `train_main`.

Each case runs real `train_main` processes against the fake-gcs-server
emulator (through its slow proxy where the link must be slow), makes the
failure happen for real (SIGSTOP/SIGCONT longer than the run lock's takeover
time, `kill -9` during a checkpoint's upload, a resume on a new machine whose
local staging is gone) and checks what the user sees and what the bucket
holds.
"""

import fnmatch
import json
import os
import re
import signal
import subprocess
import time

from absl.testing import absltest

from maxtext.metrics import jsonl
from maxtext.storage import checkpointing
from maxtext.storage import gcs_mirror
from maxtext.storage import run_lock
from testing import child
from testing import gcs_emulator
from testing import process_output
from testing import runfiles
from testing import tiny_configs

# Start-up (imports, compilation) is slow on a loaded 2-core machine.
_TIMEOUT_S = 300
# A step budget no run here finishes: it stops by a signal or a failure.
_FOREVER = 100000
_ERROR = "train_main: error: "
_BUCKET = "runs-bucket"
# The run lock's refresh interval N: another run takes a lock over once it
# has not been refreshed for 3N.
_REFRESH_S = 1.0
# What the mirror never uploads: orbax's unfinished checkpoints, set-aside
# checkpoints and the local lock file.
_NOT_MIRRORED = (
    *gcs_mirror.DEFAULT_EXCLUDE,
    *checkpointing.SET_ASIDE_PATTERNS,
    run_lock.LOCK_FILE_NAME,
)


def _mirrored(files: dict[str, bytes]) -> dict[str, bytes]:
  return {
      rel: data
      for rel, data in files.items()
      if not any(fnmatch.fnmatch(rel, p) for p in _NOT_MIRRORED)
  }


def _train_steps(run_dir: str) -> list[int]:
  return [
      r["step"]
      for r in jsonl.read_jsonl(os.path.join(run_dir, jsonl.METRICS_FILENAME))
      if r["kind"] == "train"
  ]


class BucketFailureModesTest(gcs_emulator.EmulatorTestCase):

  BUCKET = _BUCKET

  def setUp(self):
    super().setUp()
    self.tmp = self.create_tempdir().full_path

  def flags(self, run_name, staging, steps, **extra):
    """train_main flags of a run in the bucket, staged in `staging`."""
    extra = {
        "local_staging_directory": os.path.join(self.tmp, staging),
        # A fixed schedule length: a resume may then change `steps`.
        "lr_schedule_steps": 60,
        "run_lock_refresh_interval_seconds": _REFRESH_S,
        "gcs_sync_interval_seconds": 0.2,
        "gcs_request_timeout_seconds": 10.0,
        "gcs_final_timeout_seconds": 120.0,
        **extra,
    }
    return tiny_configs.tiny_flags(
        f"gs://{_BUCKET}/{self.prefix}",
        run_name=run_name,
        steps=steps,
        extra=extra,
    )

  def environ(self, endpoint=None):
    return runfiles.cached_environ(
        runfiles.train_main_command(),
        STORAGE_EMULATOR_HOST=endpoint or self.emulator.url,
    )

  def start(self, args, env) -> child.Child:
    """Starts train_main with args; cleanup kills it if still running."""
    proc = child.Child(
        runfiles.train_main_command() + list(args), self.tmp, env
    )
    self.addCleanup(proc.kill)
    return proc

  def run_main(self, args, env):
    return subprocess.run(
        runfiles.train_main_command() + list(args),
        cwd=self.tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )

  def wait_for(self, proc, condition, what):
    """Polls until condition() holds; fails if proc exits first or times out."""
    proc.wait_until(condition, what, _TIMEOUT_S)

  def objects(self, run_name) -> list[str]:
    """Names of the run's objects in the bucket, relative to the run."""
    start = f"{self.prefix}/{run_name}/"
    return sorted(
        blob.name[len(start) :]
        for blob in self.client.list_blobs(_BUCKET, prefix=start)
    )

  def remote(self, run_name) -> dict[str, bytes]:
    return gcs_emulator.remote_files(
        self.client, _BUCKET, f"{self.prefix}/{run_name}"
    )

  def assert_one_error(self, returncode, stderr, status, pattern):
    """Exit `status` and one error line matching `pattern`; no traceback."""
    self.assertEqual(returncode, status, stderr[-5000:])
    self.assertNotIn("Traceback", stderr)
    error = process_output.one_line_starting(stderr, _ERROR, stderr[-5000:])
    self.assertRegex(error, "^" + re.escape(_ERROR) + pattern)
    return error

  def wait_out_the_lock(self):
    """Sleeps past the takeover time of a lock no longer refreshed (3N)."""
    time.sleep(3 * _REFRESH_S + 1.5)

  # --- 1: a paused run whose lock was taken over -----------------------------

  def test_paused_run_that_lost_its_lock_writes_nothing_more(self):
    first = self.start(
        self.flags("shared", "staging_a", _FOREVER), self.environ()
    )
    self.wait_for(
        first,
        lambda: "checkpoints/3/commit_success.txt" in self.objects("shared"),
        "the first run's checkpoint of step 3 in the bucket",
    )
    first.send_signal(signal.SIGSTOP)
    try:
      self.wait_out_the_lock()
      # Another machine takes the run over and finishes it.
      second = self.run_main(
          self.flags("shared", "staging_b", 12), self.environ()
      )
    finally:
      first.send_signal(signal.SIGCONT)
    self.assertEqual(second.returncode, 0, second.stderr[-5000:])
    self.assertIn("took over a lock abandoned", second.stderr)
    self.assertIn("completed after step 12", second.stdout)
    second_dir = os.path.join(self.tmp, "staging_b", "shared")
    second_files = _mirrored(gcs_emulator.local_files(second_dir))

    _, stderr = first.communicate(timeout=_TIMEOUT_S)
    first_dir = os.path.join(self.tmp, "staging_a", "shared")
    self.assert_one_error(
        first.returncode,
        stderr,
        1,
        rf"run lock of gs://{_BUCKET}/{re.escape(self.prefix)}/shared was"
        r" taken over by another run \(.*\): this run stopped and writes"
        r" nothing more there; what it holds stays in its local staging"
        rf" {re.escape(first_dir)}$",
    )
    # The bucket is the second run's: its metrics, MLPerf log and
    # checkpoints, byte for byte; the first run's files stay local.
    first_files = _mirrored(gcs_emulator.local_files(first_dir))
    remote = self.remote("shared")
    # Every file of the second run is in the bucket.
    self.assertEmpty(set(second_files) - set(remote))
    # What the second run wrote: its records, its attempt's MLPerf log.
    for name in ("metrics.jsonl", "config_history.jsonl", "mllog.2.log"):
      self.assertEqual(remote[name], second_files[name], name)
    for name, data in remote.items():
      if data == second_files.get(name):
        continue
      # The one write a pause lets through (docs/failure_modes.md): an
      # upload already in flight when the first run was stopped completes
      # when it continues. It holds the first run's own bytes, and it either
      # creates an object the second run never had (a data file of the
      # first run's next checkpoint) or replaces one the second run never
      # wrote: one of the first run's append-only files (its MLPerf log,
      # its TensorBoard events) taken over unchanged, so the second run's
      # copy is a prefix of it, and it is a prefix of the first run's local
      # file (which the first run may append to after the upload started).
      if name in second_files:
        self.assertTrue(data.startswith(second_files[name]), name)
        self.assertTrue(first_files.get(name, b"").startswith(data), name)
      else:
        self.assertEqual(data, first_files.get(name), name)
    self.assertEqual(_train_steps(second_dir), list(range(12)))
    self.assertNotEqual(
        _mirrored(gcs_emulator.local_files(first_dir)), second_files
    )

  # --- 2: kill -9 during a checkpoint's upload, resumed elsewhere ------------

  def test_partial_checkpoint_upload_is_not_restored_nor_taken_for_damage(
      self,
  ):
    with gcs_emulator.SlowProxy(self.emulator.port, delay_s=0.3) as proxy:
      # No periodic checkpoint: the one checkpoint is the stop's.
      victim = self.start(
          self.flags("killed", "staging_a", _FOREVER, checkpoint_period=0),
          self.environ(proxy.url),
      )
      self.wait_for(
          victim,
          lambda: "config.json" in self.objects("killed"),
          "the first upload pass",
      )
      victim.send_signal(signal.SIGTERM)
      found = {}

      def partial():
        names = self.objects("killed")
        steps = {n.split("/")[1] for n in names if n.startswith("checkpoints/")}
        for step in steps:
          if f"checkpoints/{step}/{checkpointing.COMMIT_MARKER}" not in names:
            found["step"] = step
            return True
        return False

      # The stop's checkpoint is uploaded by the final pass, slowly.
      self.wait_for(victim, partial, "part of the stop's checkpoint uploaded")
      victim.kill()
    marker = f"checkpoints/{found['step']}/{checkpointing.COMMIT_MARKER}"
    names = self.objects("killed")
    self.assertNotIn(marker, names)
    self.assertTrue(
        any(n.startswith(f"checkpoints/{found['step']}/") for n in names)
    )
    self.wait_out_the_lock()

    # A new machine: its staging is empty. The partial checkpoint is set
    # aside as partial, and with nothing to resume from the start is refused.
    refused = self.run_main(
        self.flags("killed", "staging_b", 6), self.environ()
    )
    staging = os.path.join(self.tmp, "staging_b", "killed")
    self.assert_one_error(
        refused.returncode,
        refused.stderr,
        2,
        rf"run directory {re.escape(staging)} holds records of an earlier"
        rf" attempt \(.*checkpoints/{found['step']}\.partial-\d{{8}}T\d{{6}}Z\)"
        r" but no"
        r" checkpoint to resume from; set start_over=True",
    )
    self.assertRegex(
        refused.stderr,
        rf"Checkpoint step {found['step']} in .* is partial: no commit_",
    )
    self.assertNotIn("corrupt", refused.stderr)
    self.assertNotIn("asyncio", refused.stderr)

    started = self.run_main(
        self.flags("killed", "staging_b", 6, start_over=True), self.environ()
    )
    self.assertEqual(started.returncode, 0, started.stderr[-5000:])
    self.assertIn("completed after step 6", started.stdout)
    self.assertEqual(_train_steps(staging), list(range(6)))
    with open(
        os.path.join(staging, "config_history.jsonl"), encoding="utf-8"
    ) as f:
      history = [json.loads(line) for line in f]
    self.assertTrue(history[-1]["config"]["start_over"])
    # Nothing set aside went to the bucket, and its checkpoints are whole.
    names = self.objects("killed")
    self.assertEqual([n for n in names if "corrupt" in n or "partial" in n], [])
    self.assertIn(f"checkpoints/6/{checkpointing.COMMIT_MARKER}", names)
    fresh = os.path.join(self.tmp, "fresh")
    gcs_mirror.download_prefix(
        f"gs://{_BUCKET}/{self.prefix}/killed",
        fresh,
        client_factory=self.emulator.client,
    )
    ckpt = checkpointing.Checkpointer(
        os.path.join(fresh, "checkpoints"), save_period=1, max_to_keep=0
    )
    self.addCleanup(ckpt.close)
    self.assertEqual(ckpt.all_steps(), [3, 6])
    # The killed run's partial upload, if still there, is only set aside.
    self.assertContainsSubset(
        {e.step for e in ckpt.partial}, {int(found["step"])}
    )


if __name__ == "__main__":
  absltest.main()
