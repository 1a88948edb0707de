"""A tiny root filesystem for tests: a few of the host's programs, copied.

`make(directory)` lays out a merged-/usr root filesystem (the layout of a
Debian image: `/bin`, `/lib`, `/lib64`, `/sbin` links into `/usr`) holding
copies of the host programs named (`PROGRAMS` by default), each with the
shared libraries `ldd` lists, at the paths the dynamic loader looks them up
at, empty `/proc`, `/dev`, `/tmp` and an `/etc/os-release` naming it. It
is what an exported container image is, minus everything a test does not
run: the sandbox binds it as `/` like a real one.
"""

import os
import shutil
import subprocess
from typing import Sequence

PROGRAMS = ("bash", "sh", "cat", "grep", "ls", "mkdir")
OS_RELEASE = 'NAME="maxtext tiny rootfs"\n'


def _libraries(program: str) -> list[str]:
  """The absolute paths of `program`'s shared libraries and loader."""
  out = subprocess.run(
      ["ldd", program], capture_output=True, text=True, check=True
  ).stdout
  return sorted({word for word in out.split() if word.startswith("/")})


def _copy(host_path: str, root: str) -> None:
  """Copies a host file to its path under `root` (/lib* through /usr)."""
  relative = host_path.lstrip("/")
  top = relative.split("/", 1)[0]
  if top in ("bin", "lib", "lib64", "sbin"):
    relative = os.path.join("usr", relative)
  target = os.path.join(root, relative)
  os.makedirs(os.path.dirname(target), exist_ok=True)
  shutil.copy2(host_path, target)  # Follows links: the file itself.


def make(directory: str, programs: Sequence[str] = PROGRAMS) -> str:
  """Writes the root filesystem into `directory` (made) and returns it.

  Raises:
    FileNotFoundError: a program is not on the host's PATH.
  """
  for name in ("bin", "lib", "sbin", "lib64"):
    os.makedirs(os.path.join(directory, "usr", name), exist_ok=True)
    os.symlink(f"usr/{name}", os.path.join(directory, name))
  for name in ("etc", "proc", "dev", "tmp"):
    os.makedirs(os.path.join(directory, name), exist_ok=True)
  with open(
      os.path.join(directory, "etc", "os-release"), "w", encoding="utf-8"
  ) as f:
    f.write(OS_RELEASE)
  for name in programs:
    found = shutil.which(name)
    if found is None:
      raise FileNotFoundError(f"{name}: not on the host's PATH")
    host = os.path.realpath(found)
    shutil.copy2(host, os.path.join(directory, "usr", "bin", name))
    for library in _libraries(host):
      _copy(library, directory)
  return directory
