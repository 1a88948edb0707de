"""A real full disk for tests: a small tmpfs in a user and mount namespace.

`command(mount_point, size, argv)` gives the command line that mounts a tmpfs
of `size` at `mount_point` and runs `argv` with it there. The mount lives in a
new user and mount namespace (`unshare -Urm`), so no root is needed where the
kernel allows unprivileged namespaces, and nothing outside the command sees
it: other processes keep seeing the (empty) directory underneath. The
namespace, and the tmpfs with it, ends with the command; `copy_to` copies what
the command left on the tmpfs out first, so a test can inspect it.

Writes past `size` fail with a real ENOSPC ("No space left on device").
`RLIMIT_FSIZE` would give EFBIG, and `/dev/full` fails a single file only.

    self.assertTrue(tmpfs.available(), "needs `unshare -Urm` and tmpfs")
    subprocess.run(tmpfs.command(mount, "64k", [sys.executable, ...],
                                 copy_to=out), ...)
"""

import functools
import subprocess
from typing import Optional, Sequence

# Exit status of the command line when the mount itself failed.
MOUNT_FAILED = 97

# $1 mount point, $2 size, $3 directory to copy the tmpfs to ("" for none),
# then the command. The command's stdin is /dev/null: a test talks to it
# through files, and a shell that waits for it owns the terminal.
_SCRIPT = """
mount -t tmpfs -o size="$2" tmpfs "$1" || exit %d
mount_point=$1; copy_to=$3; shift 3
"$@" </dev/null
status=$?
if [ -n "$copy_to" ]; then cp -a "$mount_point/." "$copy_to/"; fi
exit $status
""" % MOUNT_FAILED


@functools.cache
def available() -> bool:
  """Whether this machine lets a process mount a tmpfs in a new namespace."""
  try:
    return (
        subprocess.run(
            [
                "unshare",
                "-Urm",
                "sh",
                "-c",
                "mount -t tmpfs -o size=64k tmpfs /mnt",
            ],
            capture_output=True,
            check=False,
            timeout=60,
        ).returncode
        == 0
    )
  except (OSError, subprocess.TimeoutExpired):
    return False


def command(
    mount_point: str,
    size: str,
    argv: Sequence[str],
    *,
    copy_to: Optional[str] = None,
) -> list[str]:
  """The command line that runs `argv` with a `size` tmpfs at `mount_point`.

  Args:
    mount_point: an existing directory; the tmpfs covers it for `argv` only.
    size: the tmpfs size as `mount` takes it ("1M", "64k"); tmpfs counts
      whole pages, so each non-empty file takes at least one page.
    argv: the command to run, program first.
    copy_to: an existing directory outside `mount_point` to copy the tmpfs's
      contents into once `argv` exits (the tmpfs vanishes then), or None.

  Returns:
    The command line. Its exit status is `argv`'s, or `MOUNT_FAILED` when
    the tmpfs could not be mounted.

  Raises:
    ValueError: `argv` is empty or `size` is empty.
  """
  if not argv:
    raise ValueError("argv must name a program, got []")
  if not size:
    raise ValueError(f"size must be a tmpfs size such as '64k', got {size!r}")
  return [
      "unshare",
      "-Urm",
      "sh",
      "-c",
      _SCRIPT,
      "sh",
      mount_point,
      size,
      copy_to or "",
      *argv,
  ]
