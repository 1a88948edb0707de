"""Tests for gcs_mirror against the real fake-gcs-server emulator."""

import os
import shutil
import threading
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.core import progress
from maxtext.storage import gcs_mirror
from testing import gcs_emulator
from testing import polling

_BUCKET = "mirror-test"


def _write(root, files):
  for rel, data in files.items():
    path = os.path.join(root, *rel.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(data)


def _first_failure(mirror):
  """Requests a pass of `mirror`; its stats once an upload has failed."""
  mirror.request_sync()
  polling.wait_until(lambda: mirror.stats().last_error is not None)
  return mirror.stats()


# Retries and timeouts that would take minutes to wait out: a close() that
# returns within seconds gave up on an unreachable endpoint at once.
_SLOW_TO_GIVE_UP = dict(
    max_retries=3,
    backoff_s=2.0,
    request_timeout_s=60.0,
    final_timeout_s=300.0,
)


def _files(tag):
  return {
      "mllog.log": f":::MLLOG {tag}\n".encode(),
      "metrics.jsonl": b'{"step": 1}\n' * 50,
      "tensorboard/events.out": os.urandom(300_000),
      "checkpoints/1/state/data": os.urandom(50_000),
  }


class GcsMirrorTest(gcs_emulator.EmulatorTestCase):

  BUCKET = _BUCKET

  def setUp(self):
    super().setUp()
    self.local = os.path.join(self.create_tempdir().full_path, "run")

  def _mirror(self, emulator=None, **kwargs):
    """A fast-retrying GcsMirror of self.local to the emulator's bucket."""
    emulator = emulator or self.emulator
    options = dict(
        client_factory=emulator.client,
        min_interval_s=0.0,
        max_retries=1,
        backoff_s=0.05,
        request_timeout_s=2.0,
        final_timeout_s=30.0,
    )
    options.update(kwargs)
    return gcs_mirror.GcsMirror(self.local, self.url, **options)

  def _mirror_via(self, url, **kwargs):
    """A `_mirror` whose client talks to the endpoint at `url`."""
    return self._mirror(
        client_factory=lambda: gcs_emulator.client_for(url), **kwargs
    )

  def test_objects_equal_local_files_after_close(self):
    _write(self.local, _files("first"))
    mirror = self._mirror()
    mirror.request_sync()
    polling.wait_until(lambda: mirror.stats().passes >= 1)
    _write(
        self.local,
        {
            "mllog.log": b":::MLLOG changed\n",
            "checkpoints/2/state/data": b"new checkpoint",
        },
    )
    os.remove(os.path.join(self.local, "checkpoints/1/state/data"))
    _write(self.local, {"checkpoints/3.orbax-checkpoint-tmp-1/data": b"x"})
    mirror.request_sync()
    self.assertTrue(mirror.close())

    expected = gcs_emulator.local_files(self.local)
    del expected["checkpoints/3.orbax-checkpoint-tmp-1/data"]
    self.assertEqual(
        gcs_emulator.remote_files(self.client, _BUCKET, self.prefix), expected
    )
    self.assertEqual(mirror.stats().files_deleted, 1)
    self.assertFalse(mirror.stats().pending)

  def test_requests_coalesce_and_only_changed_files_upload(self):
    files = _files("coalesce")
    _write(self.local, files)
    # A long minimum interval: after the first pass, every request waits for
    # the next pass, which only close() forces.
    mirror = self._mirror(min_interval_s=3600.0)
    mirror.request_sync()
    polling.wait_until(
        lambda: mirror.stats().passes == 1 and not mirror.stats().pending
    )
    self.assertEqual(mirror.stats().files_uploaded, len(files))
    for i in range(20):
      _write(self.local, {"mllog.log": f"line {i}\n".encode()})
      mirror.request_sync()
    self.assertTrue(mirror.stats().pending)
    self.assertEqual(mirror.stats().passes, 1)
    self.assertTrue(mirror.close())
    stats = mirror.stats()
    self.assertEqual(stats.passes, 2)
    self.assertEqual(stats.files_uploaded, len(files) + 1)
    self.assertEqual(
        gcs_emulator.remote_files(self.client, _BUCKET, self.prefix)[
            "mllog.log"
        ],
        b"line 19\n",
    )

  def test_request_sync_returns_while_a_pass_is_blocked(self):
    _write(self.local, _files("blocked"))
    release = threading.Event()

    def slow_factory():
      release.wait(30.0)
      return self.emulator.client()

    mirror = self._mirror(client_factory=slow_factory)
    for _ in range(3):
      mirror.request_sync()  # Returns although the pass cannot progress.
    polling.wait_until(lambda: mirror.stats().pending)
    self.assertEqual(mirror.stats().passes, 0)
    release.set()
    self.assertTrue(mirror.close())
    self.assertEqual(
        gcs_emulator.remote_files(self.client, _BUCKET, self.prefix),
        gcs_emulator.local_files(self.local),
    )

  def test_emulator_down_from_the_start_warns_and_close_is_bounded(self):
    _write(self.local, _files("down"))
    dead = gcs_emulator.GcsEmulator()  # Never started: nothing listens.
    self.addCleanup(dead.cleanup)
    mirror = self._mirror(
        emulator=dead, request_timeout_s=0.5, final_timeout_s=2.0
    )
    with self.assertLogs(level="WARNING") as logs:
      mirror.request_sync()
      polling.wait_until(lambda: mirror.stats().failed_passes >= 1)
      ok = mirror.close()
    self.assertFalse(ok)
    # The final pass gave up on its own deadline; close() did not have to
    # abandon a thread that was still busy.
    self.assertTrue(
        any("upload pass failed" in m for m in logs.output), logs.output
    )
    self.assertFalse(
        any("did not finish" in m for m in logs.output), logs.output
    )
    self.assertIn("Connection", mirror.stats().last_error)
    self.assertEqual(mirror.stats().files_uploaded, 0)
    # Calling close again returns the same verdict at once.
    self.assertFalse(mirror.close())

  def test_emulator_killed_mid_run_then_restarted(self):
    emulator = gcs_emulator.GcsEmulator(buckets=[_BUCKET]).start()
    self.addCleanup(emulator.cleanup)
    _write(self.local, _files("before"))
    mirror = self._mirror(
        emulator=emulator, request_timeout_s=1.0, final_timeout_s=30.0
    )
    mirror.request_sync()
    polling.wait_until(lambda: mirror.stats().passes >= 1)

    emulator.kill()
    # Over 8 MiB: a resumable upload, in several requests.
    _write(
        self.local,
        {
            "checkpoints/2/state/data": os.urandom(9 << 20),
            "mllog.log": b":::MLLOG after the crash\n",
        },
    )
    with self.assertLogs(level="WARNING") as logs:
      mirror.request_sync()
      polling.wait_until(lambda: mirror.stats().failed_passes >= 1)
    self.assertTrue(any("upload pass failed" in m for m in logs.output))

    emulator.start()
    self.assertTrue(mirror.close())
    self.assertEqual(
        gcs_emulator.remote_files(emulator.client(), _BUCKET, self.prefix),
        gcs_emulator.local_files(self.local),
    )

  def test_download_prefix_restores_a_deleted_staging(self):
    files = _files("restore")
    _write(self.local, files)
    with self._mirror() as mirror:
      mirror.request_sync()
    self.assertTrue(mirror.close())
    shutil.rmtree(self.local)

    written = gcs_mirror.download_prefix(
        self.url, self.local, client_factory=self.emulator.client
    )
    self.assertEqual(written, sorted(files))
    self.assertEqual(gcs_emulator.local_files(self.local), files)

    # A mirror of the restored directory finds everything already uploaded.
    resumed = self._mirror()
    _write(self.local, {"mllog.2.log": b":::MLLOG attempt 2\n"})
    resumed.request_sync()
    self.assertTrue(resumed.close())
    self.assertEqual(resumed.stats().files_seeded, len(files))
    self.assertEqual(resumed.stats().files_uploaded, 1)
    self.assertEqual(
        gcs_emulator.remote_files(self.client, _BUCKET, self.prefix),
        gcs_emulator.local_files(self.local),
    )

  def test_uploads_and_downloads_report_objects_and_bytes(self):
    files = _files("progress")
    _write(self.local, files)
    lines = []
    ticks = iter(range(0, 10_000, 10))  # Each reading of the clock 10 s on.
    reporter = progress.Reporter(
        progress.Lines(lines.append),
        interval_s=10.0,
        clock=lambda: float(next(ticks)),
    )
    mirror = self._mirror(progress=reporter)
    mirror.request_sync()
    self.assertTrue(mirror.close())
    size = progress.format_bytes(sum(len(d) for d in files.values()))
    label = f"mirror to {self.url}: uploading"
    # One pass uploads the four files, a line after each, then its last
    # line; a pass with nothing to upload says nothing.
    self.assertEqual(
        [line.rpartition("; ")[2] for line in lines],
        ["objects 1/4", "objects 2/4", "objects 3/4", "objects 4/4"]
        + ["objects 4/4"],
        lines,
    )
    self.assertRegex(
        lines[-1], rf"^{label}: done, {size} in 50 s \(.*/s\); objects 4/4$"
    )
    shutil.rmtree(self.local)
    del lines[:]
    gcs_mirror.download_prefix(
        self.url,
        self.local,
        client_factory=self.emulator.client,
        progress=reporter,
    )
    self.assertLen(lines, 5)
    self.assertRegex(
        lines[-1],
        rf"^download of {self.url}: done, {size} in 50 s \(.*/s\); objects"
        r" 4/4$",
    )

  def test_download_prefix_keeps_local_files_and_reports_empty_prefix(self):
    self.assertEqual(
        gcs_mirror.download_prefix(
            f"gs://{_BUCKET}/nothing/here",
            self.local,
            client_factory=self.emulator.client,
        ),
        [],
    )
    _write(self.local, {"a.txt": b"remote"})
    with self._mirror() as mirror:
      mirror.request_sync()
    _write(self.local, {"a.txt": b"local"})
    self.assertEqual(
        gcs_mirror.download_prefix(
            self.url, self.local, client_factory=self.emulator.client
        ),
        [],
    )
    self.assertEqual(gcs_emulator.local_files(self.local), {"a.txt": b"local"})
    self.assertEqual(
        gcs_mirror.download_prefix(
            self.url,
            self.local,
            client_factory=self.emulator.client,
            overwrite=True,
        ),
        ["a.txt"],
    )
    self.assertEqual(gcs_emulator.local_files(self.local), {"a.txt": b"remote"})

  def test_download_prefix_with_emulator_down_raises_gcs_error(self):
    dead = gcs_emulator.GcsEmulator()
    self.addCleanup(dead.cleanup)
    with self.assertRaisesRegex(gcs_mirror.GcsError, self.url):
      gcs_mirror.download_prefix(
          self.url,
          self.local,
          client_factory=dead.client,
          request_timeout_s=0.5,
      )

  # The bounds below are the production defaults (config base.py), under which
  # the code before fail-fast took 60 s to give up on a download and about
  # 300 s to close a mirror; "a few seconds" is asserted with a wide margin.

  @parameterized.named_parameters(
      ("closed_port", gcs_emulator.closed_port_url),
      ("unresolvable_host", gcs_emulator.unresolvable_url),
  )
  def test_download_prefix_from_unreachable_endpoint_fails_fast(self, url_fn):
    url = url_fn()
    start = time.monotonic()
    with self.assertRaisesRegex(gcs_mirror.GcsError, "unreachable endpoint"):
      gcs_mirror.download_prefix(
          self.url,
          self.local,
          client_factory=lambda: gcs_emulator.client_for(url),
          request_timeout_s=60.0,
      )
    self.assertLess(time.monotonic() - start, 10.0)
    self.assertFalse(os.path.exists(self.local))

  def test_download_prefix_list_timeout_bounds_a_slow_listing(self):
    proxy = gcs_emulator.SlowProxy(self.emulator.port, delay_s=30.0)
    self.addCleanup(proxy.close)
    start = time.monotonic()
    with self.assertRaisesRegex(gcs_mirror.GcsError, self.url):
      gcs_mirror.download_prefix(
          self.url,
          self.local,
          client_factory=lambda: gcs_emulator.client_for(proxy.url),
          request_timeout_s=60.0,
          list_timeout_s=1.0,
      )
    self.assertLess(time.monotonic() - start, 10.0)

  @parameterized.named_parameters(
      ("list_timeout", dict(list_timeout_s=0.0), "list_timeout_s"),
      ("request_timeout", dict(request_timeout_s=-1.0), "request_timeout_s"),
  )
  def test_download_prefix_bad_bounds_raise(self, kwargs, field):
    with self.assertRaisesRegex(ValueError, field):
      gcs_mirror.download_prefix(
          self.url, self.local, client_factory=self.emulator.client, **kwargs
      )

  @parameterized.named_parameters(
      ("closed_port", gcs_emulator.closed_port_url),
      ("unresolvable_host", gcs_emulator.unresolvable_url),
  )
  def test_unreachable_endpoint_close_is_prompt_and_names_what_is_missing(
      self, url_fn
  ):
    files = _files("unreachable")
    _write(self.local, files)
    mirror = self._mirror_via(url_fn(), **_SLOW_TO_GIVE_UP)
    self.assertTrue(_first_failure(mirror).unreachable)
    start = time.monotonic()
    with self.assertLogs(level="WARNING") as logs:
      ok = mirror.close()
    self.assertLess(time.monotonic() - start, 10.0)
    self.assertFalse(ok)
    self.assertLen(logs.output, 1)
    self.assertIn(
        "4 file(s) not uploaded (checkpoints/1/state/data, "
        "metrics.jsonl, mllog.log, tensorboard/events.out)",
        logs.output[0],
    )
    stats = mirror.stats()
    self.assertEqual(stats.not_uploaded, tuple(sorted(files)))
    self.assertEqual(stats.files_uploaded, 0)
    self.assertEqual(stats.passes, 0)
    self.assertEqual(gcs_emulator.local_files(self.local), files)

  def test_close_before_any_pass_against_closed_port_is_prompt(self):
    _write(self.local, {"config.json": b"{}"})
    mirror = self._mirror_via(
        gcs_emulator.closed_port_url(), **_SLOW_TO_GIVE_UP
    )
    start = time.monotonic()
    with self.assertLogs(level="WARNING") as logs:
      self.assertFalse(mirror.close())
    self.assertLess(time.monotonic() - start, 10.0)
    self.assertIn(
        "1 file(s) not uploaded (config.json): the endpoint is "
        "unreachable (ConnectionRefusedError: [Errno 111] "
        "Connection refused)",
        logs.output[0],
    )

  def test_warning_names_a_few_files_when_many_are_missing(self):
    _write(self.local, {f"f{i:02d}": b"x" for i in range(12)})
    mirror = self._mirror_via(gcs_emulator.closed_port_url())
    with self.assertLogs(level="WARNING") as logs:
      self.assertFalse(mirror.close())
    self.assertIn(
        "12 file(s) not uploaded (f00, f01, f02, f03, f04, ...)", logs.output[0]
    )
    self.assertLen(mirror.stats().not_uploaded, 12)

  def test_slow_endpoint_that_never_completed_a_pass_keeps_final_retries(self):
    # Requests time out (a slow endpoint, not an unreachable one) until the
    # delay is lifted during close(): the final pass must keep retrying
    # within its deadline instead of giving up after one attempt.
    files = _files("slow")
    _write(self.local, files)
    proxy = gcs_emulator.SlowProxy(self.emulator.port, delay_s=30.0)
    self.addCleanup(proxy.close)
    mirror = self._mirror_via(
        proxy.url,
        request_timeout_s=0.5,
        max_retries=100,
        backoff_s=0.2,
        final_timeout_s=60.0,
    )
    stats = _first_failure(mirror)
    self.assertFalse(stats.unreachable)
    self.assertEqual(stats.passes, 0)
    lift = threading.Timer(2.0, setattr, (proxy, "delay_s", 0.0))
    lift.start()
    self.addCleanup(lift.cancel)
    self.assertTrue(mirror.close())
    self.assertEqual(mirror.stats().not_uploaded, ())
    self.assertEqual(
        gcs_emulator.remote_files(self.client, _BUCKET, self.prefix), files
    )

  # --- fencing and upload order ------------------------------------------

  def _remote(self):
    return gcs_emulator.remote_files(self.client, self.BUCKET, self.prefix)

  def test_checkpoint_commit_marker_is_uploaded_last(self):
    checkpoint = {
        "checkpoints/3/commit_success.txt": b"committed",
        "checkpoints/3/_CHECKPOINT_METADATA": b"{}",
        "checkpoints/3/metadata/metadata": b"{}",
        "checkpoints/3/metadata/commit_success.txt": b"committed",
        "checkpoints/3/state/_METADATA": b"{}",
        "checkpoints/3/state/manifest.ocdbt": b"m",
        "checkpoints/3/state/commit_success.txt": b"committed",
        "checkpoints/3/state/d/aa": os.urandom(1000),
        "checkpoints/3/state/ocdbt.process_0/d/bb": os.urandom(1000),
        "checkpoints/3/state/ocdbt.process_0/manifest.ocdbt": b"m",
    }
    _write(self.local, checkpoint)
    order = []

    def fence():
      # Called before each object: the bucket then holds those before it.
      order.append(sorted(self._remote()))

    with self._mirror(fence=fence) as mirror:
      mirror.request_sync()
    self.assertEqual(self._remote(), checkpoint)
    uploaded = [
        (set(after) - set(before)).pop()
        for before, after in zip(order[1:], order[2:] + [sorted(checkpoint)])
    ]
    self.assertLen(uploaded, len(checkpoint))
    self.assertEqual(uploaded[-1], "checkpoints/3/commit_success.txt")
    for i, rel in enumerate(uploaded):
      directory = rel.rpartition("/")[0] + "/"
      # Everything beneath a file's directory went before it ...
      beneath = [u for u in uploaded if u.startswith(directory) and u != rel]
      if rel.endswith("/commit_success.txt"):
        self.assertEqual(set(beneath), set(uploaded[:i]) & set(beneath))
      below = [u for u in beneath if "/" in u[len(directory) :]]
      # ... and every file in its subdirectories.
      self.assertEqual(set(below), set(uploaded[:i]) & set(below), rel)

  def test_object_written_by_another_writer_is_never_replaced(self):
    _write(self.local, {"metrics.jsonl": b"ours 1\n", "mllog.log": b"a\n"})
    mirror = self._mirror()
    self.addCleanup(mirror.close)
    mirror.request_sync()
    polling.wait_until(lambda: mirror.stats().passes >= 1)
    # The run's new owner rewrites one object and deletes none.
    self.client.bucket(self.BUCKET).blob(
        f"{self.prefix}/metrics.jsonl"
    ).upload_from_string(b"theirs\n")
    _write(self.local, {"metrics.jsonl": b"ours 1\nours 2\n"})
    os.remove(os.path.join(self.local, "mllog.log"))
    with self.assertLogs(level="ERROR") as logs:
      self.assertFalse(mirror.close())
    self.assertRegex(
        "\n".join(logs.output),
        r"stopped: .*metrics\.jsonl was changed in the bucket by another"
        r" writer.* the local copy .* keeps everything",
    )
    self.assertIsNotNone(mirror.stats().fenced)
    # Theirs stays; and nothing more was written or deleted after the 412.
    self.assertEqual(
        self._remote(), {"metrics.jsonl": b"theirs\n", "mllog.log": b"a\n"}
    )

  def test_new_object_that_appeared_meanwhile_is_not_replaced(self):
    _write(self.local, {"a.txt": b"ours"})
    self.client.bucket(self.BUCKET).blob(f"{self.prefix}/b.txt")
    with self._mirror() as mirror:
      mirror.request_sync()
      polling.wait_until(lambda: mirror.stats().passes >= 1)
      self.client.bucket(self.BUCKET).blob(
          f"{self.prefix}/b.txt"
      ).upload_from_string(b"theirs")
      _write(self.local, {"b.txt": b"ours"})
    self.assertEqual(self._remote(), {"a.txt": b"ours", "b.txt": b"theirs"})
    self.assertIsNotNone(mirror.stats().fenced)

  def test_fenced_mirror_writes_and_deletes_nothing(self):
    _write(self.local, {"keep.txt": b"1", "gone.txt": b"2"})
    fenced = threading.Event()

    def fence():
      if fenced.is_set():
        raise gcs_mirror.WritesFenced("the run lock was taken over")

    mirror = self._mirror(fence=fence)
    mirror.request_sync()
    polling.wait_until(lambda: mirror.stats().passes >= 1)
    fenced.set()
    _write(self.local, {"keep.txt": b"changed", "new.txt": b"3"})
    os.remove(os.path.join(self.local, "gone.txt"))
    with self.assertLogs(level="ERROR") as logs:
      self.assertFalse(mirror.close())
    self.assertIn("the run lock was taken over", "\n".join(logs.output))
    self.assertEqual(self._remote(), {"keep.txt": b"1", "gone.txt": b"2"})
    self.assertEqual(mirror.stats().fenced, "the run lock was taken over")

  def test_fence_that_says_not_now_fails_the_pass_until_it_allows(self):
    _write(self.local, {"a.txt": b"1"})
    allowed = threading.Event()

    def fence():
      if not allowed.is_set():
        raise RuntimeError("the run lock is not confirmed")

    with self._mirror(fence=fence, max_retries=0, min_interval_s=0.5) as mirror:
      self.assertIn("not confirmed", _first_failure(mirror).last_error)
      self.assertEqual(self._remote(), {})
      allowed.set()
      mirror.request_sync()
      polling.wait_until(lambda: mirror.stats().passes >= 1)
    self.assertEqual(self._remote(), {"a.txt": b"1"})
    self.assertIsNone(mirror.stats().fenced)

  def test_default_client_factory_uses_storage_emulator_host(self):
    _write(self.local, {"config.json": b"{}"})
    with mock.patch.dict(
        os.environ, {"STORAGE_EMULATOR_HOST": self.emulator.url}
    ):
      mirror = gcs_mirror.GcsMirror(
          self.local,
          self.url,
          min_interval_s=0.0,
          request_timeout_s=2.0,
          final_timeout_s=30.0,
      )
      mirror.request_sync()
      self.assertTrue(mirror.close())
    self.assertEqual(
        gcs_emulator.remote_files(self.client, _BUCKET, self.prefix),
        {"config.json": b"{}"},
    )

  @parameterized.named_parameters(
      ("bucket_and_prefix", "gs://b/x/y/", ("b", "x/y")),
      ("bucket_only", "gs://b", ("b", "")),
      ("bucket_slash", "gs://b/", ("b", "")),
  )
  def test_parse_gs_url(self, url, expected):
    self.assertEqual(gcs_mirror.parse_gs_url(url), expected)

  @parameterized.named_parameters(
      ("local_path", "/tmp/run"),
      ("no_bucket", "gs:///prefix"),
      ("other_scheme", "s3://b/p"),
  )
  def test_parse_gs_url_rejects(self, url):
    with self.assertRaisesRegex(ValueError, "url"):
      gcs_mirror.parse_gs_url(url)

  @parameterized.named_parameters(
      ("min_interval", dict(min_interval_s=-1.0), "min_interval_s"),
      ("retries", dict(max_retries=-1), "max_retries"),
      ("request_timeout", dict(request_timeout_s=0.0), "request_timeout_s"),
      ("final_timeout", dict(final_timeout_s=0.0), "final_timeout_s"),
  )
  def test_bad_arguments_raise(self, kwargs, field):
    with self.assertRaisesRegex(ValueError, field):
      gcs_mirror.GcsMirror(self.local, self.url, **kwargs)


if __name__ == "__main__":
  absltest.main()
