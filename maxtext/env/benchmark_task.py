"""The MLPerf benchmark's inputs as a task: software tasks in their own images.

MLPerf Training 6.1's `qwen35_397b_grpo` trains on multi-turn episodes in
which the model fixes a real repository inside the task's container image
(R2E-Gym-style tasks) with CodeAct-style tools, rewarded 1 when the task's
tests pass. A user who has the benchmark's files runs them here with:

  config.grpo_task = "maxtext.env.benchmark_task:make_task"
  config.grpo_task_curriculum_path   the ordered training curriculum (JSONL)
  config.grpo_task_curriculum_sha256 its published SHA-256
  config.grpo_task_validation_path   the validation set (JSONL)
  config.grpo_task_validation_sha256 its SHA-256
  config.grpo_task_rootfs_dir        one root filesystem per image (below)
  config.grpo_task_prompt_path       the pinned prompt template ("" = ours)
  config.grpo_task_prompt_sha256     its SHA-256

Each file's SHA-256 is checked before it is parsed; then every record is
checked, and a malformed one is refused in one line naming the file, the
line and the field. A record (one JSON object a line; R2E-Gym's field
names; fields not listed are kept and not read):

  instance_id        a non-empty string, unique in its file
  docker_image       the task's image; its root filesystem is the
                     directory `rootfs_dir/<image>`, with every character
                     of the name outside [A-Za-z0-9._-] written "_"
                     (`rootfs_name`), e.g. an exported image
  problem_statement  what the model is asked to fix (non-empty)
  test_command       the shell command (bash -c, in workdir) whose exit
                     status 0 is reward 1
  workdir            optional: the repository's directory in the image
                     (absolute; default /testbed, R2E-Gym's)
  repo_name          optional: shown in the prompt
  test_files         optional: path (relative to workdir) -> text, written
                     over the model's edits just before the test command
                     runs (tests the model does not see and cannot edit)

Training records are the curriculum's in file order: step s of n tasks
takes records s*n .. s*n+n-1, wrapping to the start after the last (the
order is the curriculum; the seed does not change it). The held-out
records are the validation set's first `num_eval`.

An episode (`SoftwareEnvironment`) runs in `sandbox.Sandbox` with the
task's root filesystem bound read-only as `/` and a writable scratch copy of
its workdir bound over it; the model sees the rendered prompt and three
tools, written here from the description of the CodeAct tools (OpenHands')
the reference uses:

  execute_bash(command)      runs `bash -c command` in the workdir; output
                             and exit code (each call a new process:
                             files persist, shell state does not)
  str_replace_editor(command, path, file_text, old_str, new_str,
                     view_range)
                             view (a file with line numbers, or a
                             directory two levels deep), create (a new
                             file), str_replace (the one occurrence of
                             old_str); absolute paths inside the workdir
  finish(message)            ends the episode

The reward: `test_files` written, the test command run in the sandbox under
the verifier's timeout; 1.0 when it exits 0, else 0.0.
"""

import dataclasses
import hashlib
import json
import logging
import os
import re
import string
from typing import Any, Optional

from maxtext.env import environment
from maxtext.env import sandbox
from maxtext.env import tasks

KIND = "swe"
DEFAULT_WORKDIR = "/testbed"
# Shown to the model: the editor's view and a command's output, at most.
VIEW_CHARS = 16000
OUTPUT_CHARS = 8000
# The longest command: one argument of `bash -c`, which Linux caps at 128
# KiB (MAX_ARG_STRLEN), in characters of up to 4 UTF-8 bytes.
COMMAND_CHARS = 32768

# The prompt when the config names no template: the placeholders are
# ${instance_id}, ${repo_name}, ${workdir}, ${problem_statement}.
SYSTEM_PROMPT = (
    "You are a software engineer. You work in a repository checked out at "
    "${workdir}, inside a sandbox without network access. Use the tools to "
    "explore the code, reproduce the issue, edit the code and check your "
    "fix; do not edit the existing tests. When the issue is fixed, call "
    "finish."
)
USER_PROMPT = (
    "Repository: ${repo_name} (at ${workdir})\n\n"
    "<issue>\n${problem_statement}\n</issue>\n\n"
    "Make the changes to the non-test files of the repository so that the "
    "issue is resolved."
)
PLACEHOLDERS = ("instance_id", "repo_name", "workdir", "problem_statement")

_IMAGE_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def rootfs_name(image: str) -> str:
  """The directory name of an image's root filesystem (module docstring)."""
  return _IMAGE_CHARS.sub("_", image)


def sha256_of(path: str) -> str:
  """The hex SHA-256 of a file's bytes."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def check_digest(path: str, expected: str, field: str) -> None:
  """Refuses (one line) a file whose SHA-256 is not `expected`.

  Raises:
    ValueError: no digest given, a file that cannot be read, or another
      digest; naming the path, the expected and the actual digest.
  """
  if not _HEX64.match(expected):
    raise ValueError(
        f"config.{field}={expected!r}: must be the 64 lowercase hex digits "
        f"of {path}'s published SHA-256"
    )
  try:
    actual = sha256_of(path)
  except OSError as e:
    raise ValueError(f"{path}: cannot be read: {e.strerror}") from None
  if actual != expected:
    raise ValueError(
        f"{path}: SHA-256 {actual}, expected {expected} (config.{field}): "
        "not the published file"
    )


@dataclasses.dataclass(frozen=True)
class Prompt:
  """The prompt template: system and user message, $-placeholders."""

  system: str = SYSTEM_PROMPT
  user: str = USER_PROMPT

  def render(self, record: dict[str, Any]) -> list[dict[str, str]]:
    values = {
        "instance_id": record["instance_id"],
        "repo_name": record.get("repo_name", record["instance_id"]),
        "workdir": record["workdir"],
        "problem_statement": record["problem_statement"],
    }
    return [
        {"role": "system",
         "content": string.Template(self.system).substitute(values)},
        {"role": "user",
         "content": string.Template(self.user).substitute(values)},
    ]  # fmt: skip


def _check_template(text: str, where: str) -> None:
  template = string.Template(text)
  if not template.is_valid():
    raise ValueError(f"{where}: not a valid $-template (a stray $)")
  unknown = sorted(set(template.get_identifiers()) - set(PLACEHOLDERS))
  if unknown:
    raise ValueError(
        f"{where}: unknown placeholder(s) {unknown}; the placeholders are "
        f"{list(PLACEHOLDERS)}"
    )


def read_prompt(path: str, expected_sha256: str) -> Prompt:
  """The template file (JSON {"system": ..., "user": ...}), checked.

  Raises:
    ValueError: one line: another digest, not JSON, a field missing or
      not text, an unknown placeholder.
  """
  check_digest(path, expected_sha256, "grpo_task_prompt_sha256")
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: not a JSON object: {e}") from None
  if not isinstance(data, dict):
    raise ValueError(f"{path}: not a JSON object")
  for field in ("system", "user"):
    if not isinstance(data.get(field), str) or not data[field]:
      raise ValueError(f"{path}: field {field!r}: must be a non-empty string")
    _check_template(data[field], f"{path}: field {field!r}")
  return Prompt(data["system"], data["user"])


def _string(record, field, where, required=True) -> Optional[str]:
  value = record.get(field)
  if value is None and not required:
    return None
  if not isinstance(value, str) or not value.strip():
    state = "missing" if field not in record else f"{value!r}"
    raise ValueError(
        f"{where}: field {field!r}: {state}: must be a non-empty string"
    )
  return value


def _outside(path: str, workdir: str) -> bool:
  """Whether `path` (relative to `workdir`, or absolute) is not a file in
  it, read lexically (a record is checked before any file exists)."""
  relative = (
      os.path.relpath(path, workdir)
      if os.path.isabs(path)
      else os.path.normpath(path)
  )
  return relative == "." or relative.split(os.sep)[0] == ".."


def _record(line: str, where: str, rootfs_dir: str) -> dict[str, Any]:
  """One JSONL line as a checked record (module docstring's fields)."""
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(f"{where}: not JSON: {e.msg}") from None
  if not isinstance(record, dict):
    raise ValueError(f"{where}: not a JSON object")
  for field in (
      "instance_id",
      "docker_image",
      "problem_statement",
      "test_command",
  ):
    _string(record, field, where)
  workdir = _string(record, "workdir", where, required=False)
  workdir = DEFAULT_WORKDIR if workdir is None else workdir
  if not workdir.startswith("/") or os.path.normpath(workdir) == "/":
    raise ValueError(
        f"{where}: field 'workdir': {workdir!r}: must be an "
        "absolute path below /"
    )
  _string(record, "repo_name", where, required=False)
  test_files = record.get("test_files", {})
  if not isinstance(test_files, dict) or not all(
      isinstance(k, str) and isinstance(v, str) for k, v in test_files.items()
  ):
    raise ValueError(
        f"{where}: field 'test_files': must be an object of path -> text"
    )
  for path in test_files:
    if _outside(path, workdir):
      raise ValueError(
          f"{where}: field 'test_files': {path!r} is outside "
          f"the workdir {workdir}"
      )
  root = os.path.join(rootfs_dir, rootfs_name(record["docker_image"]))
  if not os.path.isdir(root):
    raise ValueError(
        f"{where}: field 'docker_image': {record['docker_image']!r} has no "
        f"root filesystem at {root} (config.grpo_task_rootfs_dir)"
    )
  if sandbox.unreachable(root):
    raise ValueError(
        f"{where}: field 'docker_image': its root filesystem: "
        f"{sandbox.unreachable(root)} (config.grpo_task_rootfs_dir)"
    )
  # The workdir as the image sees it: an absolute link in the image would
  # resolve on the host, so it must stay under the root.
  source = sandbox.inside(root, workdir.lstrip("/"))
  if source is None or not os.path.isdir(source):
    raise ValueError(
        f"{where}: field 'workdir': {workdir} is not a directory in {root}"
    )
  return dict(
      record,
      workdir=os.path.normpath(workdir),
      test_files=test_files,
      rootfs=root,
      source=source,
  )


def read_records(
    path: str, expected_sha256: str, field: str, rootfs_dir: str
) -> list[dict[str, Any]]:
  """A JSONL file's records, in order, after its digest and every record
  are checked (module docstring).

  Args:
    path: the file.
    expected_sha256: its published SHA-256.
    field: the config field of the digest (named in the refusal).
    rootfs_dir: the directory of the root filesystems.

  Raises:
    ValueError: one line naming the file (and the line and field).
  """
  check_digest(path, expected_sha256, field)
  records, seen = [], {}
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{path}:{number}"
      record = _record(line, where, rootfs_dir)
      first = seen.setdefault(record["instance_id"], number)
      if first != number:
        raise ValueError(
            f"{where}: field 'instance_id': {record['instance_id']!r} is "
            f"also line {first}'s"
        )
      records.append(record)
  if not records:
    raise ValueError(f"{path}: no records")
  return records


def _numbered(text: str, first: int = 1) -> str:
  return "\n".join(
      f"{number:6}\t{line}"
      for number, line in enumerate(text.split("\n"), start=first)
  )


def _cut(text: str, limit: int) -> str:
  if len(text) <= limit:
    return text
  return text[:limit] + f"\n[cut: {len(text) - limit} more characters]"


class SoftwareEnvironment(environment.ToolEnvironment):
  """One episode on a task in its own root filesystem (module docstring)."""

  def __init__(
      self,
      record: dict[str, Any],
      prompt: Prompt,
      tool_settings: tasks.ToolSettings,
  ):
    super().__init__(KIND)
    self._record = record
    self._prompt = prompt
    self._tool_settings = tool_settings
    self._box = sandbox.Sandbox(
        {},
        tool_settings.limits,
        tool_settings.isolated,
        root=record["rootfs"],
        workdir=record["workdir"],
        source=record["source"],
    )
    self.add_tool(
        "execute_bash",
        self.execute_bash,
        "Runs a bash command in the repository's directory, in a sandbox "
        "without network, and returns its output and exit code. Each call "
        "is a new process: files persist between calls, the shell's state "
        "(directory, variables) does not.",
        max_chars={"command": COMMAND_CHARS},
    )
    self.add_tool(
        "str_replace_editor",
        self.str_replace_editor,
        "Views, creates and edits files. command: 'view' (a file with line "
        "numbers, view_range [start, end] optional with end -1 for the "
        "end; or a directory, two levels deep), 'create' (a new file with "
        "file_text), 'str_replace' (replaces old_str, which must occur "
        f"exactly once, with new_str). path: absolute, in {record['workdir']}.",
    )
    self.add_tool(
        "finish",
        self.finish_tool,
        "Ends the episode when the task is done.",
    )

  def start(self) -> list[dict[str, Any]]:
    return self._prompt.render(self._record)

  def execute_bash(self, command: str) -> str:
    """The tool: `bash -c command` in the sandbox."""
    if not command.strip():
      raise environment.ToolError("execute_bash: the command is empty")
    result = self._box.run(["/bin/bash", "-c", command], deadline=self.deadline)
    if result.error:
      raise environment.ToolError(result.error)
    output = _cut(result.stdout + result.stderr, OUTPUT_CHARS)
    return f"{output}\n[exit code {result.returncode}]"

  def _host(self, path: str) -> str:
    workdir = self._record["workdir"]
    if not path.startswith("/"):
      raise environment.ToolError(
          f"{path}: give an absolute path (in {workdir})"
      )
    host = self._box.path(path)
    if host is None:
      raise environment.ToolError(f"{path}: outside {workdir}")
    return host

  def _read(self, path: str) -> str:
    try:
      return self._box.read_file(path).decode("utf-8")
    except sandbox.FileRefused as e:
      raise environment.ToolError(str(e)) from None
    except UnicodeDecodeError:
      raise environment.ToolError(f"{path}: not UTF-8 text") from None

  def _write(self, path: str, text: str, create: bool = False) -> None:
    try:
      self._box.write_file(path, text.encode("utf-8"), create)
    except sandbox.FileRefused as e:
      raise environment.ToolError(str(e)) from None
    except UnicodeEncodeError:
      raise environment.ToolError(f"{path}: the text is not UTF-8") from None

  def _view(self, path: str, host: str, view_range: Optional[list[int]]) -> str:
    """A directory's entries two levels deep, or a file's numbered lines."""
    if os.path.isdir(host) and not os.path.islink(host):
      lines = [path.rstrip("/") + "/"]
      for directory, names, files in os.walk(host):
        relative = os.path.relpath(directory, host)
        names[:] = sorted(n for n in names if not n.startswith("."))
        shown = [n + "/" for n in names] + sorted(
            f for f in files if not f.startswith(".")
        )
        lines += [os.path.join(path, relative, n).replace("/./", "/")
                  for n in shown]  # fmt: skip
        if relative != ".":
          names[:] = []  # Two levels: the directory's and its children's.
      return _cut("\n".join(lines), VIEW_CHARS)
    text = self._read(path)
    if view_range is None:
      return _cut(_numbered(text), VIEW_CHARS)
    if len(view_range) != 2:
      raise environment.ToolError(
          f"view_range {view_range!r}: give [start, end]"
      )
    start, end = view_range
    lines = text.split("\n")
    end = len(lines) if end == -1 else end
    if not 1 <= start <= end <= len(lines):
      raise environment.ToolError(
          f"view_range {view_range!r}: lines are 1 to {len(lines)}"
      )
    return _cut(_numbered("\n".join(lines[start - 1 : end]), start), VIEW_CHARS)

  def str_replace_editor(
      self,
      command: str,
      path: str,
      file_text: str = "",
      old_str: str = "",
      new_str: str = "",
      view_range: Optional[list[int]] = None,
  ) -> str:
    """The tool: view, create, str_replace (module docstring)."""
    path = path.strip()
    host = self._host(path)
    if command == "view":
      return self._view(path, host, view_range)
    if command == "create":
      if os.path.lexists(host):
        raise environment.ToolError(
            f"{path}: already exists (create makes new files; edit with "
            "str_replace)"
        )
      self._write(path, file_text, create=True)
      return f"File created: {path}"
    if command == "str_replace":
      if not old_str:
        raise environment.ToolError("str_replace: old_str is empty")
      text = self._read(path)
      count = text.count(old_str)
      if count != 1:
        raise environment.ToolError(
            f"str_replace: old_str occurs {count} times in {path}; it must "
            "occur exactly once"
        )
      at = text[: text.index(old_str)].count("\n")
      text = text.replace(old_str, new_str, 1)
      self._write(path, text)
      lines = text.split("\n")
      first = max(0, at - 4)
      last = at + new_str.count("\n") + 5
      snippet = _numbered("\n".join(lines[first:last]), first + 1)
      return f"{path} edited; its lines {first + 1} on:\n{snippet}"
    raise environment.ToolError(
        f"command {command!r}: one of view, create, str_replace"
    )

  def finish_tool(self, message: str = "") -> str:
    """The tool: ends the episode after this turn."""
    del message  # The reward is the tests', not the model's word.
    self.finish()
    return "finished"

  def reward(self) -> float:
    """1.0 when the test command exits 0 with the test files written; 0.0
    (the reason logged) when one cannot be written (a directory there, or
    a directory on its path turned into a link out of the repository)."""
    for path, text in self._record["test_files"].items():
      why = self._box.restore_file(path, text.encode("utf-8"))
      if why:
        logging.warning("%s scored 0: %s", self._record["instance_id"], why)
        return 0.0
    result = self._box.run(
        ["/bin/bash", "-c", self._record["test_command"]],
        self._tool_settings.verifier_seconds,
    )
    return float(result.ok)

  def close(self) -> None:
    self._box.close()


class BenchmarkTask(tasks.Task):
  """The benchmark's curriculum and validation set (module docstring)."""

  kind = KIND
  uses_sandbox = True

  def __init__(self, num_eval: int, inputs: tasks.TaskInputs):
    missing = [
        f"grpo_task_{field}"
        for field in (
            "curriculum_path",
            "curriculum_sha256",
            "validation_path",
            "validation_sha256",
            "rootfs_dir",
        )
        if not getattr(inputs, field)
    ]
    if missing:
      raise ValueError(
          f"config.{', '.join(missing)}: empty; the benchmark task reads "
          "its curriculum, validation set and root filesystems from these "
          'fields (docs/grpo.md, "The benchmark\'s inputs")'
      )
    if not os.path.isdir(inputs.rootfs_dir):
      raise ValueError(
          f"config.grpo_task_rootfs_dir={inputs.rootfs_dir!r}: not a "
          "directory"
      )
    self.prompt = Prompt()
    if inputs.prompt_path:
      self.prompt = read_prompt(inputs.prompt_path, inputs.prompt_sha256)
    elif inputs.prompt_sha256:
      raise ValueError(
          "config.grpo_task_prompt_sha256 is set but grpo_task_prompt_path "
          "is empty"
      )
    self.curriculum = read_records(
        inputs.curriculum_path,
        inputs.curriculum_sha256,
        "grpo_task_curriculum_sha256",
        inputs.rootfs_dir,
    )
    validation = read_records(
        inputs.validation_path,
        inputs.validation_sha256,
        "grpo_task_validation_sha256",
        inputs.rootfs_dir,
    )
    if not 1 <= num_eval <= len(validation):
      raise ValueError(
          f"config.grpo_eval_prompts={num_eval}: must be 1 to the "
          f"{len(validation)} records of {inputs.validation_path}"
      )
    self._eval = validation[:num_eval]

  def train_records(self, step: int, count: int) -> list[dict[str, Any]]:
    size = len(self.curriculum)
    return [self.curriculum[(step * count + i) % size] for i in range(count)]

  def eval_records(self) -> list[dict[str, Any]]:
    return list(self._eval)

  def make_environment(
      self, record: dict[str, Any], tools: tasks.ToolSettings
  ) -> environment.Environment:
    return SoftwareEnvironment(record, self.prompt, tools)


def make_task(
    num_eval: int, seed: int = 0, inputs: Optional[tasks.TaskInputs] = None
) -> BenchmarkTask:
  """`config.grpo_task = "maxtext.env.benchmark_task:make_task"`; the
  inputs from the config's grpo_task_* fields (`tasks.load`)."""
  del seed  # The curriculum's order is the order.
  return BenchmarkTask(num_eval, inputs or tasks.TaskInputs())
