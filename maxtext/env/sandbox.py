"""A sandbox for tool calls: one scratch copy of a task's files, bubblewrap.

`Sandbox(files, limits)` copies the task's files into a fresh scratch
directory; `run(argv)` runs one command on them in a separate process:

* isolated with bubblewrap (`bwrap`, Debian's `bubblewrap`): every namespace
  unshared (no network: only a loopback that nothing listens on; its own PID
  namespace, IPC and hostname), all capabilities dropped, the system
  directories (`/usr`, `/etc` and the `/bin`, `/lib` links) bound read-only,
  or, given `root`, a task's own root filesystem (a directory, e.g. an
  exported container image) bound read-only as `/` instead of the host's
  system; the scratch bound writable at `workdir` (`/task` unless given; the
  working directory), a small private `/tmp`, and nothing else of the host's
  files;
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
over it. Output beyond `output_bytes` is cut. After each command the
scratch's growth past its first size is checked against `scratch_bytes`; a
tool that went past it gets an error result. A process-count limit does
not bind root (and these machines run as root), so forks are bounded by the
CPU limit and the wall-clock timeout, not by a count.

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
import subprocess
import tempfile
from typing import Mapping, Optional, Sequence

BWRAP = "bwrap"
# Where the scratch copy appears inside the sandbox.
TASK_DIR = "/task"
# The host's system directories the sandbox sees, read-only (those present).
SYSTEM_DIRS = ("/usr", "/etc")
SYSTEM_LINKS = ("/bin", "/lib", "/lib64", "/sbin")


class SandboxUnavailable(RuntimeError):
  """Bubblewrap cannot run here (one line saying why)."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one command may use.

  Attributes:
    wall_seconds: the command is killed (with its PID namespace) after this.
    cpu_seconds: CPU time per process (RLIMIT_CPU).
    memory_bytes: address space per process (RLIMIT_AS).
    file_bytes: the largest file a process may write (RLIMIT_FSIZE).
    scratch_bytes: how much the scratch directory may grow past its first
      size (checked after each command).
    tmp_bytes: the size of the sandbox's private /tmp.
    output_bytes: stdout and stderr kept, each.
  """

  wall_seconds: float = 30.0
  cpu_seconds: int = 30
  memory_bytes: int = 2 << 30
  file_bytes: int = 16 << 20
  scratch_bytes: int = 64 << 20
  tmp_bytes: int = 16 << 20
  output_bytes: int = 16 << 10

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
  argv += [
      "--chdir", workdir,
      "--setenv", "HOME", workdir,
      "--setenv", "TMPDIR", "/tmp",
      "--setenv", "PATH",
      "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "--",
  ]  # fmt: skip
  return argv


def check_available() -> None:
  """Raises SandboxUnavailable (one line) unless bubblewrap runs here."""
  if shutil.which(BWRAP) is None:
    raise SandboxUnavailable(
        f"{BWRAP} (Debian's bubblewrap) is not installed: tools cannot run "
        "isolated (apt-get install bubblewrap)"
    )
  with tempfile.TemporaryDirectory() as scratch:
    try:
      probe = subprocess.run(
          _bwrap_command(scratch, Limits()) + ["/bin/true"],
          capture_output=True,
          timeout=30,
          check=False,
      )
    except (OSError, subprocess.TimeoutExpired) as e:
      raise SandboxUnavailable(f"{BWRAP} does not start: {e}") from None
  if probe.returncode != 0:
    reason = probe.stderr.decode(errors="replace").strip().splitlines()
    raise SandboxUnavailable(
        f"{BWRAP} cannot make a sandbox here: "
        f"{reason[0] if reason else f'exit status {probe.returncode}'}"
    )


def _tree_bytes(root: str) -> int:
  total = 0
  for directory, _, names in os.walk(root):
    for name in names:
      try:
        total += os.lstat(os.path.join(directory, name)).st_size
      except OSError:
        pass  # Gone between the listing and the stat.
  return total


def inside(root: str, relative: str, workdir: str = TASK_DIR) -> Optional[str]:
  """The host path of `relative` under `root`, or None when it resolves
  (through `..` or a symbolic link) outside `root`. An absolute path is
  read as seen inside the sandbox, where `root` is `workdir`."""
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
      that is not a directory, a root without isolation, a workdir that is
      not absolute.
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
    self.limits = limits
    self.isolated = isolated
    self.root = root
    self.workdir = os.path.normpath(workdir)
    self.scratch = tempfile.mkdtemp(prefix="maxtext_sandbox_")
    try:
      if source is not None:
        shutil.copytree(source, self.scratch, symlinks=True, dirs_exist_ok=True)
      for relative, text in files.items():
        path = self.path(relative)
        if path is None or path == os.path.realpath(self.scratch):
          raise ValueError(f"task file {relative!r}: not a path in the task")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
          f.write(text)
      self._first_bytes = _tree_bytes(self.scratch)
    except BaseException:
      self.close()
      raise

  def path(self, relative: str) -> Optional[str]:
    """The host path of a task file (relative, or absolute as seen inside
    the sandbox), None outside the scratch."""
    return inside(self.scratch, relative, self.workdir)

  def _limited(self, command: list[str]) -> list[str]:
    """`command` run by a shell that first sets its limits, then execs it.

    The limits (and SIGXFSZ ignored) are kept across exec and fork, so they
    bind the command and everything it starts. They are set by /bin/sh in
    the child rather than by Python code between fork and exec: the
    calling process runs threads (JAX's, the episodes'), and Python run in
    a forked copy of a threaded process can deadlock (JAX warns at each
    such fork); with nothing to run there, the child is spawned directly.
    `ulimit -f` counts 512-byte blocks, `-v` KiB (POSIX sh).
    """
    limits = self.limits
    script = (
        f"ulimit -t {limits.cpu_seconds} && "
        f"ulimit -v {max(1, limits.memory_bytes // 1024)} && "
        f"ulimit -f {max(1, limits.file_bytes // 512)} && "
        "ulimit -c 0 && trap '' XFSZ && exec \"$@\""
    )
    return ["/bin/sh", "-c", script, "sh"] + command

  def run(
      self, argv: Sequence[str], timeout_seconds: Optional[float] = None
  ) -> Result:
    """Runs `argv` in the scratch (the workdir inside the sandbox).

    Args:
      argv: the command (a program the sandbox's /usr has, e.g.
        /usr/bin/python3).
      timeout_seconds: the wall-clock limit; None = limits.wall_seconds.

    Returns:
      The Result; a timeout or a broken limit is a Result, never an
      exception.
    """
    timeout = (
        self.limits.wall_seconds
        if timeout_seconds is None
        else (timeout_seconds)
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
      # The process is waited for below.
      # pylint: disable-next=consider-using-with
      process = subprocess.Popen(
          self._limited(command),
          cwd=self.scratch,
          stdin=subprocess.DEVNULL,
          stdout=out,
          stderr=err,
          start_new_session=True,
      )
      timed_out = False
      try:
        process.wait(timeout=timeout)
      except subprocess.TimeoutExpired:
        timed_out = True
        # The whole process group: bwrap (whose death kills the PID
        # namespace), or the unisolated command and its children.
        try:
          os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass  # It ended on its own meanwhile.
        process.wait()
      stdout, stderr = (self._read(f) for f in (out, err))
    error = ""
    if timed_out:
      error = f"the command ran past its {timeout:g} s limit and was killed"
    elif (
        _tree_bytes(self.scratch) - self._first_bytes
        > self.limits.scratch_bytes
    ):
      error = (
          f"the task's files grew by more than {self.limits.scratch_bytes} "
          "bytes (the scratch limit)"
      )
    return Result(
        None if timed_out else process.returncode,
        stdout,
        stderr,
        timed_out,
        error,
    )

  def _read(self, f) -> str:
    f.seek(0)
    data = f.read(self.limits.output_bytes + 1)
    text = data[: self.limits.output_bytes].decode(errors="replace")
    if len(data) > self.limits.output_bytes:
      text += "\n[output cut]"
    return text

  def close(self) -> None:
    """Deletes the scratch directory."""
    shutil.rmtree(self.scratch, ignore_errors=True)

  def __enter__(self) -> "Sandbox":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
