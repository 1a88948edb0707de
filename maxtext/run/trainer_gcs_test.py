"""End-to-end tests of a gs:// run directory through `trainer.run` (in-process).

The GCS API is the real fake-gcs-server emulator on loopback with its
filesystem backend (a restart keeps its objects), reached the way production
reaches GCS: `google-cloud-storage`'s default client, pointed at the emulator
by `STORAGE_EMULATOR_HOST`. Each run stages its directory under a temporary
`local_staging_directory`; the tests compare the bucket with the local files
byte for byte.
"""

import os
import shutil
import threading

from absl.testing import absltest
import jax

from maxtext import workloads
from maxtext.listeners import interface
from maxtext.storage import run_lock
from testing import gcs_emulator
from testing import tiny_configs

_BUCKET = "bucket"
_PREFIX = "runs/e2e"

# Overrides of `tiny_configs.tiny_config`: the MLPerf tiny shape with rotated
# checkpoints (so the mirror also deletes).
_TINY = dict(
    tiny_configs.MLPERF_SHAPE,
    steps=10,
    checkpoint_period=5,
    target_eval_loss=0.0,
    # Small GCS bounds, so a dead emulator costs seconds, not minutes.
    gcs_sync_interval_seconds=0.2,
    gcs_request_timeout_seconds=2.0,
    gcs_final_timeout_seconds=30.0,
)


def _mirrored_files(run_dir):
  """The run directory's files the mirror uploads: all but the local lock
  file (the bucket holds the run's own lock object while it runs)."""
  files = gcs_emulator.local_files(run_dir)
  files.pop(run_lock.LOCK_FILE_NAME, None)
  return files


class TrainerGcsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

  def setUp(self):
    super().setUp()
    self.emulator = gcs_emulator.GcsEmulator(buckets=[_BUCKET])
    self.addCleanup(self.emulator.cleanup)
    self.emulator.start()
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = self.emulator.url

    def restore_env():
      if previous is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
      else:
        os.environ["STORAGE_EMULATOR_HOST"] = previous

    self.addCleanup(restore_env)
    self.staging = self.create_tempdir().full_path

  def config(self, run_name, **overrides):
    return tiny_configs.tiny_config(
        f"gs://{_BUCKET}/{_PREFIX}",
        run_name=run_name,
        local_staging_directory=self.staging,
        **{**_TINY, **overrides},
    )

  def objects(self, run_name, names=None):
    """Object name (relative to the run's prefix) -> bytes; all, or `names`."""
    return gcs_emulator.remote_files(
        self.emulator.client(), _BUCKET, f"{_PREFIX}/{run_name}", names
    )

  def assert_run_dir_complete(self, run_dir, final_step):
    names = set(_mirrored_files(run_dir))
    for name in ("config.json", "metrics.jsonl", "mllog.log"):
      self.assertIn(name, names)
    self.assertTrue(
        any(n.startswith(f"checkpoints/{final_step}/") for n in names),
        sorted(names),
    )
    self.assertFalse([n for n in names if "orbax-checkpoint-tmp" in n])

  def test_bucket_holds_the_run_directory_at_the_end(self):
    config = self.config("plain")
    result = workloads.run(config, config_filename="default.py")
    self.assertEqual(result.final_step, config.steps)
    self.assertEqual(result.run_dir, os.path.join(self.staging, "plain"))
    self.assert_run_dir_complete(result.run_dir, config.steps)
    self.assertEqual(self.objects("plain"), _mirrored_files(result.run_dir))

  def test_emulator_down_from_the_start(self):
    self.emulator.stop()
    config = self.config(
        "down", gcs_request_timeout_seconds=0.5, gcs_final_timeout_seconds=2.0
    )
    with self.assertLogs(level="WARNING") as logs:
      result = workloads.run(config, config_filename="default.py")
    self.assertEqual(result.final_step, config.steps)
    self.assert_run_dir_complete(result.run_dir, config.steps)
    # Warned at the start (no mirror to resume from) and at the end (the
    # final upload failed or timed out).
    self.assertTrue(
        any("Could not read the GCS mirror" in line for line in logs.output),
        logs.output,
    )
    self.assertTrue(
        any(
            "GCS mirror" in line
            and ("failed" in line or "did not finish" in line)
            for line in logs.output
        ),
        logs.output,
    )
    # Nothing reached the bucket: the emulator (same root) holds no object.
    self.emulator.start()
    self.assertEqual(self.objects("down"), {})

  def test_emulator_killed_mid_run_and_restarted(self):
    config = self.config("outage", steps=20)
    outage = {}
    restart_errors = []

    def restart():
      try:
        self.emulator.start()
      # Any error is reported below, not lost in the timer thread.
      except Exception as e:  # pylint: disable=broad-except
        restart_errors.append(e)

    restarter = threading.Timer(2.0, restart)
    self.addCleanup(restarter.cancel)

    emulator = self.emulator

    class Outage(interface.RunListener):
      """Kills the emulator after step 3; notes when it is back."""

      name = "outage"

      def on_step(self, record):
        completed = record.step + 1
        if completed == 3:
          emulator.kill()
          outage["killed_at"] = completed
          restarter.start()
        if outage and "restarted_by" not in outage and emulator.running:
          outage["restarted_by"] = completed
        # Slow steps, so that training goes on through the outage.
        threading.Event().wait(0.2)

    result = workloads.run(
        config, config_filename="default.py", extra_listeners=[Outage()]
    )
    restarter.join(30.0)
    self.assertEqual(restart_errors, [])
    self.assertEqual(result.final_step, config.steps)
    # The outage began and ended while the run was training.
    self.assertEqual(outage.get("killed_at"), 3)
    self.assertLess(outage.get("restarted_by", config.steps + 1), config.steps)
    self.assert_run_dir_complete(result.run_dir, config.steps)
    # Every local file is in the bucket, read back by name: fake-gcs-server's
    # filesystem backend does not write atomically, so a SIGKILL during an
    # upload can leave a file that fails every later listing of the bucket
    # (it answers 404), which real GCS never does.
    local = _mirrored_files(result.run_dir)
    self.assertEqual(self.objects("outage", names=local), local)

  def test_resume_from_the_mirror_without_local_staging(self):
    config = self.config("moved")
    first = workloads.run(config, config_filename="default.py")
    self.assertEqual(first.final_step, config.steps)
    self.assertEqual(self.objects("moved"), _mirrored_files(first.run_dir))
    # A new machine: the local staging is gone, the bucket holds the run.
    shutil.rmtree(first.run_dir)

    config2 = self.config("moved", steps=config.steps + 5)
    second = workloads.run(config2, config_filename="default.py")
    self.assertEqual(second.start_step, first.final_step)
    self.assertEqual(second.final_step, config2.steps)
    files = _mirrored_files(second.run_dir)
    # The first attempt's log came back from the bucket; this one is the 2nd.
    self.assertIn("mllog.log", files)
    self.assertIn("mllog.2.log", files)
    self.assertIn(
        f'"value": {first.final_step}',
        [
            line
            for line in files["mllog.2.log"].decode().splitlines()
            if '"init_checkpoint_step"' in line
        ][0],
    )
    self.assertEqual(self.objects("moved"), files)


if __name__ == "__main__":
  absltest.main()
