"""Tests for the fake-gcs-server fixture and its broken-endpoint helpers."""

import time

from absl.testing import absltest
from absl.testing import parameterized
from google.api_core import exceptions

from testing import gcs_emulator


class GcsEmulatorTest(parameterized.TestCase):

  def test_restart_keeps_port_buckets_and_objects(self):
    root = self.create_tempdir().full_path
    emulator = gcs_emulator.GcsEmulator(buckets=["kept"], root=root)
    self.addCleanup(emulator.cleanup)
    emulator.start()
    port = emulator.port
    emulator.client().bucket("kept").blob("a/b.txt").upload_from_string(
        b"payload"
    )
    emulator.kill()
    self.assertFalse(emulator.running)
    emulator.start()
    self.assertEqual(emulator.port, port)
    self.assertTrue(emulator.running)
    self.assertEqual(
        emulator.client().bucket("kept").blob("a/b.txt").download_as_bytes(),
        b"payload",
    )
    emulator.restart()
    self.assertEqual(
        [b.name for b in emulator.client().list_blobs("kept")], ["a/b.txt"]
    )

  def test_missing_bucket_is_an_error(self):
    with gcs_emulator.GcsEmulator(buckets=["one"]) as emulator:
      with self.assertRaises(exceptions.NotFound):
        emulator.client().bucket("other").blob("x").download_as_bytes()
      self.assertTrue(emulator.url.startswith("http://127.0.0.1:"))
    self.assertFalse(emulator.running)

  def test_remote_files_listed_or_by_name(self):
    with gcs_emulator.GcsEmulator(buckets=["files"]) as emulator:
      client = emulator.client()
      for name, data in (
          ("run/x.txt", b"x"),
          ("run/d/y.txt", b"y"),
          ("other/z.txt", b"z"),
      ):
        client.bucket("files").blob(name).upload_from_string(data)
      self.assertEqual(
          gcs_emulator.remote_files(client, "files", "run"),
          {"x.txt": b"x", "d/y.txt": b"y"},
      )
      self.assertEqual(
          gcs_emulator.remote_files(
              client, "files", "run/", names=["d/y.txt", "missing.txt"]
          ),
          {"d/y.txt": b"y"},
      )

  def test_closed_port_and_unresolvable_host_fail(self):
    # retry=None: the first error itself (a requests.ConnectionError).
    with self.assertRaisesRegex(Exception, "Connection refused"):
      list(
          gcs_emulator.client_for(gcs_emulator.closed_port_url()).list_blobs(
              "any", retry=None
          )
      )
    with self.assertRaisesRegex(Exception, "Failed to resolve"):
      list(
          gcs_emulator.client_for(gcs_emulator.unresolvable_url()).list_blobs(
              "any", retry=None
          )
      )

  @parameterized.named_parameters(
      ("simple", None),
      # A chunk size makes the client upload in a resumable session.
      ("resumable", 256 << 10),
  )
  def test_uploads_enforce_generation_preconditions(self, chunk_size):
    """What fencing a bucket relies on: a stale generation is refused."""
    with gcs_emulator.GcsEmulator(buckets=["fence"]) as emulator:
      bucket = emulator.client().bucket("fence")
      payload = b"x" * (600 << 10)
      first = bucket.blob("o")
      first.upload_from_string(b"first", if_generation_match=0)
      current = bucket.blob("o")
      current.upload_from_string(
          b"second", if_generation_match=first.generation
      )
      for stale in (first.generation, 0):
        with self.assertRaises(exceptions.PreconditionFailed):
          bucket.blob("o", chunk_size=chunk_size).upload_from_string(
              payload, if_generation_match=stale
          )
      self.assertEqual(bucket.blob("o").download_as_bytes(), b"second")
      replaced = bucket.blob("o", chunk_size=chunk_size)
      replaced.upload_from_string(
          payload, if_generation_match=current.generation
      )
      self.assertEqual(bucket.blob("o").download_as_bytes(), payload)

  def test_deletes_ignore_generation_preconditions(self):
    """fake-gcs-server 1.54 (the newest the registry ships) deletes whatever
    generation a delete names; real GCS answers 412. Bucket code must not
    rely on this emulator to prove a conditional delete: when this test
    fails, the emulator enforces them and such tests become possible."""
    with gcs_emulator.GcsEmulator(buckets=["fence"]) as emulator:
      bucket = emulator.client().bucket("fence")
      first = bucket.blob("o")
      first.upload_from_string(b"first")
      bucket.blob("o").upload_from_string(b"second")
      bucket.blob("o").delete(if_generation_match=first.generation)
      self.assertIsNone(bucket.get_blob("o"))

  @parameterized.named_parameters(
      ("requests", False),
      ("replies", True),
  )
  def test_slow_proxy_forwards_with_a_delay(self, delay_replies):
    with gcs_emulator.GcsEmulator(buckets=["slow"]) as emulator:
      with gcs_emulator.SlowProxy(
          emulator.port, delay_s=0.3, delay_replies=delay_replies
      ) as proxy:
        client = gcs_emulator.client_for(proxy.url)
        start = time.monotonic()
        client.bucket("slow").blob("x").upload_from_string(b"payload")
        self.assertGreaterEqual(time.monotonic() - start, 0.3)
        proxy.delay_s = 0.0
        self.assertEqual(
            client.bucket("slow").blob("x").download_as_bytes(), b"payload"
        )


if __name__ == "__main__":
  absltest.main()
