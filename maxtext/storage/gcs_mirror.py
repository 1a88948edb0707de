"""Mirrors a local run directory to `gs://` in the background, never blocking.

The training loop writes everything under a local staging directory and calls
`GcsMirror.request_sync()` whenever something worth uploading changed. That
call only sets a flag. One background thread does the uploads:

* at most one upload pass runs at a time, and requests that arrive during a
  pass (or during the minimum interval after one) coalesce into one more pass
  that uploads the newest content;
* a pass uploads only files whose (size, mtime, inode) changed since their
  last successful upload, and deletes the objects of files it mirrored that
  are gone locally (e.g. rotated checkpoints);
* a directory's own files go after everything beneath it, and a
  `commit_success.txt` after the other files of its directory, so a
  checkpoint whose commit marker is in the bucket has all its files there
  (orbax's step directory ends with its commit marker); a file beside or
  above one that failed waits for the next pass;
* every write and delete is conditional on the object's generation as this
  mirror last wrote or listed it (0: the object must not exist), so an
  object someone else wrote since is never replaced nor deleted: such a
  precondition failure (HTTP 412), or the `fence` callable raising
  `WritesFenced` before a pass or an object, stops the mirror for good
  (one error line; the local copy keeps everything);
* every request has a bounded timeout and a bounded retry, a failed pass is
  retried a bounded number of times with exponential backoff, and failures
  are logged as warnings, never raised into the caller; the local copy keeps
  everything and the next pass tries again;
* an endpoint that refuses connections or whose host name does not resolve
  is "unreachable": a request fails at once instead of retrying for its whole
  timeout, and when no pass of the mirror has ever succeeded, the final pass
  is a single attempt;
* `close()` forces a final pass, waits for it at most a given time, and
  names in one warning what the bucket is still missing.

A fresh mirror first lists what the bucket already holds under its prefix and
counts a local file as uploaded when its size and CRC32C match the object, so
a resumed run does not upload its whole directory again.

`download_prefix()` restores a run directory from the bucket, for a resume on
a machine whose local staging is gone; its listing (the look-up of whether
the bucket holds a run at all) has its own short bound.
"""

from __future__ import annotations

import base64
import dataclasses
import fnmatch
import os
import socket
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, Optional

from absl import logging

from maxtext.core import progress as progress_lib

GS_SCHEME = "gs://"

# Orbax writes a checkpoint into a temporary directory and renames it when the
# checkpoint is complete; only finished checkpoints are mirrored.
DEFAULT_EXCLUDE = ("*orbax-checkpoint-tmp*",)

_CHUNK = 1 << 20

# orbax's commit marker: the last file of a directory to be uploaded.
COMMIT_MARKER = "commit_success.txt"

# How many not-uploaded files close()'s warning names before it says "...".
_NAMES_IN_WARNING = 5


class GcsError(RuntimeError):
  """A GCS transfer that did not succeed within its retries."""


class WritesFenced(RuntimeError):
  """This process may no longer write to the bucket (another owns the run).

  Raised by a mirror's `fence` callable; the mirror then stops for good.
  Any other exception a fence raises fails the pass, which is retried.
  """


def upload_order(rel: str) -> tuple:
  """The sort key of a relative path in a pass: data first, markers last.

  A directory's subdirectories come before its own files (post-order), and
  its `commit_success.txt` after its other files.
  """
  parts = rel.split("/")
  key = [(0, p) for p in parts[:-1]]
  key.append((1, parts[-1] == COMMIT_MARKER, parts[-1]))
  return tuple(key)


def is_gs_url(path: str) -> bool:
  return isinstance(path, str) and path.startswith(GS_SCHEME)


def parse_gs_url(url: str) -> tuple[str, str]:
  """Splits `gs://bucket/some/prefix/` into ("bucket", "some/prefix").

  Raises:
    ValueError: `url` is not a `gs://` URL with a bucket name.
  """
  if not is_gs_url(url):
    raise ValueError(f"GCS url must start with {GS_SCHEME!r}, got {url!r}")
  bucket, _, prefix = url[len(GS_SCHEME) :].partition("/")
  if not bucket:
    raise ValueError(f"GCS url must name a bucket, got {url!r}")
  return bucket, prefix.strip("/")


def _object_name(prefix: str, rel: str) -> str:
  return f"{prefix}/{rel}" if prefix else rel


def default_client_factory():
  """A `google.cloud.storage.Client` from the environment.

  With `STORAGE_EMULATOR_HOST` set (e.g. `http://127.0.0.1:4443`) the client
  talks to that emulator with anonymous credentials.
  """
  # Imported on first use: local runs never load the GCS client libraries.
  from google.cloud import storage  # pylint: disable=import-outside-toplevel

  return storage.Client()


def is_unreachable_error(error: BaseException) -> bool:
  """True when `error` says nothing answers at the endpoint at all.

  That is a refused TCP connection (nothing listens on the port) or a host
  name that does not resolve. Retrying either within one request only spends
  the request's timeout; a slow or dropped connection (a timeout, a reset) is
  not unreachable and is retried as before.

  The storage client reports both as a `requests.ConnectionError` wrapping
  urllib3's `MaxRetryError` -> `NewConnectionError`/`NameResolutionError` ->
  `ConnectionRefusedError`/`socket.gaierror`, and after its retries as a
  `google.api_core.exceptions.RetryError` whose `cause` is that error, so the
  whole chain of causes is searched.

  Args:
    error: any exception raised by a storage call.
  """
  return _unreachable_cause(error) is not None


def _unreachable_cause(error: BaseException) -> Optional[str]:
  """The refusal or resolution failure inside `error`, as short text."""
  seen = set()
  stack = [error]
  while stack:
    e = stack.pop()
    if not isinstance(e, BaseException) or id(e) in seen:
      continue
    seen.add(id(e))
    if isinstance(e, (ConnectionRefusedError, socket.gaierror)):
      return f"{type(e).__name__}: {e}"
    stack.extend(
        (
            e.__cause__,
            e.__context__,
            getattr(e, "reason", None),
            getattr(e, "cause", None),
        )
    )
    stack.extend(a for a in e.args if isinstance(a, BaseException))
  return None


def bounded_retry(timeout_s: float):
  """The storage library's retry policy, bounded to `timeout_s` in total.

  It retries what the library retries except an unreachable endpoint, which
  fails the request at once (the pass-level retries of `GcsMirror` and the
  caller of `download_prefix` decide what happens next).
  """
  # Imported on first use: local runs never load the GCS client libraries.
  from google.cloud.storage import retry  # pylint: disable=import-outside-toplevel
  # The library's own list of transient errors; it has no public accessor.
  transient = retry.DEFAULT_RETRY._predicate  # pylint: disable=protected-access
  return (
      retry.DEFAULT_RETRY.with_predicate(
          lambda e: transient(e) and not is_unreachable_error(e)
      )
      .with_timeout(timeout_s)
      .with_delay(initial=0.1, maximum=1.0, multiplier=2.0)
  )


def _cut_timeout(request_timeout_s: float, deadline: Optional[float]) -> float:
  """One request's bound: `request_timeout_s`, cut to what `deadline` leaves.

  Raises:
    GcsError: the deadline (a `time.monotonic()` value) has passed.
  """
  if deadline is None:
    return request_timeout_s
  remaining = deadline - time.monotonic()
  if remaining <= 0:
    raise GcsError("deadline passed")
  return max(0.1, min(request_timeout_s, remaining))


def _list_blobs(
    client,
    bucket,
    prefix: str,
    request_timeout_s: float,
    deadline: Optional[float],
) -> list[Any]:
  """Every blob under `prefix`, one request per page, within `deadline`.

  Each page gets its own request bound cut to what the deadline leaves, so a
  listing of many pages is bounded as a whole, not only page by page.

  Args:
    client: a `google.cloud.storage.Client`.
    bucket: a bucket name or `Bucket`.
    prefix: the object name prefix.
    request_timeout_s: the most one page's request may take, retries
      included.
    deadline: a `time.monotonic()` value the listing must end by; None for
      no bound beyond each request's.

  Raises:
    GcsError: the deadline passed.
    Exception: what the client raised.
  """
  blobs = []
  token = None
  while True:
    try:
      timeout = _cut_timeout(request_timeout_s, deadline)
    except GcsError:
      raise GcsError(
          f"listing of {prefix!r} did not finish in time, "
          f"{len(blobs)} objects listed"
      ) from None
    iterator = client.list_blobs(
        bucket,
        prefix=prefix,
        page_token=token,
        timeout=timeout,
        retry=bounded_retry(timeout),
    )
    blobs.extend(next(iterator.pages))
    token = iterator.next_page_token
    if not token:
      return blobs


def _is_permanent_object_error(error: BaseException) -> bool:
  """A 4xx answer about one object (other objects may still succeed)."""
  # Imported on first use: local runs never load the GCS client libraries.
  from google.api_core import exceptions  # pylint: disable=import-outside-toplevel

  return isinstance(error, exceptions.ClientError) and error.code not in (
      408,
      429,
  )


def _is_precondition_failed(error: BaseException) -> bool:
  # Imported on first use: local runs never load the GCS client libraries.
  from google.api_core import exceptions  # pylint: disable=import-outside-toplevel

  return isinstance(error, exceptions.PreconditionFailed)


def _is_not_found(error: BaseException) -> bool:
  # Imported on first use: local runs never load the GCS client libraries.
  from google.api_core import exceptions  # pylint: disable=import-outside-toplevel

  return isinstance(error, exceptions.NotFound)


def _crc32c_b64(path: str) -> str:
  """The file's CRC32C as GCS reports it (base64 of the big-endian value)."""
  # Imported on first use: local runs never load the GCS client libraries.
  import google_crc32c  # pylint: disable=import-outside-toplevel

  checksum = google_crc32c.Checksum()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(_CHUNK), b""):
      checksum.update(chunk)
  return base64.b64encode(checksum.digest()).decode("ascii")


@dataclasses.dataclass(frozen=True)
class MirrorStats:
  """Counters of a mirror, for logs and tests.

  Attributes:
    passes: upload passes that completed with every file uploaded.
    failed_passes: passes that gave up after their retries.
    files_uploaded: uploads that succeeded.
    files_deleted: objects deleted because their local file was gone.
    files_seeded: local files found already in the bucket, not uploaded.
    last_error: the newest failure, as text, or None.
    unreachable: the newest failure said nothing answers at the endpoint
      (see `is_unreachable_error`); False after a pass succeeds.
    not_uploaded: after `close()`, the relative paths of local files the
      bucket does not hold as they are locally, sorted; empty before.
    pending: True while a requested pass has not completed yet.
    fenced: why the mirror stopped writing for good (its fence said so,
      or an object changed under it), or None.
  """

  passes: int
  failed_passes: int
  files_uploaded: int
  files_deleted: int
  files_seeded: int
  last_error: Optional[str]
  unreachable: bool
  not_uploaded: tuple[str, ...]
  pending: bool
  fenced: Optional[str] = None


def _check_not_negative(**bounds: float) -> None:
  """Raises ValueError naming the first of `bounds` (name=value) below 0."""
  for name, value in bounds.items():
    if value < 0:
      raise ValueError(f"{name} must be >= 0, got {value}")


def _check_positive(**bounds: Optional[float]) -> None:
  """Raises ValueError naming the first of `bounds` (name=value) that is not
  above 0; a None bound (none asked for) passes."""
  for name, value in bounds.items():
    if value is not None and value <= 0:
      raise ValueError(f"{name} must be > 0, got {value}")


def _fresh_stats() -> dict[str, Any]:
  """A new mirror's counters: `MirrorStats`' fields but `pending`."""
  return dict(
      passes=0,
      failed_passes=0,
      files_uploaded=0,
      files_deleted=0,
      files_seeded=0,
      last_error=None,
      unreachable=False,
      not_uploaded=(),
      fenced=None,
  )


class GcsMirror:
  """Uploads a local directory to a `gs://` prefix from one background thread.

  Thread-safe: `request_sync`, `stats` and `close` may be called from any
  thread. None of them raises on network trouble.
  """

  def __init__(
      self,
      local_dir: str,
      gs_url: str,
      *,
      client_factory: Optional[Callable[[], Any]] = None,
      min_interval_s: float = 30.0,
      max_retries: int = 3,
      backoff_s: float = 2.0,
      request_timeout_s: float = 60.0,
      final_timeout_s: float = 300.0,
      exclude: Iterable[str] = DEFAULT_EXCLUDE,
      fence: Optional[Callable[[], None]] = None,
      progress: Optional[progress_lib.Reporter] = None,
  ):
    """Starts the background thread; uploads begin on the first request.

    Args:
      local_dir: the directory to mirror (it may not exist yet).
      gs_url: the destination, `gs://bucket/prefix`.
      client_factory: returns a `google.cloud.storage.Client`; called once,
        in the background thread, and cached. Defaults to
        `default_client_factory`.
      min_interval_s: the least time between the starts of two passes.
      max_retries: how often a failed pass is retried before it gives up
        (the next request starts again).
      backoff_s: the first retry's delay; it doubles with each retry.
      request_timeout_s: the most one request may take, retries included.
      final_timeout_s: the default bound of `close()`.
      exclude: `fnmatch` patterns of relative paths (with "/") to skip.
      fence: called before each pass and each object write or delete;
        raises `WritesFenced` when this process may no longer write to the
        bucket (the mirror stops for good), or any other exception when it
        may not write now (the pass fails and is retried).
      progress: where a long pass reports its progress (objects and bytes
        uploaded); default: the log, every `progress.LOG_INTERVAL_S`.

    Raises:
      ValueError: a bad URL or a negative or zero bound.
    """
    self._bucket_name, self._prefix = parse_gs_url(gs_url)
    _check_not_negative(min_interval_s=min_interval_s, backoff_s=backoff_s)
    _check_positive(
        request_timeout_s=request_timeout_s, final_timeout_s=final_timeout_s
    )
    _check_not_negative(max_retries=max_retries)
    self.local_dir = os.path.abspath(local_dir)
    self.gs_url = gs_url
    self._client_factory = client_factory or default_client_factory
    self._min_interval_s = float(min_interval_s)
    self._max_retries = int(max_retries)
    self._backoff_s = float(backoff_s)
    self._request_timeout_s = float(request_timeout_s)
    self._final_timeout_s = float(final_timeout_s)
    self._exclude = tuple(exclude)
    self._fence = fence
    self._progress = progress or progress_lib.logged()

    self._client = None
    self._seeded = False
    # Relative path -> (size, mtime_ns, inode) at its last successful upload.
    self._synced: dict[str, tuple[int, int, int]] = {}
    # Relative path -> the object's generation as this mirror last wrote or
    # listed it: the precondition of its next write or delete.
    self._generations: dict[str, int] = {}
    self._wake = threading.Event()
    self._closing = threading.Event()
    self._stats_lock = threading.Lock()
    self._stats = _fresh_stats()
    # The short text of the newest failure when it was an unreachable
    # endpoint, for close()'s warning; None otherwise.
    self._unreachable_cause: Optional[str] = None
    self._final_deadline = 0.0
    self._in_pass = False
    self._final_ok = False
    self._closed = False
    self._thread = self._start_loop()

  def _start_loop(self) -> threading.Thread:
    """Starts the background thread that runs the passes (`_loop`)."""
    thread = threading.Thread(target=self._loop, name="gcs-mirror", daemon=True)
    thread.start()
    return thread

  # --- caller side ------------------------------------------------------------

  def request_sync(self) -> None:
    """Asks for an upload pass of the newest content; returns at once."""
    self._wake.set()

  def stats(self) -> MirrorStats:
    with self._stats_lock:
      return MirrorStats(
          pending=self._wake.is_set() or self._in_pass, **self._stats
      )

  def close(self, timeout_s: Optional[float] = None) -> bool:
    """Runs a final pass and waits for it at most `timeout_s` seconds.

    When no pass has ever succeeded and the endpoint is unreachable, the
    final pass is one attempt, which fails at once, rather than retries
    until the deadline.

    Args:
      timeout_s: the wait bound; defaults to `final_timeout_s`.

    Returns:
      True when the bucket holds every local file as it is now. False when
      the final pass failed or did not finish in time: one warning then
      says why and how many files (naming a few) the bucket is missing, and
      `stats().not_uploaded` lists them all; the local directory still has
      everything.
    """
    if self._closed:
      return self._final_ok
    self._closed = True
    timeout_s = self._final_timeout_s if timeout_s is None else timeout_s
    self._final_deadline = time.monotonic() + timeout_s
    self._closing.set()
    self._wake.set()
    self._thread.join(timeout_s)
    fenced = self.stats().fenced
    if fenced:
      reason = f"writes to the bucket are fenced ({fenced})"
    elif self._thread.is_alive():
      reason = f"the final upload did not finish within {timeout_s:.1f} s"
    elif self._final_ok:
      return True
    elif self._unreachable_cause:
      reason = f"the endpoint is unreachable ({self._unreachable_cause})"
    else:
      reason = f"the final upload failed ({self.stats().last_error})"
    missing = self._not_uploaded()
    with self._stats_lock:
      self._stats["not_uploaded"] = tuple(missing)
    names = ", ".join(missing[:_NAMES_IN_WARNING])
    if len(missing) > _NAMES_IN_WARNING:
      names += ", ..."
    logging.warning(
        "GCS mirror %s -> %s: %d file(s) not uploaded%s: %s; the local copy"
        " keeps everything.",
        self.local_dir,
        self.gs_url,
        len(missing),
        f" ({names})" if names else "",
        reason,
    )
    return False

  def __enter__(self) -> "GcsMirror":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _not_uploaded(self) -> list[str]:
    """Relative paths of local files not in the bucket as they are now."""
    if not os.path.isdir(self.local_dir):
      return []
    # A copy: the background thread may still be updating it after a
    # close() that timed out.
    synced = dict(self._synced)
    return sorted(
        rel
        for rel, (signature, _) in self._scan().items()
        if synced.get(rel) != signature
    )

  # --- background thread ------------------------------------------------------

  def _loop(self) -> None:
    """The background thread: passes on request, then the final pass."""
    last_start = -float("inf")
    while True:
      self._wake.wait()
      if self._closing.is_set():
        break
      delay = last_start + self._min_interval_s - time.monotonic()
      if delay > 0 and self._closing.wait(delay):
        break
      last_start = time.monotonic()
      self._in_pass = True
      self._wake.clear()
      ok = self._run_pass(final=False)
      if not ok and not self._closing.is_set() and not self._is_fenced():
        self._wake.set()  # Content is still unsynced: try again later.
      self._in_pass = False
    self._in_pass = True
    self._wake.clear()
    self._final_ok = not self._is_fenced() and self._run_pass(final=True)
    self._in_pass = False

  def _is_fenced(self) -> bool:
    with self._stats_lock:
      return self._stats["fenced"] is not None

  def _stop_writing(self, reason: str) -> None:
    """Stops the mirror for good: nothing more is written to the bucket."""
    with self._stats_lock:
      if self._stats["fenced"] is not None:
        return
      self._stats["fenced"] = reason
    logging.error(
        "GCS mirror %s -> %s stopped: %s. Nothing more is written to the"
        " bucket; the local copy %s keeps everything.",
        self.local_dir,
        self.gs_url,
        reason,
        self.local_dir,
    )

  def _check_fence(self) -> None:
    """Raises WritesFenced (after stopping the mirror) or the fence's error."""
    if self._is_fenced():
      raise WritesFenced(self.stats().fenced)
    if self._fence is None:
      return
    try:
      self._fence()
    except WritesFenced as e:
      self._stop_writing(str(e))
      raise

  def _remaining(self, final: bool) -> Optional[float]:
    return self._final_deadline - time.monotonic() if final else None

  def _run_pass(self, final: bool) -> bool:
    """One pass with its retries; True when every file is in the bucket.

    The final pass logs no warning of its own: close() reports its outcome.
    """
    attempt = 0
    while True:
      try:
        if self._is_fenced():
          return False
        if self._sync_once(final):
          with self._stats_lock:
            self._stats["passes"] += 1
            self._stats["unreachable"] = False
            self._unreachable_cause = None
          return True
        error = "interrupted by close()"
      except WritesFenced:
        return False  # _stop_writing said why, once.
      # Any failure of a pass is recorded and retried, never raised into the
      # caller (the module's contract).
      except Exception as e:  # pylint: disable=broad-exception-caught
        error = f"{type(e).__name__}: {e}"
        with self._stats_lock:
          self._stats["last_error"] = error
          self._unreachable_cause = _unreachable_cause(e)
          self._stats["unreachable"] = self._unreachable_cause is not None
      if not final and self._closing.is_set():
        return False  # The final pass takes over at once.
      attempt += 1
      delay = self._backoff_s * 2 ** (attempt - 1)
      remaining = self._remaining(final)
      with self._stats_lock:
        # An endpoint that never worked and refuses now will not start
        # working within close()'s wait; retrying only delays the run's end.
        never_reached = (
            self._stats["unreachable"] and self._stats["passes"] == 0
        )
      if (
          attempt > self._max_retries
          or (final and never_reached)
          or (remaining is not None and remaining <= delay)
      ):
        with self._stats_lock:
          self._stats["failed_passes"] += 1
        if not final:
          logging.warning(
              "GCS mirror %s -> %s: upload pass failed after %d attempt(s):"
              " %s. Training goes on; the local copy keeps everything and a"
              " later pass retries.",
              self.local_dir,
              self.gs_url,
              attempt,
              error,
          )
        return False
      if final:
        time.sleep(delay)
      elif self._closing.wait(delay):
        return False

  def _request_timeout(self, final: bool) -> float:
    try:
      return _cut_timeout(
          self._request_timeout_s, self._final_deadline if final else None
      )
    except GcsError:
      raise GcsError("close() deadline passed") from None

  def _bucket(self):
    if self._client is None:
      self._client = self._client_factory()
    return self._client.bucket(self._bucket_name)

  def _scan(self) -> dict[str, tuple[tuple[int, int, int], str]]:
    """Relative path -> (signature, absolute path) of every local file."""
    files = {}
    for root, _, names in os.walk(self.local_dir):
      for name in names:
        path = os.path.join(root, name)
        rel = os.path.relpath(path, self.local_dir).replace(os.sep, "/")
        if any(fnmatch.fnmatch(rel, p) for p in self._exclude):
          continue
        try:
          st = os.stat(path)
        except FileNotFoundError:
          continue
        files[rel] = ((st.st_size, st.st_mtime_ns, st.st_ino), path)
    return files

  def _seed(self, bucket, local, final: bool) -> None:
    """Marks local files that the bucket already holds as uploaded."""
    list_prefix = _object_name(self._prefix, "")
    blobs = _list_blobs(
        bucket.client,
        bucket,
        list_prefix,
        self._request_timeout_s,
        self._final_deadline if final else None,
    )
    seeded = 0
    for blob in blobs:
      rel = blob.name[len(list_prefix) :]
      self._generations[rel] = blob.generation
      if rel not in local or not blob.crc32c:
        continue
      signature, path = local[rel]
      if blob.size == signature[0] and _crc32c_b64(path) == blob.crc32c:
        self._synced[rel] = signature
        seeded += 1
    with self._stats_lock:
      self._stats["files_seeded"] += seeded

  def _sync_once(self, final: bool) -> bool:
    """Uploads changed files once; False if close() interrupted it.

    Raises:
      WritesFenced: the fence says this process may no longer write, or an
        object changed under the mirror (the mirror has stopped).
      Exception: the first transport error, the fence's error, or a summary
        of per-object errors after trying every file.
    """
    if not os.path.isdir(self.local_dir):
      # Nothing staged yet (or the staging is gone): never delete remotely.
      return True
    self._check_fence()
    bucket = self._bucket()
    local = self._scan()
    if not self._seeded:
      self._seed(bucket, local, final)
      self._seeded = True
    object_errors = []
    if not self._upload_changed(bucket, local, final, object_errors):
      return False
    for rel in sorted(set(self._synced) - set(local)):
      self._check_fence()
      timeout = self._request_timeout(final)
      try:
        bucket.blob(_object_name(self._prefix, rel)).delete(
            if_generation_match=self._generations.get(rel, 0),
            timeout=timeout,
            retry=bounded_retry(timeout),
        )
      # The client raises many types; all but a missing or permanently
      # failing object are re-raised to fail the pass.
      except Exception as e:  # pylint: disable=broad-exception-caught
        if _is_precondition_failed(e):
          self._changed_under_us(rel)
        if not _is_not_found(e):
          if not _is_permanent_object_error(e):
            raise
          object_errors.append(f"delete {rel}: {e}")
          continue
      del self._synced[rel]
      self._generations.pop(rel, None)
      with self._stats_lock:
        self._stats["files_deleted"] += 1
    if object_errors:
      raise GcsError("; ".join(object_errors[:5]))
    return True

  def _upload_changed(
      self, bucket, local, final: bool, object_errors: list[str]
  ) -> bool:
    """Uploads the files changed since their last upload, data first and
    commit markers last (`upload_order`), reporting the pass's progress
    (objects and bytes; quiet when short); False if close() interrupted it.

    Per-object permanent errors are appended to `object_errors`; any other
    error is raised (see `_sync_once`).
    """
    changed = [
        (rel, signature, path)
        for rel, (signature, path) in sorted(
            local.items(), key=lambda item: upload_order(item[0])
        )
        if self._synced.get(rel) != signature
    ]
    failed: list[str] = []  # Relative paths whose upload failed.
    with self._progress.start(
        f"mirror to {self.gs_url}: uploading",
        sum(signature[0] for _, signature, _ in changed),
        progress_lib.BYTES,
        quiet_if_short=True,
    ) as job:
      for i, (rel, signature, path) in enumerate(changed, 1):
        if not final and self._closing.is_set():
          return False
        directory = rel.rpartition("/")[0]
        if directory and any(f.startswith(directory + "/") for f in failed):
          # A file beside or above one that failed (a commit marker above
          # its data) waits until that one is in the bucket.
          continue
        self._check_fence()
        try:
          self._upload(bucket, rel, path, final)
        except FileNotFoundError:
          continue  # Deleted since the scan; the next pass sees it gone.
        # The client raises many types; all but a permanent per-object error
        # are re-raised to fail the pass.
        except Exception as e:  # pylint: disable=broad-exception-caught
          if not _is_permanent_object_error(e):
            raise
          object_errors.append(f"{rel}: {e}")
          failed.append(rel)
          continue
        self._synced[rel] = signature
        with self._stats_lock:
          self._stats["files_uploaded"] += 1
        job.advance(signature[0], f"objects {i}/{len(changed)}")
    return True

  def _upload(self, bucket, rel: str, path: str, final: bool) -> None:
    """Uploads one file, conditional on the generation last written or seen.

    A failed precondition on an object that now holds exactly this file
    (this mirror's own write, retried after a lost answer) is adopted.

    Raises:
      WritesFenced: the object holds something else (another writer).
      Exception: what the client raised.
    """
    name = _object_name(self._prefix, rel)
    blob = bucket.blob(name)
    timeout = self._request_timeout(final)
    try:
      blob.upload_from_filename(
          path,
          if_generation_match=self._generations.get(rel, 0),
          timeout=timeout,
          retry=bounded_retry(timeout),
      )
    # The client raises many types; only a failed precondition is handled.
    except Exception as e:  # pylint: disable=broad-exception-caught
      if not _is_precondition_failed(e):
        raise
      found = bucket.get_blob(
          name, timeout=timeout, retry=bounded_retry(timeout)
      )
      if (
          found is None
          or found.size != os.path.getsize(path)
          or found.crc32c != _crc32c_b64(path)
      ):
        self._changed_under_us(rel)
      blob = found
    self._generations[rel] = blob.generation

  def _changed_under_us(self, rel: str) -> None:
    """Stops the mirror: another writer changed `rel` since this one saw it.

    Raises:
      WritesFenced: always.
    """
    reason = (
        f"{_object_name(self._prefix, rel)} was changed in the bucket by"
        " another writer (its generation is not the one this run last wrote"
        " or saw)"
    )
    self._stop_writing(reason)
    raise WritesFenced(reason)


def download_prefix(
    gs_url: str,
    local_dir: str,
    *,
    client_factory: Optional[Callable[[], Any]] = None,
    request_timeout_s: float = 60.0,
    list_timeout_s: Optional[float] = None,
    overwrite: bool = False,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    progress: Optional[progress_lib.Reporter] = None,
) -> list[str]:
  """Downloads every object under `gs_url` into `local_dir`.

  First the prefix is listed: that look-up (is there a run, and what does it
  hold) is bounded by `list_timeout_s` in total, and an unreachable endpoint
  (see `is_unreachable_error`) fails it at once. Only then are the objects
  downloaded, each bounded by `request_timeout_s`, however long the whole
  download takes: a resume needs every file of its checkpoint, and a bound
  on the total would cut a large but healthy download short.

  Each file is written to a temporary name and renamed when complete, so an
  interrupted download never leaves a truncated file under its real name.

  Args:
    gs_url: the source, `gs://bucket/prefix`.
    local_dir: the directory to fill (created if missing).
    client_factory: returns a `google.cloud.storage.Client`; defaults to
      `default_client_factory`.
    request_timeout_s: the most one request may take, retries included.
    list_timeout_s: the most the listing may take in total, all its pages
      and retries included; None for `request_timeout_s` per page.
    overwrite: replace local files that exist; by default they are kept (the
      local staging is newer than the mirror).
    exclude: `fnmatch` patterns of relative paths (with "/") not to
      download, as for `GcsMirror`.
    progress: where a long download reports its progress (objects and
      bytes); default: the log, every `progress.LOG_INTERVAL_S`.

  Returns:
    The relative paths written, sorted; empty when nothing is under the
    prefix.

  Raises:
    ValueError: a bad URL or a bound that is not positive.
    GcsError: the endpoint is unreachable, the listing did not finish within
      `list_timeout_s`, or listing or downloading failed within its retries.
  """
  bucket_name, prefix = parse_gs_url(gs_url)
  _check_positive(
      request_timeout_s=request_timeout_s, list_timeout_s=list_timeout_s
  )
  list_deadline = (
      None if list_timeout_s is None else time.monotonic() + list_timeout_s
  )
  list_prefix = _object_name(prefix, "")
  local_dir = os.path.abspath(local_dir)
  retry = bounded_retry(request_timeout_s)
  try:
    client = (client_factory or default_client_factory)()
    blobs = _list_blobs(
        client, bucket_name, list_prefix, request_timeout_s, list_deadline
    )
    wanted = _to_download(blobs, list_prefix, local_dir, overwrite, exclude)
    written = _download_all(
        wanted,
        local_dir,
        request_timeout_s,
        retry,
        progress or progress_lib.logged(),
        f"download of {gs_url}",
    )
  except Exception as e:
    raise GcsError(
        f"download of {gs_url} into {local_dir} failed: {_failure_text(e)}"
    ) from e
  return sorted(written)


def _failure_text(error: BaseException) -> str:
  """What went wrong, in short: the unreachable endpoint's cause, or the
  error's type and message."""
  cause = _unreachable_cause(error)
  if cause:
    return f"unreachable endpoint ({cause})"
  return f"{type(error).__name__}: {error}"


def _to_download(
    blobs, list_prefix: str, local_dir: str, overwrite: bool, exclude
) -> list[tuple[Any, str]]:
  """(blob, relative path) of the listed objects to download: plain
  relative paths, not excluded, not present locally unless `overwrite`."""
  wanted = []
  for blob in blobs:
    rel = blob.name[len(list_prefix) :]
    parts = rel.split("/")
    if not rel or rel.endswith("/") or any(p in ("", ".", "..") for p in parts):
      if rel and not rel.endswith("/"):
        logging.warning(
            "download_prefix: skipping object %r (not a plain relative path)",
            blob.name,
        )
      continue
    if any(fnmatch.fnmatch(rel, p) for p in exclude):
      continue
    if os.path.exists(os.path.join(local_dir, *parts)) and not overwrite:
      continue
    wanted.append((blob, rel))
  return wanted


def _download_all(
    wanted: list[tuple[Any, str]],
    local_dir: str,
    request_timeout_s: float,
    retry,
    progress: progress_lib.Reporter,
    label: str,
) -> list[str]:
  """Downloads each (blob, relative path) of `wanted` under `local_dir` in
  turn, reporting the objects and bytes to `progress` as job `label`.

  Returns:
    The relative paths written, in the order of `wanted`.
  """
  written = []
  with progress.start(
      label,
      sum(blob.size or 0 for blob, _ in wanted),
      progress_lib.BYTES,
      quiet_if_short=True,
  ) as job:
    for i, (blob, rel) in enumerate(wanted, 1):
      _download(
          blob,
          os.path.join(local_dir, *rel.split("/")),
          request_timeout_s,
          retry,
      )
      written.append(rel)
      job.advance(blob.size or 0, f"objects {i}/{len(wanted)}")
  return written


def _download(blob, path: str, request_timeout_s: float, retry) -> None:
  """Downloads `blob` to `path` through a temporary name beside it."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(
      dir=os.path.dirname(path),
      prefix=f".{os.path.basename(path)}.",
      suffix=".part",
  )
  os.close(fd)
  try:
    blob.download_to_filename(tmp, timeout=request_timeout_s, retry=retry)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
