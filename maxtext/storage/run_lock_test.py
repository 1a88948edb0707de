"""Tests for run_lock: real processes, real flock, the real GCS emulator."""

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.storage import run_lock
from testing import gcs_emulator
from testing import polling

_BUCKET = "lock-test"

# Takes the locks named on the command line, says so, and holds them.
_HOLDER_SCRIPT = textwrap.dedent("""
    import sys, time
    from maxtext.storage import run_lock
    locks = run_lock.acquire_run_locks(
        sys.argv[2:], refresh_interval_s=float(sys.argv[1]),
        request_timeout_s=5.0)
    print("locked", flush=True)
    time.sleep(600)
""")


def _child_env(**extra):
  env = dict(os.environ, **extra)
  env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
  return env


def _raises(fn) -> bool:
  """Whether fn() raises a lock error (lost or unconfirmed)."""
  try:
    fn()
  except (run_lock.RunLockLost, run_lock.RunLockUnconfirmed):
    return True
  return False


class _Holder:
  """A child process that holds locks until it is killed."""

  def __init__(self, locations, refresh_interval_s=60.0, **env):
    # The child runs until kill(), beyond this constructor.
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        [
            sys.executable,
            "-c",
            _HOLDER_SCRIPT,
            str(refresh_interval_s),
            *locations,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(**env),
        text=True,
    )
    ready, _, _ = select.select([self.process.stdout], [], [], 60.0)
    line = self.process.stdout.readline() if ready else ""
    if line.strip() != "locked":
      self.kill()
      raise AssertionError(
          f"holder did not lock: {line!r} {self.process.stderr.read()}"
      )

  @property
  def pid(self):
    return self.process.pid

  def kill(self):
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGKILL)
    self.process.wait(timeout=30)
    self.process.stdout.close()
    self.process.stderr.close()


class LocalLockTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.run_dir = os.path.join(self.root, "runs", "r1")

  def test_creates_the_directory_and_names_the_holder_in_the_file(self):
    with run_lock.acquire_run_locks([self.run_dir]) as locks:
      with open(os.path.join(self.run_dir, ".run.lock"), encoding="utf-8") as f:
        written = json.load(f)
      self.assertEqual(written["pid"], os.getpid())
      self.assertEqual(written["host"], socket.gethostname())
      self.assertEqual(written["run_id"], locks.holder.run_id)
      self.assertRegex(
          written["start_time_utc"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"
      )

  def test_second_process_is_refused_with_the_holder_named(self):
    holder = _Holder([self.run_dir])
    self.addCleanup(holder.kill)
    started = time.monotonic()
    with self.assertRaises(run_lock.RunLockError) as raised:
      run_lock.acquire_run_locks([self.run_dir])
    # Refused at once, not after waiting for the holder.
    self.assertLess(time.monotonic() - started, 10.0)
    message = str(raised.exception)
    self.assertNotIn("\n", message)
    self.assertRegex(
        message,
        rf"^run directory {self.run_dir} is locked by another run "
        rf"\(host={socket.gethostname()} pid={holder.pid} started "
        r"\d{4}-\d\d-\d\dT[\d:.]+Z\)",
    )
    self.assertEqual(raised.exception.holder.pid, holder.pid)

  def test_killed_holder_leaves_the_lock_free(self):
    holder = _Holder([self.run_dir])
    holder.kill()
    with run_lock.acquire_run_locks([self.run_dir]) as locks:
      self.assertTrue(locks.local_locks[0].held)

  def test_same_process_twice_is_refused(self):
    with run_lock.acquire_run_locks([self.run_dir]):
      with self.assertRaisesRegex(
          run_lock.RunLockError, rf"pid={os.getpid()} "
      ):
        run_lock.acquire_run_locks([self.run_dir])
      # The same directory spelled differently is the same lock.
      with self.assertRaises(run_lock.RunLockError):
        run_lock.acquire_run_locks([self.run_dir + "/../r1/"])

  def test_release_frees_the_lock_for_another_process(self):
    locks = run_lock.acquire_run_locks([self.run_dir])
    locks.release()
    locks.release()  # A second release does nothing.
    holder = _Holder([self.run_dir])
    holder.kill()

  def test_all_or_nothing_when_a_later_directory_is_held(self):
    checkpoints = os.path.join(self.root, "external_checkpoints")
    holder = _Holder([checkpoints])
    self.addCleanup(holder.kill)
    with self.assertRaisesRegex(run_lock.RunLockError, "external_checkpoints"):
      run_lock.acquire_run_locks([self.run_dir, checkpoints])
    # The run directory, locked first, was released again.
    run_lock.acquire_run_locks([self.run_dir]).release()

  def test_duplicate_locations_are_locked_once(self):
    with run_lock.acquire_run_locks([self.run_dir, self.run_dir + "/"]) as l:
      self.assertLen(l.local_locks, 1)

  @parameterized.named_parameters(
      ("no_locations", [], {}, ValueError, "locations"),
      ("a_str", "/tmp/x", {}, TypeError, "locations"),
      ("empty_name", [""], {}, TypeError, "locations"),
      (
          "zero_interval",
          ["d"],
          {"refresh_interval_s": 0},
          ValueError,
          "refresh_interval_s",
      ),
      (
          "bool_interval",
          ["d"],
          {"refresh_interval_s": True},
          TypeError,
          "refresh_interval_s",
      ),
      (
          "negative_timeout",
          ["d"],
          {"request_timeout_s": -1.0},
          ValueError,
          "request_timeout_s",
      ),
      ("bucketless_url", ["gs://"], {}, ValueError, "bucket"),
  )
  def test_bad_arguments_are_refused(self, locations, kwargs, error, regex):
    if isinstance(locations, list):
      # "d" stands for a directory in the test's temporary root.
      locations = [
          os.path.join(self.root, p) if p == "d" else p for p in locations
      ]
    with self.assertRaisesRegex(error, regex):
      run_lock.acquire_run_locks(locations, **kwargs)
    self.assertFalse(os.path.exists(os.path.join(self.root, "d")))


class RemoteLockTest(gcs_emulator.EmulatorTestCase):

  BUCKET = _BUCKET

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path

  def _acquire(self, locations=None, **kwargs):
    options = dict(
        client_factory=self.emulator.client,
        refresh_interval_s=60.0,
        request_timeout_s=5.0,
    )
    options.update(kwargs)
    locks = run_lock.acquire_run_locks(locations or [self.url], **options)
    self.addCleanup(locks.release)
    return locks

  def _lock_object(self):
    """(generation, holder dict) of the lock object, or None."""
    blob = self.client.bucket(_BUCKET).get_blob(f"{self.prefix}/.run.lock")
    if blob is None:
      return None
    return blob.generation, json.loads(blob.download_as_bytes())

  def test_lock_object_names_the_holder_and_release_deletes_it(self):
    locks = self._acquire()
    self.assertTrue(locks.remote_locks[0].held)
    _, holder = self._lock_object()
    self.assertEqual(holder["run_id"], locks.holder.run_id)
    self.assertEqual(holder["pid"], os.getpid())
    locks.release()
    self.assertIsNone(self._lock_object())

  def test_second_run_is_refused_while_the_lock_is_fresh(self):
    first = self._acquire()
    local = os.path.join(self.root, "staging", "r")
    with self.assertRaises(run_lock.RunLockError) as raised:
      self._acquire([local, self.url])
    message = str(raised.exception)
    self.assertIn(f"run directory {self.url} is locked by another run", message)
    self.assertIn(
        f"pid={os.getpid()} started {first.holder.start_time_utc}", message
    )
    self.assertNotIn("\n", message)
    # All or nothing: the local staging lock taken first was released.
    self._acquire([local])
    self.assertEqual(self._lock_object()[1]["run_id"], first.holder.run_id)

  def test_refresh_keeps_the_lock_fresh(self):
    interval = 1.0  # Generous: refreshes must not miss 3N on a busy host.
    locks = self._acquire(refresh_interval_s=interval)
    generations = {self._lock_object()[0]}
    polling.wait_until(
        lambda: generations.add(self._lock_object()[0]) or len(generations) >= 3
    )
    # Longer than 3N after the first write, and still refused: refreshed.
    time.sleep(3 * interval + 0.5)
    with self.assertRaisesRegex(run_lock.RunLockError, "refreshed"):
      self._acquire(refresh_interval_s=interval)
    locks.check()

  def test_abandoned_lock_is_taken_over_after_3n(self):
    interval = 1.0  # Generous: refreshes must not miss 3N on a busy host.
    holder = _Holder(
        [os.path.join(self.root, "a"), self.url],
        interval,
        STORAGE_EMULATOR_HOST=self.emulator.url,
    )
    self.addCleanup(holder.kill)
    self.assertEqual(self._lock_object()[1]["pid"], holder.pid)
    with self.assertRaisesRegex(run_lock.RunLockError, f"pid={holder.pid}"):
      self._acquire(refresh_interval_s=interval)
    holder.kill()  # Crashed: no release, no refresh.
    with self.assertRaisesRegex(run_lock.RunLockError, f"pid={holder.pid}"):
      self._acquire(refresh_interval_s=interval)
    time.sleep(3 * interval + 0.5)
    with self.assertLogs(level="WARNING") as logs:
      locks = self._acquire(refresh_interval_s=interval)
    self.assertIn("took over a lock abandoned", logs.output[0])
    self.assertIn(f"pid={holder.pid}", logs.output[0])
    self.assertEqual(self._lock_object()[1]["run_id"], locks.holder.run_id)

  def test_holder_whose_lock_was_taken_over_learns_it_and_keeps_off(self):
    first = self._acquire(
        [os.path.join(self.root, "a"), self.url], refresh_interval_s=0.2
    )
    # A clock far ahead makes the first run's fresh lock look abandoned.
    second = self._acquire(
        [os.path.join(self.root, "b"), self.url],
        refresh_interval_s=0.2,
        clock=lambda: time.time() + 3600.0,
    )
    polling.wait_until(lambda: first.remote_locks[0].lost is not None)
    local = [l.directory for l in first.local_locks]
    for check in (first.check, first.fence):
      with self.assertRaisesRegex(
          run_lock.RunLockLost,
          rf"^run lock of {re.escape(self.url)} was taken over by another run"
          rf" \(host=\S+ pid={os.getpid()} started .*\): this run stopped and"
          rf" writes nothing more there; what it holds stays in its local"
          rf" staging {re.escape(', '.join(local))}$",
      ):
        check()
    first.release()
    self.assertEqual(self._lock_object()[1]["run_id"], second.holder.run_id)
    second.check()

  def test_fence_refuses_writes_while_the_lock_is_unconfirmed(self):
    interval = 0.5
    locks = self._acquire(refresh_interval_s=interval)
    locks.fence()  # Just taken: confirmed.
    # A pause: this process's refresh thread does not run.
    self.emulator.stop()
    with self.assertRaisesRegex(run_lock.RunLockUnconfirmed, "not confirmed"):
      polling.wait_until(lambda: locks.fence() and False, timeout_s=30.0)
    locks.check()  # Not lost: the run goes on, its uploads wait.
    self.emulator.start()
    polling.wait_until(lambda: not _raises(locks.fence))
    locks.release()

  def test_unreachable_bucket_warns_and_keeps_the_local_lock(self):
    port = gcs_emulator.free_port()
    down = gcs_emulator.GcsEmulator(buckets=[_BUCKET], port=port)
    self.addCleanup(down.cleanup)
    local = os.path.join(self.root, "staging", "r")
    started = time.monotonic()
    with self.assertLogs(level="WARNING") as logs:
      locks = self._acquire(
          [local, self.url],
          client_factory=down.client,
          request_timeout_s=1.0,
          refresh_interval_s=0.3,
      )
    self.assertLess(time.monotonic() - started, 30.0)
    self.assertIn("could not be reached", "\n".join(logs.output))
    self.assertFalse(locks.remote_locks[0].held)
    self.assertTrue(locks.local_locks[0].held)
    locks.check()  # Not an error: the run goes on.
    with self.assertRaises(run_lock.RunLockError):
      run_lock.acquire_run_locks([local])
    # When the bucket answers again, the refresh thread takes the lock.
    down.start()
    polling.wait_until(lambda: locks.remote_locks[0].held)
    blob = down.client().bucket(_BUCKET).get_blob(f"{self.prefix}/.run.lock")
    self.assertEqual(
        json.loads(blob.download_as_bytes())["run_id"], locks.holder.run_id
    )


if __name__ == "__main__":
  absltest.main()
