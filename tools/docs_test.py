"""The docs name only what exists: labels, source files, config fields, flags.

README.md and docs/*.md quote Bazel labels, module paths, `--config.<field>`
overrides, `tools/bazel run //label -- --flag` commands and links to each
other. Each is checked here against the repository itself, read from this
test's runfiles, without running Bazel:

* a label `//pkg:name` needs `pkg/BUILD` to define `name` (a rule or macro
  call with `name = "name"`);
* a path `pkg/module.py` needs `pkg/BUILD` to name `"module.py"`;
* `--config.<field>` needs the field in `maxtext/configs/base.py`;
* `--flag` after `tools/bazel run //pkg:bin --` needs `pkg/bin.py` to define
  it (`DEFINE_...("flag"`);
* a link `[text](file.md#anchor)` needs the file among the docs and the
  anchor among its headings; an image `![text](images/file.png)` needs the
  file under docs/images/.

A BUILD file or binary source the docs need but this test's `data` lacks is a
failure naming what to add to `data`.
"""

import os
import re

from absl.testing import absltest

from maxtext.configs import base
from testing import runfiles

# Labels: //pkg:name or //pkg (name = the last directory), not @repo//...
_LABEL = re.compile(r"(?<![@:\w])//([a-z0-9_/]*)(?::([A-Za-z0-9_.\-]+))?")
# A repository source file quoted in prose or commands.
_SOURCE = re.compile(
    r"(?<![\w/.])((?:maxtext|tools|testing)(?:/\w+)*/\w+\.py)\b"
)
_CONFIG_FIELD = re.compile(r"--config\.([A-Za-z_]\w*)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_RUN = re.compile(r"tools/bazel run (?:--\S+ )*//([a-z0-9_/]+):(\w+)(.*)")
_FLAG = re.compile(r"(?<!\S)--([A-Za-z_]\w*)(?=[=\s]|$)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def label_problems(text: str, builds: dict[str, str]) -> list[str]:
  """Labels in `text` that no BUILD in `builds` (package -> text) defines."""
  problems = []
  for match in _LABEL.finditer(text):
    package, name = match.group(1).rstrip("/"), match.group(2)
    if text.startswith("...", match.end()):
      continue  # //... and //pkg/...: patterns, not targets.
    name = name or package.rsplit("/", 1)[-1]
    label = f"//{package}:{name}"
    if package not in builds:
      problems.append(f"{label}: no {package or '(root)'}/BUILD in data")
    elif not re.search(rf'name = "{re.escape(name)}"', builds[package]):
      problems.append(f"{label}: {package}/BUILD defines no {name!r}")
  return problems


def source_problems(text: str, builds: dict[str, str]) -> list[str]:
  """`pkg/module.py` paths in `text` that their package's BUILD lacks."""
  problems = []
  for path in sorted(set(_SOURCE.findall(text))):
    package, filename = path.rsplit("/", 1)
    if package not in builds:
      problems.append(f"{path}: no {package}/BUILD in data")
    elif f'"{filename}"' not in builds[package]:
      problems.append(f"{path}: not in {package}/BUILD")
  return problems


def config_field_problems(text: str, fields: set[str]) -> list[str]:
  """`--config.<field>` overrides in `text` naming no field of base.py."""
  return sorted(
      f"--config.{field}: not a field of maxtext/configs/base.py"
      for field in set(_CONFIG_FIELD.findall(text))
      if field not in fields
  )


def _commands(text: str) -> list[str]:
  """The shell commands of `text`'s fenced blocks, continuations joined."""
  commands = []
  for block in _FENCE.findall(text):
    joined = re.sub(r"\\\n\s*", " ", block)
    commands.extend(
        " ".join(line.split("#", 1)[0].split()) for line in joined.splitlines()
    )
  return commands


def flag_problems(text: str, sources: dict[str, str]) -> list[str]:
  """Flags of `tools/bazel run //pkg:bin -- ...` that bin's main lacks.

  Args:
    text: a Markdown document.
    sources: "pkg/bin.py" -> the binary's main source.
  """
  problems = []
  for command in _commands(text):
    match = _RUN.search(command)
    if match is None or " -- " not in f"{match.group(3)} ":
      continue
    package, name, rest = match.groups()
    path = f"{package}/{name}.py"
    if path not in sources:
      problems.append(f"{command.strip()}: no {path} in data")
      continue
    for flag in _FLAG.findall(rest.split(" -- ", 1)[-1]):
      if not re.search(rf'DEFINE_\w+\(\s*"{flag}"', sources[path]):
        problems.append(f"--{flag}: {path} defines no such flag")
  return problems


def link_problems(
    name: str,
    text: str,
    docs: dict[str, str],
    files: frozenset[str] = frozenset(),
) -> list[str]:
  """Relative links of document `name` to missing docs, headings or files.

  Args:
    name: the document's path from the repository root.
    text: its text.
    docs: path -> text of every document (links to them may name headings).
    files: paths of the other files the docs may link to (images).
  """
  problems = []
  directory = os.path.dirname(name)
  for target in _LINK.findall(text):
    if re.match(r"[a-z]+://", target):
      continue
    path, _, anchor = target.partition("#")
    path = os.path.normpath(os.path.join(directory, path)) if path else name
    if path in files and not anchor:
      continue
    if path not in docs:
      problems.append(f"{name}: link to {target}: no such document")
      continue
    headings = re.findall(r"^#+ (.*)$", _FENCE.sub("", docs[path]), re.M)
    if anchor and anchor not in {_slug(h) for h in headings}:
      problems.append(f"{name}: link to {target}: no such heading")
  return problems


def _read(relative_path: str) -> str:
  path = runfiles.find(relative_path)
  if path is None:
    raise FileNotFoundError(f"{relative_path} is not in this test's data")
  with open(path, encoding="utf-8") as f:
    return f.read()


def _docs() -> dict[str, str]:
  """README.md and every docs/*.md, by path from the repository root."""
  docs = {"README.md": _read("README.md")}
  directory = os.path.dirname(runfiles.find("docs/ARCHITECTURE.md"))
  for filename in sorted(os.listdir(directory)):
    if filename.endswith(".md"):
      docs[f"docs/{filename}"] = _read(f"docs/{filename}")
  return docs


def _images() -> frozenset[str]:
  """Every file under docs/images/, by path from the repository root."""
  directory = os.path.join(
      os.path.dirname(runfiles.find("docs/ARCHITECTURE.md")), "images"
  )
  if not os.path.isdir(directory):
    return frozenset()
  return frozenset(f"docs/images/{f}" for f in os.listdir(directory))


def _present(paths) -> dict[str, str]:
  """path -> text for each of `paths` found in the runfiles."""
  return {p: _read(p) for p in paths if runfiles.find(p) is not None}


def _builds(docs: dict[str, str]) -> dict[str, str]:
  """package -> BUILD text, for every package `docs` name that has one here."""
  packages = set()
  for text in docs.values():
    packages.update(m.group(1).rstrip("/") for m in _LABEL.finditer(text))
    packages.update(p.rsplit("/", 1)[0] for p in _SOURCE.findall(text))
  builds = {}
  for package in packages:
    path = f"{package}/BUILD" if package else "BUILD"
    if runfiles.find(path) is not None:
      builds[package] = _read(path)
  return builds


class CheckersTest(absltest.TestCase):
  """The checks find what they look for (so the docs check can fail)."""

  _BUILDS = {
      "maxtext": (
          'py_binary(\n    name = "train_main",\n'
          '    srcs = ["train_main.py"],\n)'
      )
  }

  def test_labels(self):
    text = "`//maxtext:train_main`, `//maxtext:nope`, `//other:x`, `//...`"
    self.assertEqual(
        label_problems(text, self._BUILDS),
        [
            "//maxtext:nope: maxtext/BUILD defines no 'nope'",
            "//other:x: no other/BUILD in data",
        ],
    )
    self.assertEqual(
        label_problems("`//maxtext`", self._BUILDS),
        ["//maxtext:maxtext: maxtext/BUILD defines no 'maxtext'"],
    )
    self.assertEqual(label_problems("`@pypi//:jax`", self._BUILDS), [])

  def test_sources(self):
    text = "maxtext/train_main.py and maxtext/gone.py"
    self.assertEqual(
        source_problems(text, self._BUILDS),
        ["maxtext/gone.py: not in maxtext/BUILD"],
    )

  def test_config_fields(self):
    self.assertEqual(
        config_field_problems("--config.steps=1 --config.stpes=2", {"steps"}),
        ["--config.stpes: not a field of maxtext/configs/base.py"],
    )

  def test_flags(self):
    text = (
        "```sh\ntools/bazel run //tools:gen -- --run_dir=x \\\n"
        "    --promt=y  # --seed=1 is a comment\n```\n"
    )
    sources = {"tools/gen.py": 'flags.DEFINE_string(\n    "run_dir", None, "")'}
    self.assertEqual(
        flag_problems(text, sources),
        ["--promt: tools/gen.py defines no such flag"],
    )
    self.assertEqual(
        flag_problems(text, {}),
        [
            "tools/bazel run //tools:gen -- --run_dir=x --promt=y: "
            "no tools/gen.py in data"
        ],
    )

  def test_links(self):
    docs = {"README.md": "", "docs/a.md": "# A title\n## Sub part\n"}
    text = (
        "[a](a.md#sub-part) [b](b.md) [c](a.md#nope) [w](https://x.org) "
        "![p](images/p.png) ![q](images/q.png)"
    )
    self.assertEqual(
        link_problems(
            "docs/x.md", text, docs, frozenset({"docs/images/p.png"})
        ),
        [
            "docs/x.md: link to b.md: no such document",
            "docs/x.md: link to a.md#nope: no such heading",
            "docs/x.md: link to images/q.png: no such document",
        ],
    )


class DocsTest(absltest.TestCase):
  """README.md and docs/*.md against the repository."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.docs = _docs()
    cls.builds = _builds(cls.docs)

  def _check(self, problems: list[str]) -> None:
    self.assertEqual(problems, [], "\n" + "\n".join(problems))

  def test_the_docs_are_read(self):
    self.assertIn("docs/ARCHITECTURE.md", self.docs)
    self.assertIn("docs/PERFORMANCE.md", self.docs)
    self.assertIn("maxtext", self.builds)

  def test_labels_exist(self):
    self._check(
        [
            f"{name}: {p}"
            for name, text in self.docs.items()
            for p in label_problems(text, self.builds)
        ]
    )

  def test_source_files_exist(self):
    self._check(
        [
            f"{name}: {p}"
            for name, text in self.docs.items()
            for p in source_problems(text, self.builds)
        ]
    )

  def test_config_fields_exist(self):
    fields = set(base.get_config().keys())
    self._check(
        [
            f"{name}: {p}"
            for name, text in self.docs.items()
            for p in config_field_problems(text, fields)
        ]
    )

  def test_flags_exist(self):
    binaries = {
        f"{m.group(1)}/{m.group(2)}.py"
        for text in self.docs.values()
        for command in _commands(text)
        for m in [_RUN.search(command)]
        if m is not None
    }
    sources = _present(binaries)
    self.assertIn("maxtext/train_main.py", sources)
    self._check(
        [
            f"{name}: {p}"
            for name, text in self.docs.items()
            for p in flag_problems(text, sources)
        ]
    )

  def test_links_resolve(self):
    images = _images()
    self._check(
        [
            p
            for name, text in self.docs.items()
            for p in link_problems(name, text, self.docs, images)
        ]
    )


if __name__ == "__main__":
  absltest.main()
