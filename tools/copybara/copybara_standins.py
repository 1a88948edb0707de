"""Python stand-ins for Copybara's Starlark modules, to evaluate copy.bara.sky.

Copybara itself cannot be installed here. Its configuration language is a
Python-like Starlark, so the file can be executed as Python with these objects
bound to the names Copybara provides (`core`, `git`, `folder`, `metadata`,
`authoring`, `glob`). The stand-ins record what the configuration declares and
implement just enough of the semantics (glob matching, moves, regex
replacements) to run an export between folders.
"""

import dataclasses
import os
import re
import shutil
from typing import Any


def _glob_regex(pattern):
  """Translates a Copybara glob ('**' crosses '/', '*' does not) to a regex."""
  out = []
  i = 0
  while i < len(pattern):
    if pattern.startswith("**/", i):
      out.append("(?:.*/)?")
      i += 3
    elif pattern.startswith("**", i):
      out.append(".*")
      i += 2
    elif pattern[i] == "*":
      out.append("[^/]*")
      i += 1
    elif pattern[i] == "?":
      out.append("[^/]")
      i += 1
    else:
      out.append(re.escape(pattern[i]))
      i += 1
  return re.compile("".join(out) + r"\Z")


@dataclasses.dataclass
class Glob:
  """A union of (include, exclude) pattern sets: `glob(...) + glob(...)`."""

  parts: list

  def __add__(self, other):
    return Glob(self.parts + other.parts)

  def matches(self, path):
    for include, exclude in self.parts:
      if any(_glob_regex(p).match(path) for p in include) and not any(
          _glob_regex(p).match(path) for p in exclude
      ):
        return True
    return False

  def patterns(self):
    """Yields ("include" or "exclude", pattern) for every pattern."""
    for include, exclude in self.parts:
      yield from (("include", p) for p in include)
      yield from (("exclude", p) for p in exclude)


def glob(include, exclude=()):
  return Glob([(list(include), list(exclude))])


@dataclasses.dataclass
class Move:
  """core.move: renames a file or a folder."""

  before: str
  after: str

  def apply(self, files):
    """Renames the file (or every file under the folder) `before` to `after`."""
    moved = {}
    for path, content in files.items():
      if path == self.before:
        moved[self.after] = content
      elif path.startswith(self.before.rstrip("/") + "/"):
        moved[self.after.rstrip("/") + path[len(self.before.rstrip("/")) :]] = (
            content
        )
      else:
        moved[path] = content
    return moved


@dataclasses.dataclass
class Replace:
  """core.replace: a regex replacement in the contents of matching files."""

  before: str
  after: str
  regex_groups: dict
  paths: Glob

  def regex(self):
    """The template `before` with each ${group} replaced by its regex."""
    pattern = re.escape(self.before)
    flags = set()
    for name, group in self.regex_groups.items():
      # RE2 allows flags such as (?m) at the start of a group; Python wants
      # them at the start of the pattern.
      leading = re.match(r"\(\?([a-z]+)\)", group)
      if leading:
        flags.update(leading.group(1))
        group = group[leading.end() :]
      pattern = pattern.replace(re.escape("${%s}" % name), "(?:%s)" % group)
    return re.compile(
        ("(?%s)" % "".join(sorted(flags)) if flags else "") + pattern
    )

  def apply(self, files):
    regex = self.regex()
    out = {}
    for path, content in files.items():
      if self.paths.matches(path) and isinstance(content, str):
        content = regex.sub(self.after, content)
      out[path] = content
    return out


@dataclasses.dataclass
class Scrubber:
  regex: str
  replacement: str = ""

  def apply(self, files):
    return files  # Acts on commit messages, not files.

  def scrub(self, message):
    return re.sub(self.regex, self.replacement, message)


@dataclasses.dataclass
class Endpoint:
  kind: str
  args: dict


@dataclasses.dataclass
class Workflow:
  """core.workflow: what to copy from where to where, and how to change it."""

  name: str
  origin: Endpoint
  destination: Endpoint
  origin_files: Glob
  destination_files: Glob
  authoring: Any
  transformations: list
  mode: str = "SQUASH"

  def export(self, source_files):
    """Runs on {path: content}: selects origin files, then transforms them."""
    files = {
        p: c for p, c in source_files.items() if self.origin_files.matches(p)
    }
    for transformation in self.transformations:
      files = transformation.apply(files)
    return files


class _Core:
  """Stand-in for Copybara's `core` module."""

  def __init__(self):
    self.workflows = []

  def workflow(self, **kwargs):
    self.workflows.append(Workflow(**kwargs))

  def move(self, before, after, **unused_kwargs):
    return Move(before, after)

  def replace(
      self, before, after, regex_groups=None, paths=None, **unused_kwargs
  ):
    return Replace(
        before, after, dict(regex_groups or {}), paths or glob(["**"])
    )


class _Module:
  """A module whose functions each return an Endpoint naming the call."""

  def __init__(self, name):
    self._name = name

  def __getattr__(self, attr):
    return lambda *args, **kwargs: Endpoint(
        "%s.%s" % (self._name, attr), dict(kwargs, args=args)
    )


class _Metadata:

  def scrubber(self, regex, replacement="", **unused_kwargs):
    return Scrubber(regex, replacement)


def evaluate(config_path):
  """Executes a copy.bara.sky file and returns its workflows, by name."""
  core = _Core()
  env = {
      "core": core,
      "git": _Module("git"),
      "folder": _Module("folder"),
      "authoring": _Module("authoring"),
      "metadata": _Metadata(),
      "glob": glob,
  }
  with open(config_path, encoding="utf-8") as f:
    # Starlark is executed as Python: the config is this repository's own file.
    # pylint: disable-next=exec-used
    exec(compile(f.read(), config_path, "exec"), env)
  return {w.name: w for w in core.workflows}, env


def read_tree(root):
  """{relative path: text or bytes} of files under root, but VCS and Bazel's."""
  files = {}
  for dirpath, dirnames, filenames in os.walk(root):
    rel_dir = os.path.relpath(dirpath, root)
    dirnames[:] = [
        d
        for d in dirnames
        if d != ".git" and d != "__pycache__" and not d.startswith("bazel-")
    ]
    for name in filenames:
      if rel_dir == "." and name.startswith("bazel-"):
        continue
      path = os.path.normpath(os.path.join(rel_dir, name))
      with open(os.path.join(dirpath, name), "rb") as f:
        data = f.read()
      try:
        files[path] = data.decode("utf-8")
      except UnicodeDecodeError:
        files[path] = data
  return files


def write_tree(files, root):
  shutil.rmtree(root, ignore_errors=True)
  for path, content in files.items():
    target = os.path.join(root, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as f:
      f.write(content.encode("utf-8") if isinstance(content, str) else content)
