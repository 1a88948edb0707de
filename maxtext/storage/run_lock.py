"""Exclusive locks that make a run directory belong to one run for its life.

A run takes its locks before any device work and holds them until it ends:

* a local directory (the run directory, its local staging copy for a gs://
  run, an external local checkpoint directory) is locked with `flock` on
  `<dir>/.run.lock`. The kernel drops the lock when the holder exits or is
  killed, so a `kill -9` leaves nothing stale. The holder (host, pid, start
  time, run id) is written into the file after the lock is taken, so a
  refused run can name it.
* a `gs://` location (the mirrored run directory, an external gs://
  checkpoint directory) is locked with the object `<prefix>/.run.lock`,
  created only if absent (`ifGenerationMatch=0`). A background thread
  rewrites it every `refresh_interval_s` (N), each time conditional on the
  generation it wrote last. Another run refuses to start while the object is
  younger than 3N by the server's clock, and takes it over, with a warning,
  when it is older: its holder stopped refreshing (it crashed or lost the
  network for longer than 3N).

GCS policy: trouble reaching GCS never stops or stalls a run. Every request
has a bounded timeout and retry; when the bucket cannot be reached at start
the run goes on with its local locks only (a warning says so) and the
refresh thread keeps trying to take the remote lock. What does stop a run is
a remote lock that another run holds and refreshes (`RunLockError`). A run
whose remote lock was taken over while it ran (it could not refresh for 3N)
learns it from `RunLocks.check()` (`RunLockLost`) and writes nothing more
there: the check guards each step's records and each checkpoint, and
`RunLocks.fence()` each write of the GCS mirror, which also refuses to write
while the lock has gone unconfirmed for 2N (after a long pause, until the
refresh thread has looked). Every object write of the mirror is conditional
on the generation it last saw, so a write already under way when the lock
was lost cannot replace the new owner's objects either.

`flock` is per open file: a second acquisition in the same process is refused
like one from another process. Lock files are opened close-on-exec, so child
processes started with exec never inherit a lock; a child made by a bare
`fork()` shares it until it exits.

    with run_lock.acquire_run_locks([run_dir, "gs://bucket/runs/r1"]) as locks:
      ...  # train; locks.check() between steps
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

from absl import logging

from maxtext.core import checks
from maxtext.storage import gcs_mirror

LOCK_FILE_NAME = ".run.lock"

# A refused run reads the holder from the lock file; the holder writes it just
# after taking the lock, so an empty file is re-read for up to this long.
_HOLDER_READ_WAIT_S = 1.0
_MAX_FIELD_LEN = 200


def _utc_now_iso() -> str:
  return (
      datetime.datetime.now(datetime.timezone.utc)
      .isoformat(timespec="microseconds")
      .replace("+00:00", "Z")
  )


def _one_line(value: Any, limit: Optional[int] = _MAX_FIELD_LEN) -> str:
  """`value` as text fit for a one-line message.

  Fields read from a lock file may hold anything, so they are cut to
  `limit` characters; the error's own detail (paths) passes `limit=None`.
  """
  text = str(value)
  text = "".join(c if c.isprintable() else "?" for c in text)
  return text if limit is None else text[:limit]


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a lock.

  Attributes:
    host: the holder's host name.
    pid: the holder's process id on that host.
    start_time_utc: when the holder took its locks, ISO 8601 UTC.
    run_id: a random token of one `acquire_run_locks` call; it tells a lock
      this run wrote from another run's.
    refresh_interval_s: how often the holder refreshes its remote locks.
  """

  host: str
  pid: int
  start_time_utc: str
  run_id: str
  refresh_interval_s: float = 0.0

  @classmethod
  def for_this_process(cls, refresh_interval_s: float = 0.0) -> "Holder":
    return cls(
        host=socket.gethostname(),
        pid=os.getpid(),
        start_time_utc=_utc_now_iso(),
        run_id=uuid.uuid4().hex,
        refresh_interval_s=refresh_interval_s,
    )

  def to_bytes(self) -> bytes:
    return (
        json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n"
    ).encode()

  @classmethod
  def from_bytes(cls, data: bytes) -> Optional["Holder"]:
    """The holder written in a lock, or None when it is empty or garbled."""
    try:
      fields = json.loads(data.decode())
      interval = fields.get("refresh_interval_s", 0.0)
      return cls(
          host=_one_line(fields["host"]),
          pid=int(fields["pid"]),
          start_time_utc=_one_line(fields["start_time_utc"]),
          run_id=_one_line(fields["run_id"]),
          refresh_interval_s=(
              float(interval) if checks.is_number(interval) else 0.0
          ),
      )
    except (ValueError, TypeError, KeyError, AttributeError):
      return None

  def describe(self) -> str:
    return f"host={self.host} pid={self.pid} started {self.start_time_utc}"


class RunLockError(RuntimeError):
  """The directory is locked by another run; the message is one line.

  Attributes:
    location: the locked directory or gs:// URL.
    holder: the other run, or None when it could not be read.
  """

  def __init__(self, location: str, holder: Optional[Holder], detail: str = ""):
    self.location = location
    self.holder = holder
    who = holder.describe() if holder else "an unknown holder"
    message = f"run directory {location} is locked by another run ({who})"
    if detail:
      message += f": {_one_line(detail, limit=None)}"
    super().__init__(message)


class RunLockLost(gcs_mirror.WritesFenced):
  """Another run took this run's remote lock over; the message is one line.

  A subclass of `gcs_mirror.WritesFenced`: a mirror whose fence raises it
  stops for good.

  Attributes:
    location: the gs:// location whose lock was lost.
    holder: the run that holds it now, or None when unknown.
  """

  def __init__(
      self, location: str, holder: Optional[Holder], local_dirs: Sequence[str]
  ):
    self.location = location
    self.holder = holder
    who = holder.describe() if holder else "an unknown holder"
    where = ", ".join(local_dirs) or "this machine's local directories"
    super().__init__(
        f"run lock of {location} was taken over by another run ({who}): "
        f"this run stopped and writes nothing more there; what it holds "
        f"stays in its local staging {where}"
    )


class RunLockUnconfirmed(RuntimeError):
  """A remote lock has not been confirmed recently; writes must wait."""


class LocalLock:
  """`flock` on `<directory>/.run.lock`, refused at once when held."""

  def __init__(self, directory: str, holder: Holder):
    self.directory = os.path.abspath(directory)
    self.path = os.path.join(self.directory, LOCK_FILE_NAME)
    self._holder = holder
    self._fd: Optional[int] = None

  @property
  def held(self) -> bool:
    return self._fd is not None

  def acquire(self) -> None:
    """Creates the directory if needed and takes the lock without waiting.

    Raises:
      RunLockError: another run (or this process) holds the lock.
      OSError: the directory or the lock file cannot be created.
    """
    if self._fd is not None:
      raise RuntimeError(f"{self.path} is already held by this object")
    os.makedirs(self.directory, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        os.close(fd)
        raise
      holder = self._read_holder(fd)
      os.close(fd)
      raise RunLockError(
          self.directory, holder, f"lock file {self.path}"
      ) from None
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, self._holder.to_bytes(), 0)
      os.fsync(fd)
    except OSError:
      os.close(fd)  # Closing the descriptor drops the lock.
      raise
    self._fd = fd

  @staticmethod
  def _read_holder(fd: int) -> Optional[Holder]:
    deadline = time.monotonic() + _HOLDER_READ_WAIT_S
    while True:
      holder = Holder.from_bytes(os.pread(fd, 4096, 0))
      if holder is not None or time.monotonic() > deadline:
        return holder
      time.sleep(0.02)

  def release(self) -> None:
    """Drops the lock; the file stays (removing it would race new holders)."""
    fd, self._fd = self._fd, None
    if fd is not None:
      os.close(fd)


def _is_precondition_failed(error: BaseException) -> bool:
  # Imported on first use: local runs never load the GCS client libraries.
  from google.api_core import exceptions  # pylint: disable=import-outside-toplevel

  return isinstance(error, exceptions.PreconditionFailed)


class RemoteLock:
  """The lock object `<prefix>/.run.lock` of a gs:// location.

  Thread-safe. `acquire` raises only for a lock another run holds; GCS
  trouble is logged and retried by the refresh thread.
  """

  def __init__(
      self,
      url: str,
      holder: Holder,
      *,
      refresh_interval_s: float,
      request_timeout_s: float,
      client_factory: Optional[Callable[[], Any]] = None,
      clock: Callable[[], float] = time.time,
  ):
    """Prepares the lock; nothing is sent until `acquire`.

    Args:
      url: the gs:// location to lock.
      holder: this run.
      refresh_interval_s: N: the lock object is rewritten every N seconds and
        counts as abandoned when older than 3N.
      request_timeout_s: the most one GCS request may take, retries included.
      client_factory: returns a `google.cloud.storage.Client`; defaults to
        `gcs_mirror.default_client_factory`.
      clock: the wall clock (seconds since the epoch), compared with the
        server's update time of a lock object.
    """
    bucket, prefix = gcs_mirror.parse_gs_url(url)
    self.url = url
    self._bucket_name = bucket
    self._object = f"{prefix}/{LOCK_FILE_NAME}" if prefix else LOCK_FILE_NAME
    self._holder = holder
    self._interval = refresh_interval_s
    self.refresh_interval_s = refresh_interval_s
    self._timeout = request_timeout_s
    self._client_factory = client_factory or gcs_mirror.default_client_factory
    self._clock = clock
    self._client = None
    self._mutex = threading.Lock()
    self._generation: Optional[int] = None
    # time.monotonic() of the newest write or read that showed the lock ours.
    self._confirmed_at: Optional[float] = None
    self._last_error: Optional[BaseException] = None
    self._lost: Optional[RunLockError] = None
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._failing = False

  @property
  def held(self) -> bool:
    """True while the bucket holds this run's lock object, as last seen."""
    with self._mutex:
      return self._generation is not None

  @property
  def lost(self) -> Optional[RunLockError]:
    """The error to raise when another run took this lock over, else None."""
    with self._mutex:
      return self._lost

  def check_confirmed(self, max_age_s: float) -> None:
    """Raises unless the lock was confirmed ours within `max_age_s`.

    A lock never taken (GCS unreachable at start) passes: nothing can be
    written to that bucket anyway, and the refresh thread takes it first.

    Raises:
      RunLockUnconfirmed: the last confirmation is older (e.g. the process
        was paused, or refreshes fail); caused by the refresh's error.
    """
    with self._mutex:
      confirmed_at, error = self._confirmed_at, self._last_error
    if confirmed_at is None:
      return
    age = time.monotonic() - confirmed_at
    if age > max_age_s:
      raise RunLockUnconfirmed(
          f"run lock {self.url} not confirmed for {age:.1f} s"
      ) from error

  def acquire(self) -> bool:
    """Takes the lock and starts refreshing it.

    Returns:
      True when the lock object is this run's; False when GCS could not be
      reached (warned; the refresh thread keeps trying).

    Raises:
      RunLockError: another run holds a lock younger than 3N.
    """
    try:
      self._take()
    except RunLockError:
      raise
    # Any failure to reach GCS leaves the run on its local lock; it retries.
    except Exception as e:  # pylint: disable=broad-exception-caught
      self._failing = True
      logging.warning(
          "Run lock %s: GCS could not be reached (%s: %s). The run goes on "
          "with its local lock only and keeps trying to take the remote "
          "lock every %.1f s.",
          self.url,
          type(e).__name__,
          _one_line(e),
          self._interval,
      )
    self._thread = threading.Thread(
        target=self._refresh_loop, daemon=True, name=f"run-lock-{self._object}"
    )
    self._thread.start()
    return self.held

  def release(self) -> None:
    """Stops refreshing and deletes the lock object if it is still ours.

    Never raises: a lock object left behind is taken over after 3N.
    """
    self._stop.set()
    if self._thread is not None:
      self._thread.join(self._timeout + 1.0)
    with self._mutex:
      generation, self._generation = self._generation, None
    if generation is None:
      return
    try:
      blob = self._bucket().get_blob(self._object, **self._request_args())
      # fake-gcs-server ignores preconditions on delete: read, then delete
      # conditionally, so a lock taken over meanwhile is never deleted.
      if blob is None or not self._ours(
          Holder.from_bytes(blob.download_as_bytes(**self._request_args()))
      ):
        return
      blob.delete(if_generation_match=blob.generation, **self._request_args())
    # Any failure to delete is only logged: a later run takes a stale lock.
    except Exception as e:  # pylint: disable=broad-exception-caught
      logging.warning(
          "Run lock %s: could not delete the lock object (%s: "
          "%s); the next run takes it over after %.1f s.",
          self.url,
          type(e).__name__,
          _one_line(e),
          3 * self._interval,
      )

  # --- GCS requests -----------------------------------------------------------

  def _request_args(self) -> dict[str, Any]:
    # The storage library's retry, bounded; gcs_mirror owns the policy.
    retry = gcs_mirror.bounded_retry(self._timeout)
    return dict(timeout=self._timeout, retry=retry)

  def _bucket(self):
    if self._client is None:
      self._client = self._client_factory()
    return self._client.bucket(self._bucket_name)

  def _write(self, if_generation_match: int) -> int:
    """Writes this run's holder; returns the new generation."""
    blob = self._bucket().blob(self._object)
    blob.upload_from_string(
        self._holder.to_bytes(),
        content_type="application/json",
        if_generation_match=if_generation_match,
        **self._request_args(),
    )
    return blob.generation

  def _ours(self, holder: Optional[Holder]) -> bool:
    return holder is not None and holder.run_id == self._holder.run_id

  def _read(self) -> Optional[tuple[int, Optional[Holder], float]]:
    """(generation, holder, age in seconds) of the lock object, or None.

    The age is the server's update time against `clock`, so the holder's
    clock does not matter; 3N leaves room for skew between the server and
    this host.
    """
    for _ in range(3):
      blob = self._bucket().get_blob(self._object, **self._request_args())
      if blob is None:
        return None
      try:
        data = blob.download_as_bytes(
            if_generation_match=blob.generation, **self._request_args()
        )
      except Exception as e:
        if _is_precondition_failed(e):
          continue  # Rewritten between the two requests: read again.
        raise
      updated = blob.updated.timestamp() if blob.updated else self._clock()
      return blob.generation, Holder.from_bytes(data), self._clock() - updated
    raise RunLockError(self.url, None, "the lock object kept changing")

  def _take(self) -> None:
    """Creates the lock object, or takes over an abandoned one.

    A retried create whose first try reached the server fails its
    precondition on our own object; the run id recognises it as ours.

    Raises:
      RunLockError: another run holds a fresh lock.
      Exception: GCS errors, after the bounded retries.
    """
    for _ in range(5):
      try:
        generation = self._write(if_generation_match=0)
      # The client raises many types; all but a failed precondition are
      # re-raised.
      except Exception as e:  # pylint: disable=broad-exception-caught
        if not _is_precondition_failed(e):
          raise
      else:
        self._set_generation(generation)
        return
      found = self._read()
      if found is None:
        continue  # Deleted meanwhile: create it again.
      generation, holder, age = found
      if self._ours(holder):
        self._set_generation(generation)
        return
      interval = max(
          self._interval, holder.refresh_interval_s if holder else 0.0
      )
      if age < 3 * interval:
        raise RunLockError(
            self.url, holder, f"lock object refreshed {max(age, 0.0):.1f} s ago"
        )
      try:
        taken = self._write(if_generation_match=generation)
      # The client raises many types; all but a failed precondition are
      # re-raised.
      except Exception as e:  # pylint: disable=broad-exception-caught
        if not _is_precondition_failed(e):
          raise
        continue  # Someone else wrote it first: look again.
      logging.warning(
          "Run lock %s: took over a lock abandoned %.1f s ago (more than 3 x "
          "%.1f s) by %s.",
          self.url,
          age,
          interval,
          holder.describe() if holder else "an unknown holder",
      )
      self._set_generation(taken)
      return
    raise RunLockError(self.url, None, "the lock object kept changing")

  def _set_generation(self, generation: int) -> None:
    with self._mutex:
      if not self._stop.is_set():
        self._generation = generation
        self._confirmed_at = time.monotonic()
        self._last_error = None

  # --- background thread ------------------------------------------------------

  def _refresh_loop(self) -> None:
    """The background thread: refreshes the lock object every interval."""
    while not self._stop.wait(self._interval):
      try:
        self._refresh_once()
      except RunLockError as e:
        with self._mutex:
          self._lost, self._generation = e, None
        logging.error(
            "Run lock %s was taken by another run; this run no "
            "longer owns the directory: %s",
            self.url,
            e,
        )
        return
      # The refresh thread outlives any failure: it logs it and retries.
      except Exception as e:  # pylint: disable=broad-exception-caught
        with self._mutex:
          self._last_error = e
        if not self._failing:
          logging.warning(
              "Run lock %s: refresh failed (%s: %s); retrying "
              "every %.1f s. Another run may take the lock over "
              "after %.1f s without a refresh.",
              self.url,
              type(e).__name__,
              _one_line(e),
              self._interval,
              3 * self._interval,
          )
        self._failing = True
      else:
        if self._failing:
          logging.info(
              "Run lock %s: GCS answers again; the lock is held.", self.url
          )
        self._failing = False

  def _refresh_once(self) -> None:
    """Rewrites our lock object, or takes the lock if we never got it.

    Raises:
      RunLockError: another run holds the lock now.
    """
    with self._mutex:
      generation = self._generation
    if generation is None:
      self._take()
      return
    try:
      self._set_generation(self._write(if_generation_match=generation))
      return
    # The client raises many types; all but a failed precondition are
    # re-raised.
    except Exception as e:  # pylint: disable=broad-exception-caught
      if not _is_precondition_failed(e):
        raise
    found = self._read()
    if found is not None and self._ours(found[1]):
      # Our own write, retried after a timeout, or our content copied back.
      self._set_generation(found[0])
      return
    if found is None:
      raise RunLockError(self.url, None, "the lock object was deleted")
    raise RunLockError(self.url, found[1], "the lock object was taken over")


class RunLocks:
  """The locks of one run; release them with `release()` or a `with` block."""

  def __init__(self, holder: Holder, locks: Sequence[Any]):
    self.holder = holder
    self._locks = list(locks)

  @property
  def local_locks(self) -> list[LocalLock]:
    return [lock for lock in self._locks if isinstance(lock, LocalLock)]

  @property
  def remote_locks(self) -> list[RemoteLock]:
    return [lock for lock in self._locks if isinstance(lock, RemoteLock)]

  def check(self) -> None:
    """Raises if another run took over a remote lock while this one ran.

    Raises:
      RunLockLost: the first remote lock lost to another run; it names the
        local directories that keep what this run holds.
    """
    for lock in self.remote_locks:
      lost = lock.lost
      if lost is not None:
        raise RunLockLost(
            lock.url, lost.holder, [l.directory for l in self.local_locks]
        ) from lost

  def fence(self) -> None:
    """`check`, and every held remote lock confirmed within 2N.

    The GCS mirror's fence: another run may take a lock over 3N after its
    last refresh, so a lock not confirmed for 2N (a paused process, failing
    refreshes) lets nothing be written until the refresh thread has looked.

    Raises:
      RunLockLost: as for `check`.
      RunLockUnconfirmed: a remote lock was not confirmed recently.
    """
    self.check()
    for lock in self.remote_locks:
      lock.check_confirmed(2 * lock.refresh_interval_s)

  def release(self) -> None:
    """Releases every lock, newest first; safe to call more than once."""
    while self._locks:
      self._locks.pop().release()

  def __enter__(self) -> "RunLocks":
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()


def acquire_run_locks(
    locations: Sequence[str],
    *,
    refresh_interval_s: float = 60.0,
    request_timeout_s: float = 20.0,
    client_factory: Optional[Callable[[], Any]] = None,
    clock: Callable[[], float] = time.time,
) -> RunLocks:
  """Locks every location of a run, all or nothing.

  Local directories are created if missing and locked first (cheap and
  certain), then gs:// locations. If any lock is refused, those already
  taken are released before the error propagates. Call it on one process
  only (process 0) and before any device work.

  Args:
    locations: local directories and gs:// URLs; duplicates are locked once.
    refresh_interval_s: N for remote locks: refreshed every N seconds, taken
      over by another run when older than 3N.
    request_timeout_s: the most one GCS request may take, retries included;
      it bounds how long an unreachable bucket delays the start.
    client_factory: returns a `google.cloud.storage.Client`; defaults to
      `gcs_mirror.default_client_factory`.
    clock: the wall clock, seconds since the epoch (tests move it).

  Returns:
    The held locks.

  Raises:
    RunLockError: a location is locked by another run (or this process).
    TypeError, ValueError: bad arguments (named in the message).
    OSError: a local directory or lock file cannot be created.
  """
  _check_locations(locations)
  refresh_interval_s = checks.check_number(
      "refresh_interval_s", refresh_interval_s, positive=True
  )
  request_timeout_s = checks.check_number(
      "request_timeout_s", request_timeout_s, positive=True
  )
  holder = Holder.for_this_process(refresh_interval_s)
  local, remote = _distinct_locations(locations)
  locks = RunLocks(holder, [])
  try:
    _take_locks(
        locks,
        local,
        remote,
        refresh_interval_s=refresh_interval_s,
        request_timeout_s=request_timeout_s,
        client_factory=client_factory,
        clock=clock,
    )
  except BaseException:
    locks.release()
    raise
  return locks


def _check_locations(locations: Sequence[str]) -> None:
  """Raises TypeError or ValueError unless `locations` is a non-empty
  sequence (not a str) of non-empty strs."""
  if isinstance(locations, str) or not isinstance(locations, Sequence):
    raise TypeError(f"locations must be a sequence of str, got {locations!r}")
  if not locations:
    raise ValueError("locations must name at least one directory")
  for location in locations:
    if not isinstance(location, str) or not location:
      raise TypeError(f"locations must hold non-empty str, got {location!r}")


def _distinct_locations(
    locations: Sequence[str],
) -> tuple[list[str], list[str]]:
  """The local directories (real paths) and the gs:// URLs (without a
  trailing "/") of `locations`, each once, in the order given.

  Raises:
    ValueError: a bad gs:// URL, before any lock is taken.
  """
  local, remote = [], []
  for location in locations:
    if gcs_mirror.is_gs_url(location):
      # A bad URL fails here, before any lock is taken.
      bucket, prefix = gcs_mirror.parse_gs_url(location)
      url = f"{gcs_mirror.GS_SCHEME}{bucket}/{prefix}".rstrip("/")
      if url not in remote:
        remote.append(url)
    else:
      path = os.path.realpath(location)
      if path not in local:
        local.append(path)
  return local, remote


def _take_locks(
    locks: RunLocks,
    local: Sequence[str],
    remote: Sequence[str],
    **remote_settings: Any,
) -> None:
  """Locks each local directory, then each gs:// URL, for `locks`' holder.

  Each lock joins `locks` as it is taken (a remote one just before, so that
  releasing `locks` also ends a remote lock whose taking failed half-way).

  Args:
    locks: the run's locks so far (empty), filled in place.
    local: the local directories to lock.
    remote: the gs:// URLs to lock.
    **remote_settings: `RemoteLock`'s keyword arguments.

  Raises:
    RunLockError: a location is locked by another run (or this process).
    OSError: a local directory or lock file cannot be created.
  """
  # RunLocks is filled here, in its own module, as each lock is taken.
  held = locks._locks  # pylint: disable=protected-access
  for path in local:
    lock = LocalLock(path, locks.holder)
    lock.acquire()
    held.append(lock)
  for url in remote:
    lock = RemoteLock(url, locks.holder, **remote_settings)
    held.append(lock)
    lock.acquire()
