"""The built-in repair task: fix one injected bug in a small Python package.

Each task is a package of a few small functions (`<package>/core.py`) with
unit tests (`tests/test_core.py`, `python3 -m unittest`); one function has
one injected bug (an operator or a call swapped), which at least one test
catches. The record follows R2E-Gym's fields, so a user's tasks in that
shape run through the same environment given their files:

  instance_id         "repair-<index>"
  problem_statement   what a user would report (a call, what it returns,
                      what it should return)
  files               the repository: relative path -> text
  test_files          the paths the verifier restores before it runs
  test_command        the command that runs the tests (argv)
  fix                 the hidden fix {"path", "old", "new"} (for
                      demonstrations; never shown to the model)

The episode (`RepairEnvironment`): the model sees the problem statement
and the tools `view_file(path)`, `edit_file(path, old, new)` (replaces the
one occurrence of `old`), `run_tests()` and `submit()`; every tool runs on
the episode's own scratch copy of the files, the tests in the sandbox
(`sandbox.Sandbox`, bubblewrap). The reward is 1 when the tests pass in the
sandbox, run after the episode with the original test files restored (the
model cannot pass by editing the tests), under the verifier's timeout; else
0. Held-out tasks are those whose index is 0 mod 8.
"""

import logging
from typing import Any

import numpy as np

from maxtext.env import environment
from maxtext.env import sandbox
from maxtext.env import tasks
from maxtext.env import tool_calls

# name, parameters, body, test cases ((arguments), result), and the bugs
# that can be injected into its body (old, new).
_FUNCTIONS = (
    ("add", "a, b", "return a + b", [((2, 3), 5), ((-1, 1), 0)],
     [("a + b", "a - b"), ("a + b", "a * b")]),
    ("sub", "a, b", "return a - b", [((5, 3), 2), ((1, 4), -3)],
     [("a - b", "b - a"), ("a - b", "a + b")]),
    ("mul", "a, b", "return a * b", [((2, 3), 6), ((4, 0), 0)],
     [("a * b", "a + b"), ("a * b", "a ** b")]),
    ("clamp", "x, lo, hi", "return max(lo, min(x, hi))",
     [((5, 0, 3), 3), ((-2, 0, 3), 0), ((2, 0, 3), 2)],
     [("max(lo, min(x, hi))", "min(lo, max(x, hi))"),
      ("min(x, hi)", "min(x, lo)")]),
    ("is_even", "n", "return n % 2 == 0",
     [((4,), True), ((7,), False)],
     [("n % 2 == 0", "n % 2 == 1"), ("n % 2", "n % 3")]),
    ("last", "items", "return items[-1]",
     [(([1, 2, 3],), 3), ((["a"],), "a")],
     [("items[-1]", "items[0]")]),
    ("count_positive", "items", "return sum(1 for x in items if x > 0)",
     [(([1, -2, 0, 3],), 2), (([],), 0)],
     [("x > 0", "x >= 0"), ("x > 0", "x < 0")]),
    ("mean", "items", "return sum(items) / len(items)",
     [(([1, 2, 3],), 2.0), (([4],), 4.0)],
     [("sum(items) / len(items)", "sum(items) // (len(items) + 1)"),
      ("/ len(items)", "/ max(items)")]),
)  # fmt: skip
_PACKAGES = ("calc", "numkit", "tally", "mathlib", "basics")
# -B: no bytecode files. An edit within the same second that keeps a file's
# size would otherwise leave a cached .pyc that Python takes as current.
TEST_COMMAND = ["python3", "-B", "-m", "unittest", "-q"]

SYSTEM = (
    "Fix the bug in the repository so that its tests pass. Use the tools; "
    "call submit when done."
)


def _source(functions, bug=None) -> str:
  lines = []
  for name, params, body, _, _ in functions:
    if bug is not None and bug[0] == name:
      body = body.replace(bug[1], bug[2], 1)
    lines += [f"def {name}({params}):", f"  {body}", "", ""]
  return "\n".join(lines).rstrip() + "\n"


def _tests(package: str, functions) -> str:
  lines = ["import unittest", "", f"from {package} import core", "", ""]
  lines.append("class CoreTest(unittest.TestCase):")
  for name, _, _, cases, _ in functions:
    lines += ["", f"  def test_{name}(self):"]
    for args, want in cases:
      call = f"core.{name}({', '.join(map(repr, args))})"
      lines.append(f"    self.assertEqual({call}, {want!r})")
  lines += ["", "", 'if __name__ == "__main__":', "  unittest.main()", ""]
  return "\n".join(lines)


def _call(source: str, name: str, args):
  """The result of `name(*args)` in `source` (generated here), as text."""
  scope: dict[str, Any] = {}
  exec(source, scope)  # pylint: disable=exec-used  # Our own generated code.
  try:
    return repr(scope[name](*args))
  # Whatever the buggy function raises is what a user would see.
  except Exception as e:  # pylint: disable=broad-exception-caught
    return f"an error ({type(e).__name__})"


def problem(index: int) -> dict[str, Any]:
  """Task `index` (>= 0): its record (module docstring)."""
  rng = np.random.default_rng([11, index])
  package = _PACKAGES[int(rng.integers(len(_PACKAGES)))]
  chosen = rng.choice(len(_FUNCTIONS), size=3, replace=False)
  functions = [_FUNCTIONS[int(i)] for i in sorted(chosen)]
  target = functions[int(rng.integers(3))]
  old, new = target[4][int(rng.integers(len(target[4])))]
  buggy = _source(functions, (target[0], old, new))
  args, want = next(
      (a, w) for a, w in target[3] if _call(buggy, target[0], a) != repr(w)
  )
  call = f"{package}.core.{target[0]}({', '.join(map(repr, args))})"
  path = f"{package}/core.py"
  return {
      "instance_id": f"repair-{index}",
      "problem_statement": (
          f"{call} returns {_call(buggy, target[0], args)}, but it should "
          f"return {want!r}."
      ),
      "files": {
          f"{package}/__init__.py": "",
          path: buggy,
          "tests/__init__.py": "",
          "tests/test_core.py": _tests(package, functions),
      },
      "test_files": ["tests/__init__.py", "tests/test_core.py"],
      "test_command": list(TEST_COMMAND),
      "fix": {
          "path": path,
          # With the def line: another function may have the same body.
          "old": f"def {target[0]}({target[1]}):\n"
          f"  {target[2].replace(old, new, 1)}",
          "new": f"def {target[0]}({target[1]}):\n  {target[2]}",
      },
  }


def _tail(text: str, limit: int = 1500) -> str:
  return text if len(text) <= limit else "[...]\n" + text[-limit:]


class RepairEnvironment(environment.ToolEnvironment):
  """One repair episode on a scratch copy of the record's files."""

  def __init__(self, record: dict[str, Any], tool_settings: tasks.ToolSettings):
    super().__init__("repair")
    self._record = record
    self._tool_settings = tool_settings
    self._box = sandbox.Sandbox(
        record["files"], tool_settings.limits, tool_settings.isolated
    )
    self.add_tool("view_file", self.view_file, "Shows a file.")
    self.add_tool(
        "edit_file",
        self.edit_file,
        "Replaces the one occurrence of old with new in a file.",
    )
    self.add_tool("run_tests", self.run_tests, "Runs the tests.")
    self.add_tool("submit", self.submit, "Ends the episode.")

  def start(self) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": self._record["problem_statement"]},
    ]

  def _file(self, path: str) -> str:
    try:
      return self._box.read_file(path).decode("utf-8")
    except sandbox.FileRefused as e:
      raise environment.ToolError(str(e)) from None
    except UnicodeDecodeError:
      raise environment.ToolError(f"{path}: not UTF-8 text") from None

  def view_file(self, path: str) -> str:
    """The tool: a file's text (its end, when long)."""
    return _tail(self._file(path.strip()), 4000)

  def edit_file(self, path: str, old: str, new: str) -> str:
    """The tool: replaces the one occurrence of `old` with `new`."""
    path = path.strip()
    text = self._file(path)
    count = text.count(old)
    if count != 1:
      raise environment.ToolError(
          f"{path}: old text found {count} times (must be exactly once)"
      )
    try:
      self._box.write_file(path, text.replace(old, new, 1).encode())
    except sandbox.FileRefused as e:
      raise environment.ToolError(str(e)) from None
    return f"{path}: edited"

  def run_tests(self) -> str:
    """The tool: the test command's outcome and output, in the sandbox."""
    result = self._box.run(self._record["test_command"], deadline=self.deadline)
    if result.error:
      raise environment.ToolError(result.error)
    status = "passed" if result.ok else f"failed (status {result.returncode})"
    return _tail(f"tests {status}\n{result.stdout}{result.stderr}")

  def submit(self) -> str:
    """The tool: ends the episode after this turn."""
    self.finish()
    return "submitted"

  def reward(self) -> float:
    """1.0 when the original tests pass on the episode's files; 0.0 (the
    reason logged) when a test file cannot be put back."""
    for path in self._record["test_files"]:
      why = self._box.restore_file(path, self._record["files"][path].encode())
      if why:
        logging.warning("%s scored 0: %s", self._record["instance_id"], why)
        return 0.0
    result = self._box.run(
        self._record["test_command"], self._tool_settings.verifier_seconds
    )
    return float(result.ok)

  def close(self) -> None:
    self._box.close()


class RepairTask(tasks.Task):
  """Procedural repair tasks (module docstring)."""

  kind = "repair"
  uses_sandbox = True

  def __init__(self, num_eval: int, seed: int = 0):
    if num_eval < 1:
      raise ValueError(f"grpo_eval_prompts={num_eval}: must be >= 1")
    self._seed = seed
    self._eval = [problem(8 * i) for i in range(num_eval)]

  def train_records(self, step: int, count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng([self._seed, 2, step])
    out = []
    while len(out) < count:
      index = int(rng.integers(0, 2**40))
      if index % 8:
        out.append(problem(index))
    return out

  def eval_records(self) -> list[dict[str, Any]]:
    return list(self._eval)

  def make_environment(
      self, record: dict[str, Any], tools: tasks.ToolSettings
  ) -> environment.Environment:
    return RepairEnvironment(record, tools)

  def demonstration(self, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Find the bug, fix it, run the tests, submit (qwen3_xml calls)."""
    fix = record["fix"]

    def call(name, **arguments):
      return {
          "role": "assistant",
          "content": tool_calls.format_xml(
              tool_calls.ToolCall(name, arguments)
          ),
      }

    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": record["problem_statement"]},
        call("view_file", path=fix["path"]),
        {"role": "tool", "content": record["files"][fix["path"]]},
        call("edit_file", path=fix["path"], old=fix["old"], new=fix["new"]),
        {"role": "tool", "content": f"{fix['path']}: edited"},
        call("run_tests"),
        {"role": "tool", "content": "tests passed"},
        call("submit"),
    ]


def make_task(num_eval: int, seed: int = 0) -> RepairTask:
  """`config.grpo_task = "maxtext.env.repair_task:make_task"`."""
  return RepairTask(num_eval, seed)
