"""A sandbox for tool calls: one scratch copy of a task's files, bubblewrap.

`Sandbox(files, limits)` copies the task's files into a fresh scratch
directory; `run(argv)` runs one command on them in a separate process:

* isolated with bubblewrap (`bwrap`, Debian's `bubblewrap`): every namespace
  unshared (no network: only a loopback that nothing listens on; its own PID
  namespace, IPC and hostname), all capabilities dropped, run as a user
  that owns nothing on the host (below), the system directories (`/usr`,
  `/etc` and the `/bin`, `/lib` links) bound read-only,
  or, given `root`, a task's own root filesystem (a directory, e.g. an
  exported container image) bound read-only as `/` instead of the host's
  system; the scratch bound writable at `workdir` (`/task` unless given; the
  working directory), a small private `/tmp`, and nothing else of the host's
  files;
* as an unprivileged user: a process that runs as root starts bubblewrap
  as `SANDBOX_UID`:`SANDBOX_GID` (nobody; the scratch is handed to that
  user), so even the host's root-only files under `/etc` (`/etc/shadow`)
  cannot be read, and bubblewrap's user namespace maps that user alone;
  a process that is not root runs it as itself (it owns nothing it may
  not read). Where unprivileged user namespaces are not allowed, or the
  caller is root in a user namespace without that uid (Bazel's
  linux-sandbox), `check_available` refuses in one line. A root filesystem
  the sandbox's user cannot reach (a directory above it not searchable by
  others) is refused in one line (`unreachable`);
* with a clean environment (`environment`): the command sees `PATH`,
  `HOME` (the workdir), `TMPDIR` (`/tmp`) and `LANG` (`C.UTF-8`), nothing
  of the training process's;
* under resource limits set before the command starts (the host's /bin/sh
  sets them with `ulimit`, then execs bubblewrap; kept across exec and
  fork): CPU seconds, address space, the largest file it may
  write (a larger write fails with EFBIG; SIGXFSZ is ignored so the write
  returns an error instead of killing the process);
* under a wall-clock timeout: at the timeout bubblewrap is killed, which
  kills the command's PID namespace whole (`--die-with-parent` on its init;
  when a namespace's init ends, the kernel kills every process in it, so a
  tool that forks or daemonizes leaves nothing behind).

The scratch starts as a copy of `source` (a host directory, e.g. the
repository inside a task's root filesystem), if given, with `files` written
over it. Output beyond `output_bytes` is cut. The scratch's growth past its
first size is bounded by `scratch_bytes` (every entry's size on disk,
directories included) and `scratch_entries` (files, directories and
links): measured every `watch_seconds` while a command runs (less often
when measuring a large scratch takes long: at most a tenth of the time) and
once more after it ends; a command that goes past either is killed as at a
timeout and its call gets an error result. (The scratch is a host
directory that outlives each command, for the episode's next command and
for the host's reads, so a size-limited file system of bubblewrap's, gone
when the command ends, cannot hold it.) What a command writes between two
measurements stays until the episode's sandbox is closed: at most one
interval of writing, each file at most `file_bytes`.

Run as the sandbox's user, a command is also bounded to `processes`
processes (RLIMIT_NPROC; it counts every process of that user
on the host, so it is not applied to a non-root caller's own uid, whose
training process holds many threads).

A call is bounded by its episode's time too: `run(argv, deadline=t)` gets
at most what is left until `t` (time.monotonic()), and nothing runs when
none is left.

The host reads and writes the scratch's files only through `read_file`,
`write_file` and `restore_file`: regular files only (a FIFO, a device or
a socket the tool made is refused, never opened blocking), never through a
symbolic link out of the scratch, reads capped at a size.

Where bubblewrap cannot run, `check_available` says so in one line; the run
refuses to start unless its config allows unisolated tools (trusted code
only): `Sandbox(..., isolated=False)` then runs commands as plain
subprocesses with the same limits and timeout in their own process group,
which is killed on a timeout; they see the network and the host's files.
"""

import dataclasses
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from typing import Mapping, Optional, Sequence

BWRAP = "bwrap"
# Where the scratch copy appears inside the sandbox.
TASK_DIR = "/task"
# The host's system directories the sandbox sees, read-only (those present).
SYSTEM_DIRS = ("/usr", "/etc")
SYSTEM_LINKS = ("/bin", "/lib", "/lib64", "/sbin")
# Who commands run as when the caller is root: nobody, who owns nothing.
SANDBOX_UID = 65534
SANDBOX_GID = 65534
# The directory scratch copies are made in when the caller is root and its
# own temporary directory is not reachable by the sandbox's user.
SHARED_TMP = "/tmp"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Why `Sandbox._watch` stops a command at its time limit.
_TIMED_OUT = "timed out"


def environment(home: str) -> dict[str, str]:
  """The whole environment a command sees (nothing of the caller's)."""
  return {"PATH": PATH, "HOME": home, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}


def _drops_privileges(isolated: bool) -> bool:
  """Whether commands run as SANDBOX_UID rather than the caller's uid."""
  return isolated and os.geteuid() == 0


class SandboxUnavailable(RuntimeError):
  """Bubblewrap cannot run here (one line saying why)."""


class FileRefused(Exception):
  """A scratch file the host will not read or write (one line: the path
  as the tool named it, and why)."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one command may use.

  Attributes:
    wall_seconds: the command is killed (with its PID namespace) after this.
    cpu_seconds: CPU time per process (RLIMIT_CPU).
    memory_bytes: address space per process (RLIMIT_AS).
    file_bytes: the largest file a process may write (RLIMIT_FSIZE).
    scratch_bytes: how much the scratch directory may grow past its first
      size on disk (measured while a command runs and after it).
    scratch_entries: how many files, directories and links may be added
      to the scratch (measured as scratch_bytes).
    tmp_bytes: the size of the sandbox's private /tmp.
    output_bytes: stdout and stderr kept, each.
    processes: processes of the sandbox's user (RLIMIT_NPROC), when
      commands run as SANDBOX_UID.
    read_bytes: the largest scratch file the host reads for a tool.
    watch_seconds: how often the scratch is measured while a command runs.
  """

  wall_seconds: float = 30.0
  cpu_seconds: int = 30
  memory_bytes: int = 2 << 30
  file_bytes: int = 16 << 20
  scratch_bytes: int = 64 << 20
  scratch_entries: int = 20000
  tmp_bytes: int = 16 << 20
  output_bytes: int = 16 << 10
  processes: int = 512
  read_bytes: int = 4 << 20
  watch_seconds: float = 0.25

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not value > 0:
        raise ValueError(f"sandbox limit {field.name}={value!r}: must be > 0")


@dataclasses.dataclass(frozen=True)
class Result:
  """One command's outcome.

  Attributes:
    returncode: its exit status (negative: killed by that signal); None
      when it timed out.
    stdout, stderr: its output (text, cut at the limit).
    timed_out: it ran past `wall_seconds` and was killed.
    error: a one-line reason the call failed outside the command's own
      exit status (timeout, scratch over its size), else "".
  """

  returncode: Optional[int]
  stdout: str
  stderr: str
  timed_out: bool = False
  error: str = ""

  @property
  def ok(self) -> bool:
    """It ended by itself, with status 0, and broke no limit."""
    return self.returncode == 0 and not self.error


def _root_entries(root: str) -> list[str]:
  """bubblewrap's arguments that show the directory `root` as `/`, read-only.

  Each top-level entry is bound (or, for a symbolic link, made) on
  bubblewrap's own root, which is then made read-only: binding `root`
  itself at `/` would need `/proc`, `/dev`, `/tmp` and the working
  directory to exist in it already, as mount points bubblewrap cannot
  create on a read-only tree.
  """
  argv = []
  for name in sorted(os.listdir(root)):
    path, target = os.path.join(root, name), "/" + name
    if name in ("proc", "dev", "tmp"):
      continue  # The sandbox's own, below.
    if os.path.islink(path):
      argv += ["--symlink", os.readlink(path), target]
    elif os.path.isdir(path):
      argv += ["--ro-bind", path, target]
    elif os.path.isfile(path):
      argv += ["--ro-bind", path, target]
  return argv


def _bwrap_command(
    scratch: str,
    limits: Limits,
    root: Optional[str] = None,
    workdir: str = TASK_DIR,
) -> list[str]:
  """bubblewrap's argv up to the command (module docstring)."""
  argv = [
      BWRAP,
      "--unshare-all",
      "--die-with-parent",
      "--new-session",
      "--cap-drop",
      "ALL",
  ]
  if root is not None:
    argv += _root_entries(root)
  else:
    for path in SYSTEM_DIRS:
      if os.path.isdir(path):
        argv += ["--ro-bind", path, path]
    for path in SYSTEM_LINKS:
      if os.path.islink(path):
        argv += ["--symlink", os.readlink(path), path]
      elif os.path.isdir(path):
        argv += ["--ro-bind", path, path]
  argv += [
      "--proc", "/proc",
      "--dev", "/dev",
      "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
      "--bind", scratch, workdir,
  ]  # fmt: skip
  if root is not None:
    # bubblewrap's own root (a tmpfs holding the mount points) read-only.
    argv += ["--remount-ro", "/"]
  argv += ["--chdir", workdir, "--"]
  return argv


def check_available() -> None:
  """Raises SandboxUnavailable (one line) unless bubblewrap runs here, as
  the user and with the namespaces commands get."""
  if shutil.which(BWRAP) is None:
    raise SandboxUnavailable(
        f"{BWRAP} (Debian's bubblewrap) is not installed: tools cannot run "
        "isolated (apt-get install bubblewrap)"
    )
  if _drops_privileges(True) and not _uid_mapped(SANDBOX_UID):
    raise SandboxUnavailable(
        f"running as root in a user namespace without uid {SANDBOX_UID} "
        "(/proc/self/uid_map): tools cannot run as a user that owns "
        "nothing on the host"
    )
  with Sandbox({}, Limits(wall_seconds=30)) as box:
    probe = box.run(["/bin/true"])
  if not probe.ok:
    reason = (probe.error or probe.stderr).strip().splitlines()
    raise SandboxUnavailable(
        f"{BWRAP} cannot make a sandbox here (as uid "
        f"{SANDBOX_UID if _drops_privileges(True) else os.geteuid()}, in a "
        "user namespace): "
        f"{reason[0] if reason else f'exit status {probe.returncode}'}"
    )


def _uid_mapped(uid: int) -> bool:
  """Whether this process's user namespace has `uid`."""
  try:
    with open("/proc/self/uid_map", encoding="ascii") as f:
      ranges = [tuple(map(int, line.split())) for line in f if line.strip()]
  except OSError:
    return True  # No user namespaces here: every uid exists.
  return any(inner <= uid < inner + count for inner, _, count in ranges)


def _tree_usage(root: str) -> tuple[int, int]:
  """(bytes on disk, entries) of everything below `root`: files,
  directories and links, each counted at the larger of its size and its
  allocated blocks, so empty directories and sparse files count too."""
  total, entries = 0, 0
  for directory, dirs, names in os.walk(root):
    for name in dirs + names:
      try:
        info = os.lstat(os.path.join(directory, name))
      except OSError:
        continue  # Gone between the listing and the stat.
      entries += 1
      total += max(info.st_size, info.st_blocks * 512)
  return total, entries


def unreachable(path: str) -> str:
  """Why the sandbox's user cannot reach the directory `path` (a
  directory on the way that others may not search), or "": always "" when
  commands run as the caller."""
  if not _drops_privileges(True):
    return ""
  path = os.path.realpath(path)
  while True:
    if not os.stat(path).st_mode & stat.S_IXOTH:
      return (
          f"{path} is not searchable by others, so the sandbox's user "
          f"(uid {SANDBOX_UID}) cannot reach it"
      )
    if path == "/":
      return ""
    path = os.path.dirname(path)


def scratch_parent() -> str:
  """Where scratch copies are made: the caller's temporary directory, or
  SHARED_TMP when the sandbox's user could not reach it (root's own
  temporary directories are often under /root)."""
  temporary = tempfile.gettempdir()
  return SHARED_TMP if unreachable(temporary) else temporary


def _hand_over(path: str) -> None:
  """Gives `path` (not following a link) to the sandbox's user."""
  os.chown(path, SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)


def inside(root: str, relative: str, workdir: str = TASK_DIR) -> Optional[str]:
  """The host path of `relative` under `root`, or None when it resolves
  (through `..` or a symbolic link) outside `root`. An absolute path is
  read as seen inside the sandbox, where `root` is `workdir`."""
  if "\0" in relative:
    return None  # No file's name holds a NUL byte.
  if os.path.isabs(relative):
    relative = os.path.relpath(relative, workdir)
  real_root = os.path.realpath(root)
  path = os.path.realpath(os.path.join(real_root, relative))
  if path != real_root and not path.startswith(real_root + os.sep):
    return None
  return path


class Sandbox:
  """One episode's scratch directory and the commands run on it.

  Args:
    files: relative path -> text: the task's files, written into the
      scratch (over `source`'s).
    limits: what each command may use.
    isolated: run commands under bubblewrap; False runs them as plain
      subprocesses (trusted tools only).
    root: a directory shown as `/` inside the sandbox, read-only (a task's
      own root filesystem); None: the host's system directories.
    workdir: where the scratch appears inside the sandbox (absolute).
    source: a host directory copied into the scratch first (symbolic links
      kept as links).

  Raises:
    ValueError: one line: a file outside the scratch, a root or source
      that is not a directory, a root without isolation or that the
      sandbox's user cannot reach, a workdir that is not absolute.
  """

  def __init__(
      self,
      files: Mapping[str, str],
      limits: Limits = Limits(),
      isolated: bool = True,
      root: Optional[str] = None,
      workdir: str = TASK_DIR,
      source: Optional[str] = None,
  ):
    if not os.path.isabs(workdir) or os.path.normpath(workdir) == "/":
      raise ValueError(
          f"sandbox workdir {workdir!r}: must be an absolute path below /"
      )
    if root is not None and not isolated:
      raise ValueError(
          f"sandbox root {root!r}: a root filesystem needs bubblewrap "
          "(unisolated tools run on the host's own)"
      )
    for name, directory in (("root", root), ("source", source)):
      if directory is not None and not os.path.isdir(directory):
        raise ValueError(f"sandbox {name} {directory!r}: not a directory")
    if root is not None and unreachable(root):
      raise ValueError(f"sandbox root {root!r}: {unreachable(root)}")
    self.limits = limits
    self.isolated = isolated
    self.root = root
    self.workdir = os.path.normpath(workdir)
    self._privileged = _drops_privileges(isolated)
    self.scratch = tempfile.mkdtemp(
        prefix="maxtext_sandbox_", dir=scratch_parent()
    )
    try:
      if source is not None:
        shutil.copytree(source, self.scratch, symlinks=True, dirs_exist_ok=True)
      for relative, text in files.items():
        path = self.path(relative)
        if path is None or path == os.path.realpath(self.scratch):
          raise ValueError(f"task file {relative!r}: not a path in the task")
        self._make_parents(path)
        with open(path, "w", encoding="utf-8") as f:
          f.write(text)
      if self._privileged:
        _hand_over(self.scratch)
        for directory, dirs, names in os.walk(self.scratch):
          for name in dirs + names:
            _hand_over(os.path.join(directory, name))
      self._first_usage = _tree_usage(self.scratch)
    except BaseException:
      self.close()
      raise

  def path(self, relative: str) -> Optional[str]:
    """The host path of a task file (relative, or absolute as seen inside
    the sandbox), None outside the scratch."""
    return inside(self.scratch, relative, self.workdir)

  def _make_parents(self, path: str) -> None:
    """Makes the missing directories above `path` (inside the scratch),
    owned by the sandbox's user when commands run as it."""
    missing = []
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
      missing.append(parent)
      parent = os.path.dirname(parent)
    for directory in reversed(missing):
      os.mkdir(directory)
      if self._privileged:
        _hand_over(directory)

  def _limited(self, command: list[str]) -> list[str]:
    """`command` run by a shell that first sets its limits, then execs it.

    The limits (and SIGXFSZ ignored) are kept across exec and fork, so they
    bind the command and everything it starts. They are set by /bin/sh in
    the child rather than by Python code between fork and exec: the
    calling process runs threads (JAX's, the episodes'), and Python run in
    a forked copy of a threaded process can deadlock (JAX warns at each
    such fork); with nothing to run there, the child is spawned directly
    (the user change, too, is made by the spawning C code).
    `ulimit -f` counts 512-byte blocks, `-v` KiB, `-p` processes (dash).
    """
    limits = self.limits
    script = (
        f"ulimit -t {limits.cpu_seconds} && "
        f"ulimit -v {max(1, limits.memory_bytes // 1024)} && "
        f"ulimit -f {max(1, limits.file_bytes // 512)} && "
        + (f"ulimit -p {limits.processes} && " if self._privileged else "")
        + "ulimit -c 0 && trap '' XFSZ && exec \"$@\""
    )
    return ["/bin/sh", "-c", script, "sh"] + command

  def _timeout(
      self, timeout_seconds: Optional[float], deadline: Optional[float]
  ) -> tuple[float, str]:
    """(the call's wall-clock limit, what sets it: "" its own or the
    episode's)."""
    timeout = (
        self.limits.wall_seconds if timeout_seconds is None else timeout_seconds
    )
    if deadline is not None and deadline - time.monotonic() < timeout:
      return max(0.0, deadline - time.monotonic()), "episode"
    return timeout, ""

  def run(
      self,
      argv: Sequence[str],
      timeout_seconds: Optional[float] = None,
      deadline: Optional[float] = None,
  ) -> Result:
    """Runs `argv` in the scratch (the workdir inside the sandbox).

    Args:
      argv: the command (a program the sandbox's /usr has, e.g.
        /usr/bin/python3).
      timeout_seconds: the wall-clock limit; None = limits.wall_seconds.
      deadline: the time.monotonic() by which its episode ends: the call
        gets no more than what is left (nothing runs when none is).

    Returns:
      The Result; a timeout, a broken limit (a scratch grown past its
      limit stops the command while it runs) or a command that cannot
      start (a NUL byte, text the OS cannot encode, past the OS's argument
      limit) is a Result, never an exception.
    """
    timeout, bound = self._timeout(timeout_seconds, deadline)
    if bound and timeout <= 0:
      return Result(
          None,
          "",
          "",
          True,
          "the episode's time is up: the command did not run",
      )
    command = list(argv)
    if self.isolated:
      command = (
          _bwrap_command(self.scratch, self.limits, self.root, self.workdir)
          + command
      )
    # The output goes to files outside the scratch, so a command printing
    # without end cannot fill memory; the file-size limit bounds them.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
      try:
        returncode, stopped = self._spawn(command, timeout, out, err)
      except (OSError, ValueError) as e:
        # ValueError: a NUL byte or text the file system encoding rejects;
        # OSError: E2BIG past the argument limit, among others.
        return Result(None, "", "", False, f"the command cannot start: {e}")
      stdout, stderr = (self._read(f) for f in (out, err))
    timed_out = stopped == _TIMED_OUT
    if timed_out:
      error = self._broken_limit(timeout, bound)
    elif stopped:
      error = f"{stopped}: the command was killed while it ran"
    else:
      error = self._grown()
    return Result(
        None if timed_out else returncode, stdout, stderr, timed_out, error
    )

  def _spawn(self, command, timeout, out, err) -> tuple[int, str]:
    """Runs `command` to its end, its timeout or a scratch grown past its
    limit: (status, why it was killed: "", _TIMED_OUT or the limit)."""
    drop = (
        {"user": SANDBOX_UID, "group": SANDBOX_GID, "extra_groups": []}
        if self._privileged
        else {}
    )
    home = self.workdir if self.isolated else self.scratch
    # The process is waited for below.
    # pylint: disable-next=consider-using-with
    process = subprocess.Popen(
        self._limited(command),
        cwd=self.scratch,
        env=environment(home),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        start_new_session=True,
        **drop,
    )
    stopped = self._watch(process, time.monotonic() + timeout)
    if stopped:
      # The whole process group: bwrap (whose death kills the PID
      # namespace), or the unisolated command and its children.
      try:
        os.killpg(process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass  # It ended on its own meanwhile.
    process.wait()
    return process.returncode, stopped

  def _watch(self, process: subprocess.Popen, deadline: float) -> str:
    """Waits for `process` until `deadline` (time.monotonic()), measuring
    the scratch meanwhile: "" when it ended, else why it must be killed
    (_TIMED_OUT, or the scratch limit it broke)."""
    interval = self.limits.watch_seconds
    while True:
      left = deadline - time.monotonic()
      if left <= 0:
        return _TIMED_OUT
      try:
        process.wait(timeout=min(interval, left))
        return ""
      except subprocess.TimeoutExpired:
        pass
      started = time.monotonic()
      grown = self._grown()
      if grown:
        return grown
      # Measuring takes at most a tenth of the command's time.
      interval = max(
          self.limits.watch_seconds, 10 * (time.monotonic() - started)
      )

  @staticmethod
  def _broken_limit(timeout: float, bound: str) -> str:
    if bound:
      return (
          f"the episode's time ran out ({timeout:.3g} s were left): the "
          "command was killed"
      )
    return f"the command ran past its {timeout:g} s limit and was killed"

  def _grown(self) -> str:
    """The scratch limit the command broke, or ""."""
    size, entries = _tree_usage(self.scratch)
    first_size, first_entries = self._first_usage
    if size - first_size > self.limits.scratch_bytes:
      return (
          f"the task's files grew by more than {self.limits.scratch_bytes} "
          "bytes (the scratch limit)"
      )
    if entries - first_entries > self.limits.scratch_entries:
      return (
          f"the task's files grew by more than {self.limits.scratch_entries} "
          "entries (the scratch limit)"
      )
    return ""

  def _read(self, f) -> str:
    f.seek(0)
    data = f.read(self.limits.output_bytes + 1)
    text = data[: self.limits.output_bytes].decode(errors="replace")
    if len(data) > self.limits.output_bytes:
      text += "\n[output cut]"
    return text

  def _open(self, path: Optional[str], flags: int, shown: str) -> int:
    """A descriptor of the scratch's regular file at host `path`
    (`shown`: the path as the tool named it).

    Raises:
      FileRefused: outside the scratch (None), not there, not a regular
        file (never opened blocking: O_NONBLOCK), or a link at the last
        step.
    """
    if path is None:
      raise FileRefused(f"{shown}: outside the task's files")
    try:
      fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
      raise FileRefused(f"{shown}: no such file") from None
    except (OSError, ValueError) as e:
      raise FileRefused(f"{shown}: cannot be opened: {e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
      os.close(fd)
      raise FileRefused(f"{shown}: not a regular file")
    return fd

  def read_file(self, relative: str) -> bytes:
    """A scratch file's bytes for a tool or the verifier.

    Raises:
      FileRefused: as `_open`, or larger than limits.read_bytes.
    """
    fd = self._open(self.path(relative), os.O_RDONLY, relative)
    with os.fdopen(fd, "rb") as f:
      data = f.read(self.limits.read_bytes + 1)
    if len(data) > self.limits.read_bytes:
      raise FileRefused(
          f"{relative}: larger than {self.limits.read_bytes} bytes"
      )
    return data

  def write_file(self, relative: str, data: bytes, create: bool = False):
    """Writes a scratch file (made, with its directories, when missing;
    given to the sandbox's user).

    Args:
      relative: the path (relative, or absolute as seen inside).
      data: its new bytes.
      create: the file must not exist yet.

    Raises:
      FileRefused: as `_open`; an existing file when `create`.
    """
    self._write(self.path(relative), data, create, relative)

  def _write(self, path: Optional[str], data: bytes, create: bool, shown):
    """`write_file` at host `path` (None: outside the scratch)."""
    if path is None:
      raise FileRefused(f"{shown}: outside the task's files")
    if create and os.path.lexists(path):
      raise FileRefused(f"{shown}: already exists")
    try:
      self._make_parents(path)
    except (OSError, ValueError) as e:
      raise FileRefused(f"{shown}: its directory cannot be made: {e}") from None
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if create else 0)
    fd = self._open(path, flags, shown)
    with os.fdopen(fd, "wb") as f:
      if self._privileged:
        os.fchown(f.fileno(), SANDBOX_UID, SANDBOX_GID)
      f.truncate(0)
      f.write(data)

  def restore_file(self, relative: str, data: bytes) -> str:
    """Writes a file the verifier needs over whatever the tools left at
    its path (a file, a link, a FIFO): "" when written, else why not (a
    directory there, or a directory on its path that leads out of the
    scratch)."""
    parent = self.path(os.path.dirname(relative) or ".")
    if parent is None:
      return f"{relative}: a directory on its path leads out of the task"
    target = os.path.join(parent, os.path.basename(relative))
    if os.path.isdir(target) and not os.path.islink(target):
      return f"{relative}: a directory is there"
    try:
      if os.path.lexists(target):
        os.unlink(target)
      self._write(target, data, False, relative)
    except OSError as e:
      return f"{relative}: cannot be replaced: {e.strerror}"
    except FileRefused as e:
      return str(e)
    return ""

  def close(self) -> None:
    """Deletes the scratch directory."""
    shutil.rmtree(self.scratch, ignore_errors=True)

  def __enter__(self) -> "Sandbox":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
