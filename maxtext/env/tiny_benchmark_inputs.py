"""Tiny inputs in the benchmark's formats: a curriculum, a validation set and
one root filesystem per task, for `benchmark_task` on the CPU.

Each task's image is `tiny_rootfs` (bash and a few programs copied from the
host) with a repository at /testbed: `lib/funcs.sh`, bash functions of which
one has one bug, and `tests/test_funcs.sh`, the visible tests of the others;
the record's hidden `test_files` add `tests/test_bug.sh`, which catches the
bug, and its `test_command` runs every test file. `write(directory)` writes
them and returns their paths and SHA-256 digests; the bytes are the same on
every run, so the digests are constants (`configs/grpo_benchmark_tasks_tiny.py`
names them).
"""

import json
import os
from typing import Any

from maxtext.env import benchmark_task
from maxtext.env import tiny_rootfs

# name, body, a call and its right output, the injected bug (old, new).
_FUNCTIONS = (
    ("add", "echo $(( $1 + $2 ))", "add 2 3", "5", ("+", "-")),
    ("double", "echo $(( $1 * 2 ))", "double 4", "8", ("* 2", "* 3")),
    ("greet", 'echo "Hello, $1"', "greet Ada", "Hello, Ada",
     ("Hello, ", "Hello ")),
    ("larger", 'if [ "$1" -gt "$2" ]; then echo "$1"; else echo "$2"; fi',
     "larger 7 3", "7", ("-gt", "-lt")),
    ("empty", 'if [ -z "$1" ]; then echo yes; else echo no; fi',
     'empty ""', "yes", ("-z", "-n")),
)  # fmt: skip
_TEST_COMMAND = 'for t in tests/test_*.sh; do bash "$t" || exit 1; done'
CURRICULUM = "curriculum.jsonl"
VALIDATION = "validation.jsonl"
ROOTFS = "rootfs"


def _check(call: str, want: str) -> str:
  return (
      f'got="$({call})"; [ "$got" = {want!r} ] || '
      f'{{ echo "{call}: got $got, want {want}"; exit 1; }}\n'
  )


def _task(index: int) -> tuple[dict[str, Any], dict[str, str]]:
  """Task `index`'s record and its repository's files (path -> text)."""
  name, _, call, want, (old, new) = _FUNCTIONS[index]
  source = "".join(
      f"{n}() {{ {body.replace(old, new, 1) if n == name else body}; }}\n"
      for n, body, _, _, _ in _FUNCTIONS
  )
  visible = "source lib/funcs.sh\n" + "".join(
      _check(c, w) for n, _, c, w, _ in _FUNCTIONS if n != name
  )
  image = f"example.org/tiny-funcs:task{index}"
  record = {
      "instance_id": f"tiny-funcs-{index}",
      "repo_name": "tiny-funcs",
      "docker_image": image,
      "problem_statement": (
          f"`{call}` (lib/funcs.sh) prints the wrong thing: it should "
          f"print {want}."
      ),
      "test_command": _TEST_COMMAND,
      "test_files": {
          "tests/test_bug.sh": "source lib/funcs.sh\n" + _check(call, want),
      },
  }
  return record, {"lib/funcs.sh": source, "tests/test_funcs.sh": visible}


def write(directory: str) -> dict[str, str]:
  """Writes the curriculum (tasks 0-2), the validation set (3-4) and their
  root filesystems under `directory`.

  Returns:
    {"curriculum_path", "curriculum_sha256", "validation_path",
     "validation_sha256", "rootfs_dir"}.
  """
  # Where the trainer runs as root, tools run as nobody, who must reach
  # the root filesystems (a temporary directory is made private).
  os.makedirs(directory, exist_ok=True)
  os.chmod(directory, 0o755)
  rootfs_dir = os.path.join(directory, ROOTFS)
  lines = {CURRICULUM: [], VALIDATION: []}
  for index in range(len(_FUNCTIONS)):
    record, files = _task(index)
    root = os.path.join(
        rootfs_dir, benchmark_task.rootfs_name(record["docker_image"])
    )
    tiny_rootfs.make(root)
    for relative, text in files.items():
      path = os.path.join(root, "testbed", relative)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    split = CURRICULUM if index < 3 else VALIDATION
    lines[split].append(json.dumps(record, sort_keys=True))
  out = {"rootfs_dir": rootfs_dir}
  for split, key in ((CURRICULUM, "curriculum"), (VALIDATION, "validation")):
    path = os.path.join(directory, split)
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(lines[split]) + "\n")
    out[f"{key}_path"] = path
    out[f"{key}_sha256"] = benchmark_task.sha256_of(path)
  return out


def fix(record: dict[str, Any]) -> tuple[str, str, str]:
  """(path, old, new): the edit of lib/funcs.sh that fixes `record`'s bug."""
  index = int(record["instance_id"].rsplit("-", 1)[1])
  name, body, _, _, (old, new) = _FUNCTIONS[index]
  return (
      "lib/funcs.sh",
      f"{name}() {{ {body.replace(old, new, 1)}; }}",
      f"{name}() {{ {body}; }}",
  )
