"""Keeps functions short: none over 80 lines, at most 30 over 60.

A function's length is its lines from the `def` line to its last line,
docstring, comments and blank lines inside it included, decorators not. A
nested function (or a method of a class inside a function) is counted on its
own and also as part of the function around it. The checked sources are the
Python files under maxtext/ and tools/, except config files (maxtext/configs/)
and tests (`*_test.py`).

Functions longer than the limits before this check existed are listed in
tools/long_functions.txt, one a line, `PATH QUALNAME BAND`, where BAND is
`>80` (may exceed 80 lines) or `>60` (may exceed 60). The list only shrinks:

  - a function over 80 lines must be listed `>80`;
  - a listed function must exist and still exceed its band's lower limit (a
    `>80` one that is now 61-80 lines is listed `>60`; a shorter one leaves
    the list);
  - the number of functions over 60 lines may be at most 30, or the length
    of the list while that is longer (every listed function being over 60,
    a new one over 60 fails until the list is down to 30).

Once the list is empty, the thresholds alone hold.

    python3 tools/function_length.py            # from the repository root
"""

import ast
import dataclasses
import os
import sys

MAX_LINES = 80
SOFT_LINES = 60
MAX_OVER_SOFT = 30

ROOTS = ("maxtext", "tools")
EXCLUDED_DIRS = ("maxtext/configs",)
ALLOWANCES = "tools/long_functions.txt"
BANDS = {">80": MAX_LINES, ">60": SOFT_LINES}


@dataclasses.dataclass(frozen=True)
class Function:
  """One function definition: where it is, its dotted name, its length."""

  path: str
  line: int
  qualname: str
  lines: int


def functions_in(path: str, source: str) -> list[Function]:
  """Every function and method defined in `source`, nested ones included.

  Args:
    path: the file's path, kept in each result.
    source: the file's text.

  Returns:
    One Function a definition, in source order; a nested function's qualname
    is its parents' names and its own, joined by dots (`Outer.method.inner`).
  """
  found = []

  def visit(node: ast.AST, prefix: str) -> None:
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = prefix + child.name
        found.append(
            Function(
                path, child.lineno, name, child.end_lineno - child.lineno + 1
            )
        )
        visit(child, name + ".")
      elif isinstance(child, ast.ClassDef):
        visit(child, prefix + child.name + ".")
      else:
        visit(child, prefix)

  visit(ast.parse(source, filename=path), "")
  return sorted(found, key=lambda f: f.line)


def checked_files(root: str) -> list[str]:
  """The repository-relative paths of the Python files this check covers."""
  paths = []
  for top in ROOTS:
    for directory, subdirs, names in os.walk(os.path.join(root, top)):
      subdirs.sort()
      relative_dir = os.path.relpath(directory, root)
      if any(
          relative_dir == excluded or relative_dir.startswith(excluded + "/")
          for excluded in EXCLUDED_DIRS
      ):
        subdirs.clear()
        continue
      for name in sorted(names):
        if name.endswith(".py") and not name.endswith("_test.py"):
          paths.append(os.path.join(relative_dir, name))
  return paths


def parse_allowances(text: str, source_name: str) -> dict[tuple[str, str], str]:
  """Reads the list of functions allowed over the limits.

  Args:
    text: the list: `PATH QUALNAME BAND` lines; `#` starts a comment.
    source_name: the list's path, for messages.

  Returns:
    {(path, qualname): band}.

  Raises:
    ValueError: naming the line that is not `PATH QUALNAME BAND` with a band
      of `>80` or `>60`, or that repeats a function.
  """
  allowances = {}
  for number, line in enumerate(text.splitlines(), start=1):
    fields = line.split("#", 1)[0].split()
    if not fields:
      continue
    if len(fields) != 3 or fields[2] not in BANDS:
      raise ValueError(
          f"{source_name}:{number}: expected 'PATH QUALNAME >80|>60', got "
          f"{line!r}"
      )
    key = (fields[0], fields[1])
    if key in allowances:
      raise ValueError(
          f"{source_name}:{number}: {fields[0]} {fields[1]} is listed twice"
      )
    allowances[key] = fields[2]
  return allowances


def findings(
    functions: list[Function], allowances: dict[tuple[str, str], str]
) -> list[str]:
  """What breaks the limits, given the allowed exceptions.

  Args:
    functions: every checked function.
    allowances: {(path, qualname): band} from the list.

  Returns:
    One message a problem, empty when there is none.
  """
  problems = []
  longest = {}  # A qualname defined twice in a file is judged by its longest.
  for function in functions:
    key = (function.path, function.qualname)
    if key not in longest or function.lines > longest[key].lines:
      longest[key] = function
  for key, function in longest.items():
    band = allowances.get(key)
    if function.lines > MAX_LINES and band != ">80":
      problems.append(
          f"{function.path}:{function.line}: {function.qualname} is "
          f"{function.lines} lines (at most {MAX_LINES}); split it into "
          "named steps"
      )
  for (path, qualname), band in sorted(allowances.items()):
    function = longest.get((path, qualname))
    if function is None:
      problems.append(
          f"{ALLOWANCES}: {path} {qualname} is gone; remove it from the list"
      )
    elif function.lines <= BANDS[band]:
      better = ">60" if band == ">80" and function.lines > SOFT_LINES else None
      action = f"list it as {better}" if better else "remove it from the list"
      problems.append(
          f"{function.path}:{function.line}: {qualname} is now "
          f"{function.lines} lines, within its allowance {band}; {action}"
      )
  over_soft = [f for f in longest.values() if f.lines > SOFT_LINES]
  limit = max(MAX_OVER_SOFT, len(allowances))
  if len(over_soft) > limit:
    unlisted = [f for f in over_soft if (f.path, f.qualname) not in allowances]
    names = ", ".join(
        f"{f.path}:{f.line}: {f.qualname} ({f.lines})" for f in unlisted
    )
    problems.append(
        f"{len(over_soft)} functions are over {SOFT_LINES} lines, at most "
        f"{limit} allowed ({MAX_OVER_SOFT}, or the {ALLOWANCES} entries while "
        f"there are more); not listed: {names}"
    )
  return problems


def check(root: str) -> list[str]:
  """Checks the repository at `root`; returns the findings."""
  functions = []
  for path in checked_files(root):
    with open(os.path.join(root, path), encoding="utf-8") as f:
      functions.extend(functions_in(path, f.read()))
  allowances_path = os.path.join(root, ALLOWANCES)
  with open(allowances_path, encoding="utf-8") as f:
    allowances = parse_allowances(f.read(), ALLOWANCES)
  return findings(functions, allowances)


def main() -> int:
  if len(sys.argv) > 1:
    print(
        f"usage: {sys.argv[0]} (no arguments; run it from the "
        "repository root)",
        file=sys.stderr,
    )
    return 2
  try:
    problems = check(os.getcwd())
  except ValueError as e:
    print(f"function_length: error: {e}", file=sys.stderr)
    return 2
  for problem in problems:
    print(problem)
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
